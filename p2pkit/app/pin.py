"""`p2pkit pin`: fill a profile's three pins for a real box, from what the user has in hand.

- driver.installer_sha256: of an installer the user downloaded (or a URL they give, fetched
  here), after the archive's own checksums (its makeself header's) held; the archive is read,
  never run (running it would run whatever the file is, as root);
- p2p_module.commit: HEAD of a local checkout of the fork, or `git ls-remote` of the profile's
  repository at its branch;
- engine.commit: the same for the engine (the remote's HEAD);
- engine.source_url, source_sha256 and source_subdir for a box without network (--engine-offline):
  the profile's pinned engine archive, verified, packed smaller for carrying (llamacpp.pack), and the
  profile pointed at the packed file with its own sha256.

The user's profile file is changed key by key (comments and the rest kept; writers.toml_set),
the result validated as a profile, and the diff shown before anything is written.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shutil
import tomllib
import urllib.request
from pathlib import Path

from p2pkit.core import config, tomlwrite, writers
from p2pkit.core.errors import Exit, P2pkitError, UsageError
from p2pkit.core.runner import Runner
from p2pkit.host.backup import sha256 as sha256_file
from p2pkit.parse import makeself

COMMIT40 = re.compile(r"^[0-9a-f]{40}$")



def fetch(url: str, workdir: Path) -> Path:
    """The installer at a URL, downloaded whole into workdir (a partial file never counts)."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or "installer.run"
    dest = workdir / name
    part = workdir / (name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as fh:
            shutil.copyfileobj(r, fh)
    except (OSError, ValueError) as e:
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot download the installer from {url}: {e}",
                         hint="download it yourself and pass the file: `p2pkit pin --installer FILE`") from e
    part.replace(dest)
    return dest


HEADER_MAX = 1 << 20  # makeself's stub is a few hundred lines; its payload starts after them


def check_archive(path: Path) -> dict:
    """The .run archive checked the way makeself's own `--check` does, without running any of it:
    its header read as text (p2pkit.parse.makeself), the payload after the header's lines hashed
    and held against the header's MD5 (or SHA-256) sums, file by file; bytes past the payload
    the header describes are refused too. The label and driver version from the header."""
    with path.open("rb") as fh:
        head = fh.read(HEADER_MAX)
    hdr = makeself.header(head.decode("latin-1")) if head.startswith(b"#!") else {}
    if "skip" not in hdr or not hdr["sizes"] or not (hdr.get("md5s") or hdr.get("shas")):
        raise UsageError(f"{path} is not a makeself archive with checksums (no makeself header: label, MD5 or "
                         "SHA, filesizes and its line count)",  # the wrong file given: bad input, exit 2
                         hint="give NVIDIA's .run installer (NVIDIA-Linux-<arch>-<version>.run) as downloaded "
                              "from NVIDIA; nothing was pinned")
    lines = head.splitlines(keepends=True)
    offset = len(b"".join(lines[:hdr["skip"]]))
    sums = hdr.get("md5s") or hdr["shas"]
    algo = "md5" if hdr.get("md5s") else "sha256"
    bad = []
    with path.open("rb") as fh:
        fh.seek(offset)
        for i, size in enumerate(hdr["sizes"]):
            h, left = hashlib.new(algo), size
            while left > 0:
                chunk = fh.read(min(left, 1 << 20))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            if left:
                bad.append(f"payload file {i + 1} is {left} bytes short (the download is truncated)")
            elif i < len(sums) and h.hexdigest() != sums[i]:
                bad.append(f"{algo.upper()} of payload file {i + 1} is {h.hexdigest()}, the header says {sums[i]}")
        extra = len(fh.read())
    if extra:
        bad.append(f"{extra} bytes follow the payload the header describes")
    if bad:
        raise P2pkitError(f"the integrity check of {path} failed: " + "; ".join(bad), code=Exit.CHECK_FAILED,
                          hint="the download is damaged or not NVIDIA's installer: download it again from "
                               "NVIDIA; nothing was pinned (p2pkit reads the archive, it never runs it)")
    return {"check": f"{algo.upper()} checksums are OK ({len(hdr['sizes'])} payload file(s))",
            "label": hdr.get("label", ""), "version": hdr.get("version", "")}


def installer_pin(source: str, workdir: Path) -> dict:
    path = fetch(source, workdir) if re.match(r"^(https?|file)://", source) else Path(source)
    if not path.is_file():
        raise UsageError(f"--installer {source}: no such file", hint="give the .run file you downloaded, or its URL")
    return {"file": str(path), **check_archive(path), "sha256": sha256_file(path)}


