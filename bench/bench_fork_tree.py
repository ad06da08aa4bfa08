"""The fork-shaped tree (p2pkit/sim/fork_tree.py) through the role's commands against real kernel headers,
each step timed: `make modules -j2`, `make modules_install`, sign-file on every module, depmod, and
modinfo of the signed module. The root with the headers is the tests' (tests/kbuild_root.py:
$P2PKIT_KBUILD_ROOT, or the cached mmdebstrap root, made if missing). Prints one JSON document.
The real fork's own build on the same machine is in tests/fixtures/fork-570.86.16-p2p/README.md.
Run by hand, as root: `python3 bench/bench_fork_tree.py [--jobs 2]`."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2, help="make -j (the role's p2pkit_p2p_module_jobs)")
    ap.add_argument("--version", default="570.86.16", help="the driver version the modules carry")
    a = ap.parse_args()

    from p2pkit.sim import fork_tree
    from tests import kbuild_root

    root, why = kbuild_root.root()
    if root is None:
        sys.exit(f"bench_fork_tree: {why}")
    kernel = kbuild_root.kernel(root)
    build = f"/lib/modules/{kernel}/build"
    base = Path(tempfile.mkdtemp(prefix="bench-fork-tree-", dir=root / "var/tmp"))
    inside = "/" + str(base.relative_to(root))
    times: dict[str, float] = {}

    def step(name: str, script: str) -> str:
        t0 = time.monotonic()
        r = kbuild_root.run(root, script)
        times[name] = round(time.monotonic() - t0, 2)
        return r.stdout

    try:
        t0 = time.monotonic()
        bare, commit = fork_tree.make_fork_tree(base / "repo", a.version)
        subprocess.run(["git", "clone", "-q", str(bare), str(base / "src")], check=True)
        times["make_repository"] = round(time.monotonic() - t0, 2)
        given = kbuild_root.trees(root, kernel)
        step("make_modules", f"cd {inside}/src && make modules -j{a.jobs} {given}")
        step("modules_install", f"cd {inside}/src && make modules_install {given} INSTALL_MOD_PATH={inside}/inst "
                                "INSTALL_MOD_DIR=kernel/drivers/video DEPMOD=/bin/true")
        step("openssl_key", f"openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500 -outform DER "
                            f"-keyout {inside}/MOK.priv -out {inside}/MOK.der -subj '/CN=bench/' 2>/dev/null")
        step("sign_file", f"for m in {inside}/inst/lib/modules/{kernel}/kernel/drivers/video/*.ko; do "
                          f"{build}/scripts/sign-file sha256 {inside}/MOK.priv {inside}/MOK.der $m || exit 1; done")
        step("depmod", f"depmod -b {inside}/inst {kernel}")
        info = step("modinfo", f"modinfo -b {inside}/inst -k {kernel} -F sig_key nvidia")
        print(json.dumps({"kernel": kernel, "commit": commit, "jobs": a.jobs, "seconds": times,
                          "total_s": round(sum(times.values()), 2), "sig_key": info.strip()}, indent=2))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
