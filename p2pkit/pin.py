"""`p2pkit pin`: fill a profile's three pins for a real box, from what the user has in hand.

- driver.installer_sha256: of an installer the user downloaded (or a URL they give, fetched
  here), after NVIDIA's own integrity check of the archive (`--check`, makeself's) passed;
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
import re
import shutil
import tomllib
import urllib.request
from pathlib import Path

from p2pkit import config, tomlwrite, writers
from p2pkit.backup import sha256 as sha256_file
from p2pkit.errors import Exit, P2pkitError, UsageError
from p2pkit.runner import Runner

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


def check_archive(runner: Runner, path: Path) -> str:
    """NVIDIA's own check of the .run archive (the interpreter its first line names, `--check`)."""
    with path.open("rb") as fh:
        first = fh.readline().decode(errors="replace").strip()
    interp = first[2:].split() if first.startswith("#!") else ["sh"]
    r = runner.run([*interp, str(path), "--check"], check=False, timeout=600)
    said = (r.stdout + r.stderr).strip().splitlines()
    if r.returncode != 0:
        raise P2pkitError(f"NVIDIA's own integrity check of {path} failed (exit {r.returncode}): "
                          + " | ".join(said[-3:]), code=Exit.CHECK_FAILED,
                          hint="the download is damaged or not NVIDIA's installer: download it again from "
                               "NVIDIA; nothing was pinned")
    return said[-1] if said else "passed"


def installer_pin(runner: Runner, source: str, workdir: Path) -> dict:
    path = fetch(source, workdir) if re.match(r"^(https?|file)://", source) else Path(source)
    if not path.is_file():
        raise UsageError(f"--installer {source}: no such file", hint="give the .run file you downloaded, or its URL")
    said = check_archive(runner, path)
    return {"file": str(path), "check": said, "sha256": sha256_file(path)}


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

    from p2pkit.artifacts import Store
    from p2pkit.host import Host
    from p2pkit.output import Output
    from p2pkit.pipeline import Ctx
    from p2pkit.stages import llamacpp

    e = profile.engine
    if e.recipe != "llamacpp" or not e.source_url:
        raise UsageError(f"--engine-offline packs an engine source archive; {profile.name}'s engine ({e.recipe}) "
                         "has none", hint="use a profile whose engine.source_url names an archive (dual-5090-llamacpp)")
    if not e.source_sha256:
        raise UsageError("engine.source_sha256 is empty: p2pkit packs only a pinned archive",
                         hint="pin the archive you reviewed first (engine.source_sha256)")
    if dest.exists():
        raise UsageError(f"{dest} exists: p2pkit does not overwrite it", hint="move it away or name another file")
    cache.mkdir(parents=True, exist_ok=True)
    p = replace(profile, driver=replace(profile.driver, cache_dir=str(cache)))
    ctx = Ctx(profile=p, host=Host.at("/"), store=Store(cache), out=Output())
    got = llamacpp.fetch(ctx, cache / "fetch.log")
    if "error" in got:
        raise P2pkitError(got["error"], code=Exit.CHECK_FAILED,
                          hint=f"check the network (or put the pinned archive in {cache}); nothing was written")
    try:
        packed = llamacpp.pack(Path(got["archive"]), e.source_subdir, dest)
    except (ValueError, OSError) as err:
        raise P2pkitError(f"packing {got['archive']} failed: {err}", code=Exit.CHECK_FAILED,
                          hint="check engine.source_subdir and the free space beside " + str(dest)) from err
    return {**packed, "from": e.source_url, "from_sha256": got["sha256"]}


def profile_text(profile: config.Profile, out: Path) -> str:
    """The file to change: the user's own, or (new) the whole profile as `profile show --toml` writes it."""
    if out.is_file():
        return out.read_text()
    head = [f"p2pkit profile {profile.name}, from {profile.source}, pinned by `p2pkit pin`",
            *[f"  --set {o}" for o in profile.overrides]]
    return "\n".join(tomlwrite.comment(x) for x in head) + "\n" + tomlwrite.dumps(profile.as_dict())


def apply(text: str, pins: dict[tuple[str, str], str], out: Path) -> tuple[str, str]:
    """The new text with every pin set, checked as a profile, and its unified diff from the old."""
    new = text
    for keys, value in pins.items():
        new = writers.toml_set(new, list(keys), value)
    config.from_dict(tomllib.loads(new), str(out))  # a profile that does not validate is never written
    diff = "".join(difflib.unified_diff(text.splitlines(True) if out.is_file() else [], new.splitlines(True),
                                        fromfile=str(out) if out.is_file() else "/dev/null", tofile=str(out)))
    return new, diff