def checkout_commit(runner: Runner, d: Path) -> dict:
    r = runner.run(["git", "-C", str(d), "rev-parse", "HEAD"], check=False)
    commit = r.stdout.strip()
    if r.returncode != 0 or not COMMIT40.match(commit):
        raise UsageError(f"{d} is not a git checkout ({(r.stderr or r.stdout).strip()[:200]})",
                         hint="give the directory you cloned, or use the remote (--fork-remote / --engine-remote)")
    branch = runner.run(["git", "-C", str(d), "rev-parse", "--abbrev-ref", "HEAD"], check=False).stdout.strip()
    return {"from": f"checkout {d} ({branch})", "commit": commit, "branch": branch}


def remote_commit(runner: Runner, repo: str, ref: str) -> dict:
    if not repo:
        raise UsageError("the profile names no repository to ask", hint="give a local checkout instead")
    r = runner.run(["git", "ls-remote", "--", repo, ref], check=False, timeout=120)
    if r.returncode != 0:
        raise P2pkitError(f"`git ls-remote {repo} {ref}` failed: {(r.stderr or r.stdout).strip()[:300]}",
                          hint="check the network and the repository URL, or give a local checkout")
    for line in r.stdout.splitlines():
        commit, _, name = line.partition("\t")
        if name.strip() == ref and COMMIT40.match(commit):
            return {"from": f"git ls-remote {repo} {ref}", "commit": commit}
    raise UsageError(f"{repo} has no {ref}", hint="check the profile's repository and branch")


def engine_offline(profile: config.Profile, dest: Path, cache: Path) -> dict:
    """The profile's pinned engine archive (downloaded into `cache` once, its sha256 checked against
    the pin before a byte is read), packed for a machine without network at `dest`."""
    from dataclasses import replace

    from p2pkit.app.pipeline import Ctx
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import common

    if dest.exists():
        raise UsageError(f"{dest} exists: p2pkit does not overwrite it", hint="move it away or name another path")
    p = replace(profile, driver=replace(profile.driver, cache_dir=str(cache)))
    return common.recipe(p).offline(Ctx(profile=p, host=Host.at("/"), store=Store(cache), out=Output()), dest)


def profile_text(profile: config.Profile, out: Path) -> str:
    """The file to change: the user's own, or (new) the whole profile as `profile show --toml` writes it."""
    if out.is_file():
        return out.read_text()
    head = [f"p2pkit profile {profile.name}, from {profile.source}, pinned by `p2pkit pin`",
            *[f"  --set {o}" for o in profile.overrides]]
    return "\n".join(tomlwrite.comment(x) for x in head) + "\n" + tomlwrite.dumps(profile.as_dict())


def apply(text: str, pins: dict[tuple[str, str], str], out: Path,
          notes: dict[tuple[str, str], str] | None = None) -> tuple[str, str]:
    """The new text with every pin set (each with its note, where it came from, as a comment),
    checked as a profile, and its unified diff from the old."""
    new = text
    for keys, value in pins.items():
        new = writers.toml_set(new, list(keys), value, (notes or {}).get(keys, ""))
    config.from_dict(tomllib.loads(new), str(out))  # a profile that does not validate is never written
    diff = "".join(difflib.unified_diff(text.splitlines(True) if out.is_file() else [], new.splitlines(True),
                                        fromfile=str(out) if out.is_file() else "/dev/null", tofile=str(out)))
    return new, diff


def resolve(runner: Runner, profile: config.Profile, keys: list[str], workdir: Path) -> dict[str, dict]:
    """`up --pin`: the pins preflight named, each resolved from the profile's own sources (the
    installer at driver.installer_url after its makeself checksums held, never run; the fork's branch
    and the engine's HEAD from `git ls-remote`): {key: {"value", "from"}}. A pin p2pkit cannot resolve is refused."""
    found = {}
    for key in keys:
        if key == "driver.installer_sha256":
            got = installer_pin(profile.driver.installer_url, workdir)
            found[key] = {"value": got["sha256"],
                          "from": f"sha256 of {profile.driver.installer_url} (archive check: {got['check']})"}
        elif key == "p2p_module.commit":
            got = remote_commit(runner, profile.p2p_module.repo, f"refs/heads/{profile.p2p_module.branch}")
            found[key] = {"value": got["commit"], "from": got["from"]}
        elif key == "engine.commit":
            got = remote_commit(runner, profile.engine.repo, "HEAD")
            found[key] = {"value": got["commit"], "from": got["from"]}
        else:
            raise UsageError(f"p2pkit cannot resolve {key} for you",
                             hint=f"set {key} in your profile file to the value you reviewed, then run "
                                  "`p2pkit --profile FILE up`")
    return found


