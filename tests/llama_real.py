"""The real llama.cpp for the tests: built once per machine and reused, by p2pkit's own engine
recipe, from the source archive the dual-5090-llamacpp profile pins (llama-cpp-python 0.3.36's
sdist on PyPI, vendor/llama.cpp), CUDA off, only the targets the profile names.

The cache lives outside the repository (~/.cache/p2pkit-tests, or $P2PKIT_TEST_CACHE) and is
keyed by the archive's sha256, so a second test run finds it. conftest starts the build in the
background when the session starts (on the xdist controller), so the rest of the suite runs
beside it; a test that needs the binary waits for it (`wait()`).

Run as a script it is that background build: `python tests/llama_real.py`."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("P2PKIT_TEST_CACHE", Path.home() / ".cache/p2pkit-tests"))
PROFILE = "dual-5090-llamacpp"
WAIT_S = float(os.environ.get("P2PKIT_LLAMA_WAIT_S", "2400"))


def pinned() -> tuple[str, str]:
    from p2pkit.core import config

    e = config.load(PROFILE).engine
    return e.source_url, e.source_sha256


def build_dir() -> Path:
    return CACHE / f"llama.cpp-{pinned()[1][:16]}"


def archive() -> Path:
    from p2pkit.stages.engine.llamacpp import archive_name

    return CACHE / "dl" / archive_name(pinned()[0])


def done_file() -> Path:
    return CACHE / f"llama.cpp-{pinned()[1][:16]}.built.json"


def overrides(build: Path | None = None) -> list[str]:
    """The profile as the tests build it: the cached archive, the cached build dir, CUDA off."""
    return ["engine.cuda=false", f"engine.build_dir={build or build_dir()}", f"engine.source_url={archive()}"]


def ensure_archive() -> Path:
    """The pinned archive in the cache: downloaded once by p2pkit's own fetch (sha256 verified)."""
    from dataclasses import replace

    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import llamacpp

    p = config.load(PROFILE)
    p = replace(p, driver=replace(p.driver, cache_dir=str(archive().parent)))
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=Store(CACHE / "state"), out=Output())
    (CACHE / "state").mkdir(parents=True, exist_ok=True)
    got = llamacpp.fetch(ctx, CACHE / "state/fetch.log")
    if "error" in got:
        raise RuntimeError(got["error"])
    return archive()


def build() -> dict:
    """p2pkit's engine recipe over the cache (unpack once, configure, build the targets)."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import cmake as engine

    ensure_archive()
    p = config.load(PROFILE, overrides())
    store = Store(CACHE / "state")
    store.ensure()
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=store, out=Output())
    t0 = time.monotonic()
    res = engine.build(ctx)
    return {"sha256": p.engine.source_sha256, "targets": p.engine.targets, "seconds": round(time.monotonic() - t0, 1),
            "ok": res.get("build_rc") == 0, "log": res.get("log"), "first_error": res.get("first_error"),
            "source": res.get("source")}


def _lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    fh = open(CACHE / "llama-build.lock", "w")  # noqa: SIM115 - held for the life of the build
    return fh


def built() -> dict | None:
    try:
        rec = json.loads(done_file().read_text())
    except (OSError, ValueError):
        return None
    from p2pkit.core import config

    # the pinned source, and every target the profile names built (a target added later, llama-batched-bench,
    # is built into the same tree by its own `cmake --build --target`: the record need not name it)
    targets = config.load(PROFILE).engine.targets
    have = all((build_dir() / "build/bin" / t).is_file() for t in targets)
    return rec if have and rec.get("sha256") == pinned()[1] and rec.get("ok") else None


def start_background() -> None:
    """Start the build in its own process unless it is built or being built (the lock says so)."""
    if built():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    log = open(CACHE / "llama-build.out", "ab")  # noqa: SIM115 - the child's output
    subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.DEVNULL, stdout=log,
                     stderr=subprocess.STDOUT, start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent))


def wait(timeout: float = WAIT_S) -> dict:
    """The finished build's record; starts the build here when no one runs it; fails with its first error."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        rec = built()
        if rec:
            return rec
        fh = _lock()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            time.sleep(2)  # the background build holds it
            continue
        try:
            rec = built() or _build_locked()
        finally:
            fh.close()
        if not rec.get("ok"):
            raise RuntimeError(f"the real llama.cpp build failed: {rec.get('first_error')} (log {rec.get('log')})")
        return rec
    raise TimeoutError(f"the real llama.cpp build did not finish within {timeout:.0f} s (see {CACHE})")


def _build_locked() -> dict:
    rec = build()
    tmp = done_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=2))
    os.replace(tmp, done_file())
    return rec


def main() -> int:
    fh = _lock()
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another run builds it
    rec = built() or _build_locked()
    print(json.dumps(rec), flush=True)
    return 0 if rec.get("ok") else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
