"""`p2pkit report FILE`: one archive (tar.gz) to hand to someone who can help, without pasting files
by hand: the artifacts and the rest of the state directory's records (<state>/profile.json with the
overrides), the last log of each stage, the facts as `facts record` gathers them (doctor's), the
profile in force, and the versions of p2pkit, the kernel, the driver, the engine and Ansible.

Every member goes through the redaction every other output uses (p2pkit.core.secrets), after the values
of the engine's secrets file are registered too: a token that reached a log is <redacted> there.
It reads, never runs anything that needs the GPUs: a fact that cannot be read is an error inside
the facts, and what the archive could not take is listed (report.json's `left_out`, and said).
The archive is written whole beside FILE and renamed (linked, without --force) into place."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from p2pkit import __version__
from p2pkit.core import logfiles, secrets, writers
from p2pkit.core.errors import ProbeError, UsageError
from p2pkit.facts import collect as facts
from p2pkit.host import Host, system
from p2pkit.host.system import identity

MEMBER_CAP = 2 << 20  # a log's head and tail, 2 MiB at most in the archive
ROTATED = re.compile(r"\.log\.\d+$")  # older runs' logs (<stage>.log.1 ...): the last run's is enough
ENGINE_BUILD = re.compile(r"^engine-build-\d+-")  # one per build (p2pkit.stages.engine.act): only the last


@dataclass
class Report:
    members: dict[str, bytes] = field(default_factory=dict)  # archive name -> content, already redacted
    left_out: list[dict[str, str]] = field(default_factory=list)  # {"what", "why"}

    def add_text(self, name: str, text: str) -> None:
        self.members[name] = secrets.redact(text).encode()

    def add_json(self, name: str, doc) -> None:
        self.members[name] = writers.json_text(secrets.redact_doc(json.loads(json.dumps(doc, default=str)))).encode()

    def leave_out(self, what: str, why: str) -> None:
        self.left_out.append({"what": what, "why": secrets.redact(why)})


def target(path: Path, force: bool) -> Path:
    """Where the archive goes, refused before any work: an existing FILE without --force, a
    directory that does not exist."""
    final = Path(path).resolve()
    if final.is_dir():
        raise UsageError(f"{path} is a directory", hint="name the archive to write, like p2pkit-report.tar.gz")
    if not final.parent.is_dir():
        raise UsageError(f"cannot write {path}: {final.parent} is not a directory",
                         hint="create the directory first, or name a file in an existing one")
    if final.exists() and not force:
        raise UsageError(f"{path} exists: p2pkit does not overwrite it",
                         hint="name another file, or add --force to replace it")
    return final


def register_engine_secrets(host: Host, rep: Report) -> None:
    """The values in the engine's secrets file (root-only) are redacted like the profile's: a token the
    engine printed into a log is <redacted> in the archive. Unreadable here (not root): said."""
    try:
        text = host.path(system.ENGINE_SECRETS_FILE).read_text()
    except FileNotFoundError:
        return
    except OSError as e:
        rep.leave_out(system.ENGINE_SECRETS_FILE, f"not readable here ({e.strerror or e}): a value only that file "
                      "holds is not redacted in the logs; run `sudo p2pkit report` so it is")
        return
    for value in writers.read_env_file(text).values():
        secrets.register(value)


def add_state(state_dir: Path, rep: Report) -> None:
    """The state directory's records (the artifacts, profile.json, reboots.json, bench's JSON) and the
    last log of each stage (<state>/logs: <stage>.log, the playbook's vars, the engine's last build
    log, the inventory runs' logs), each capped and redacted."""
    if not state_dir.is_dir():
        rep.leave_out(str(state_dir), "no state directory: no stage has run on this host")
        return
    for f in sorted(state_dir.glob("*.json")):
        _add_file(rep, f"state/{f.name}", f)
    logs = state_dir / "logs"
    if not logs.is_dir():
        rep.leave_out(str(logs), "no logs yet")
        return
    builds = sorted((f for f in logs.iterdir() if ENGINE_BUILD.match(f.name)), key=lambda f: int(f.name.split("-")[2]))
    for f in sorted(logs.iterdir()):
        if not f.is_file() or ROTATED.search(f.name) or (ENGINE_BUILD.match(f.name) and f != builds[-1]):
            continue
        _add_file(rep, f"logs/{f.name}", f)


def _add_file(rep: Report, name: str, f: Path) -> None:
    try:
        text = f.read_text(errors="replace")
    except OSError as e:
        rep.leave_out(str(f), f"not readable here ({e.strerror or e})")
        return
    rep.add_text(name, logfiles.capped(text, MEMBER_CAP))


def versions(host: Host, profile, found: dict) -> dict[str, str]:
    """p2pkit, the kernel, the loaded driver, the engine the profile pins, Ansible."""
    def driver() -> str:
        try:
            first = host.read("/proc/driver/nvidia/version", "the loaded driver").splitlines()[0]
        except (ProbeError, IndexError) as e:
            nv = found.get("nvml") if isinstance(found.get("nvml"), dict) else {}
            return nv.get("driver_version") or f"unknown (no NVIDIA driver loaded: {e})"
        return " ".join(first.split())

    try:
        ansible = metadata.version("ansible-core")
    except metadata.PackageNotFoundError:
        ansible = "not installed"
    engine = "unknown (no profile)"
    if profile is not None:
        e = profile.engine
        engine = " ".join(x for x in (e.recipe, e.commit or e.source_url, e.branch) if x)
    return {"p2pkit": __version__, "kernel": identity(host)["kernel"], "driver": driver(), "engine": engine,
            "ansible": ansible}


GIVEN_PROFILE = "profile-given.toml"  # the profile file that did not load, as given


def add_given_profile(rep: Report, path: Path) -> None:
    """The profile file that does not load, as it was given (often the very thing to report). A profile
    that does not load never registered its secrets: each quoted value of a key that names one (HF_TOKEN
    = "...") is registered here first, so it is redacted like every other."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        rep.leave_out(str(path), f"not readable here ({e.strerror or e})")
        return
    for name, value in re.findall(r"""["']?([\w.\-]+)["']?\s*=\s*["']([^"'\n]*)["']""", text):
        if secrets.is_secret(name):
            secrets.register(value)
    rep.add_text(GIVEN_PROFILE, logfiles.capped(text, MEMBER_CAP))


def gather(host: Host, state_dir: Path, profile, profile_error: str = "", given: Path | None = None) -> Report:
    """Everything the archive holds, redacted; `profile` is None when the host's profile cannot be
    loaded (profile_error says why: that is often the very thing to report, and its file, `given`,
    goes in as it is)."""
    rep = Report()
    register_engine_secrets(host, rep)
    if profile is None and given is not None:
        add_given_profile(rep, given)
    add_state(Path(state_dir), rep)
    if profile is None:
        kept = f" (its file is in the archive as {GIVEN_PROFILE})" if GIVEN_PROFILE in rep.members else ""
        rep.leave_out("the profile in force", profile_error + kept)
    else:
        rep.add_json("profile.json", facts.recorded_profile(profile))
    found = facts.record(host, profile)
    rep.add_json("facts.json", found)
    errors = {k: v["error"] for k, v in found["facts"].items() if isinstance(v, dict) and "error" in v}
    rep.add_json("report.json", {
        "kind": "p2pkit-report-archive", "schema": 1,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "root": str(host.root), "simulated": host.simulated, "state_dir": str(state_dir),
        "versions": versions(host, profile, found["facts"]),
        "facts_not_read": errors,
        "members": sorted(rep.members),
        "left_out": rep.left_out,
    })
    return rep


def write(final: Path, rep: Report, force: bool) -> None:
    """The archive, written whole into a temporary file beside `final`, then moved into place: renamed
    over it with --force, linked without (an existing file is never replaced then, even one that
    appeared since `target` looked)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            with tarfile.open(fileobj=fh, mode="w:gz") as tar:
                now = int(dt.datetime.now(dt.UTC).timestamp())
                for name, data in rep.members.items():
                    info = tarfile.TarInfo(f"p2pkit-report/{name}")
                    info.size, info.mtime, info.mode = len(data), now, 0o644
                    tar.addfile(info, io.BytesIO(data))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)  # a bug report may still say more than its owner means to share
        if force:
            os.replace(tmp, final)
        else:
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise UsageError(f"{final} exists: p2pkit does not overwrite it",
                                 hint="name another file, or add --force to replace it") from None
    except OSError as e:
        raise UsageError(f"cannot write {final}: {e.strerror or e}",
                         hint=f"check that {final.parent} is writable and its disk is not full") from e
    finally:
        Path(tmp).unlink(missing_ok=True)