def host_profile_file(profile: config.Profile, state_dir: Path) -> Path:
    """Where `up --pin` writes: the profile's own file, or for a built-in profile a copy of it in the
    host's state directory (recorded there, so every later command uses it)."""
    if profile.source in config.builtin_names():
        return Path(state_dir) / "profile.toml"
    return Path(profile.source).resolve()


def refuse_sources_elsewhere(host, prof: config.Profile, keys: list[str]) -> None:
    """`up --pin` on a host that offers its own sources (a simulated host, which never reaches NVIDIA or
    GitHub): a pin whose source is not the host's own is refused before anything is fetched (exit 2), with
    the command that takes the host's own (its downloads and repositories as --set overrides), or where the
    host has no source of that kind, the host's own profile to start from."""
    import shlex

    own = host.own_sources()
    if not own:
        return
    want = {}
    if "driver.installer_sha256" in keys and prof.driver.installer_url != own["driver.installer_url"]:
        want["driver.installer_url"] = own["driver.installer_url"]
    if "p2p_module.commit" in keys:
        for key, have in (("p2p_module.repo", prof.p2p_module.repo), ("p2p_module.branch", prof.p2p_module.branch)):
            if have != own[key]:
                want[key] = own[key]
    engine_keys = [k for k in keys if k.startswith("engine.")]
    if engine_keys and (prof.engine.recipe != own["engine.recipe"] or "engine.source_sha256" in engine_keys):
        raise UsageError(f"this simulated host has no {prof.engine.recipe} engine source to pin "
                         f"({', '.join(engine_keys)}): its engine is {own['engine.recipe']} from {own['engine.repo']}, "
                         "and it reaches no network; nothing was fetched or written",
                         hint="start your profile from this host's own, pinned to its downloads and repositories: "
                              "`p2pkit profile show --toml > mine.toml`, edit mine.toml, then "
                              "`p2pkit --profile mine.toml up`")
    if "engine.commit" in keys and prof.engine.repo != own["engine.repo"]:
        want["engine.repo"] = own["engine.repo"]
    if not want:
        return
    sets = [w for k, v in want.items() for w in ("--set", f"{k}={v}")]
    cmd = shlex.join(["p2pkit", "--profile", prof.source, *sets, "up", "--pin"])
    raise UsageError(f"{prof.source} takes its pins from {', '.join(f'{k} = {_value(prof, k)}' for k in want)}: "
                     "this simulated host reaches no network and has its own downloads and repositories "
                     f"({', '.join(f'{k} = {v}' for k, v in want.items())}); nothing was fetched or written",
                     hint=f"pin from this host's own: `{cmd}` (the --set values stay this host's, as every override "
                          "does)")


def _value(prof: config.Profile, key: str) -> str:
    section, name = key.split(".")
    return str(getattr(getattr(prof, section), name)) or "(empty)"


def pin_for_up(ctx) -> config.Profile | None:
    """`up --pin`: resolve every empty pin preflight would name, show each value and its source,
    write them into the host's profile (a comment beside each says where it came from) and record
    that file as the host's profile. Returns the pinned profile, or None when nothing was empty."""
    import datetime as dt
    import tempfile

    from p2pkit.core import hoststate
    from p2pkit.core.artifacts import atomic_write
    from p2pkit.stages.preflight.checks import missing_pins

    prof = ctx.profile
    keys = missing_pins(prof)
    if not keys:
        return None
    shadowed = [o for o in prof.overrides if o.partition("=")[0].strip() in keys]
    if shadowed:
        raise UsageError(f"--set {', '.join(shadowed)} overrides a pin `up --pin` would write",
                         hint="drop that --set (`--unset KEY`), then run `p2pkit up --pin` again")
    refuse_sources_elsewhere(ctx.host, prof, keys)  # a simulated host: its own downloads, never the network
    with tempfile.TemporaryDirectory(prefix="p2pkit-pin-") as tmp:
        found = resolve(ctx.host.runner, prof, keys, Path(tmp))
    out = host_profile_file(prof, ctx.store.dir)
    day = dt.date.today().isoformat()
    pins = {tuple(k.split(".")): v["value"] for k, v in found.items()}
    notes = {tuple(k.split(".")): f"pinned by `p2pkit up --pin` on {day}: {v['from']}" for k, v in found.items()}
    text = profile_text(prof, out)
    new, _ = apply(text, pins, out, notes)
    for k, v in found.items():
        ctx.out.log(f"pinned {k} = {v['value']} ({v['from']})")
    ctx.store.ensure()
    atomic_write(out, new.encode())
    ctx.out.log(f"wrote the pins into {out}; later commands on this host use it")
    pinned = config.load(str(out), prof.overrides)
    hoststate.record_profile(ctx.store.dir, pinned)
    return pinned
