"""A Debian root with real kernel headers and the real kbuild, gcc, make, kmod (modinfo, depmod), openssl
and xz, for the tests that build real kernel modules (tests/test_fork_tree.py). Commands run in it with
chroot, as root; each test's files live in a temporary directory under its /var/tmp and its modules are
installed under that directory (INSTALL_MOD_PATH, depmod -b), so the root itself is never changed.

Where the root comes from, first found:
- $P2PKIT_KBUILD_ROOT: a root made for this (or the container host's root, once it holds the packages
  below); P2PKIT_KBUILD_ROOT=none: no root, the tests that need one skip;
- the test cache (~/.cache/p2pkit-tests, or $P2PKIT_TEST_CACHE): kbuild-root-<key>, made once by
  mmdebstrap from Debian's packages (bookworm; 1 to 4 minutes and about 500 MB on the 2-core machine)
  where this machine can: root, mmdebstrap, chroot and a Debian mirror (the key is the suite, the
  architecture and the package list, so a new list makes a new root).

Run as a script it makes (or names) the cached root: `python tests/kbuild_root.py`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("P2PKIT_TEST_CACHE", Path.home() / ".cache/p2pkit-tests"))
SUITE = "bookworm"
PACKAGES = ("gcc", "make", "kmod", "openssl", "xz-utils", "git", "ca-certificates")


def arch() -> str:
    r = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True) \
        if shutil.which("dpkg") else None
    return r.stdout.strip() if r and r.returncode == 0 else {"x86_64": "amd64", "aarch64": "arm64"}.get(
        os.uname().machine, os.uname().machine)


def packages() -> list[str]:
    return [f"linux-headers-{arch()}", *PACKAGES]


def cached() -> Path:
    key = hashlib.sha256(f"{SUITE} {arch()} {' '.join(packages())}".encode()).hexdigest()[:12]
    return CACHE / f"kbuild-root-{key}"


def kernel(root: Path) -> str | None:
    """The kernel release whose headers the root holds (/lib/modules/<release>/build/Makefile, read in
    the root: Debian's build and modinfo are absolute links), the newest when it holds several."""
    r = run(root, "for m in /lib/modules/*/build/Makefile; do [ -e \"$m\" ] && echo \"$m\"; done", check=False)
    found = sorted((line.split("/")[3] for line in r.stdout.split()), key=release_key)
    return found[-1] if found else None


def split(root: Path, kernel: str) -> bool:
    """Whether the kernel's headers have their source tree apart from the build tree (Debian's layout)."""
    return run(root, f"test -e /lib/modules/{kernel}/source/Makefile", check=False).returncode == 0


def trees(root: Path, kernel: str) -> str:
    """SYSSRC and SYSOUT as the p2p-module role gives them (tasks/build.yml): the source tree apart where
    the headers have one (Debian), the build tree as both otherwise (Ubuntu)."""
    build = f"/lib/modules/{kernel}/build"
    return f"SYSSRC={f'/lib/modules/{kernel}/source' if split(root, kernel) else build} SYSOUT={build}"


def release_key(release: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"[.-]", release)]


def missing(root: Path) -> list[str]:
    """What the tests need that the root lacks."""
    if not (root / "bin/sh").exists():
        return ["/bin/sh"]
    out = [] if kernel(root) else ["kernel headers (/lib/modules/*/build)"]
    for tool in ("make", "gcc", "openssl", "xz", "modinfo", "depmod"):
        if run(root, f"command -v {tool}", check=False).returncode != 0:
            out.append(tool)
    return out


def root() -> tuple[Path | None, str]:
    """The root, or None and why there is none (the skip reason)."""
    given = os.environ.get("P2PKIT_KBUILD_ROOT", "")
    if given == "none":
        return None, "P2PKIT_KBUILD_ROOT=none: no root with kernel headers and kbuild"
    if os.geteuid() != 0 or not shutil.which("chroot"):
        return None, "building against a Debian root with real kernel headers needs root and chroot"
    if given:
        lack = missing(Path(given))
        return (Path(given), "") if not lack else (None, f"P2PKIT_KBUILD_ROOT={given} lacks {', '.join(lack)}")
    if cached().is_dir() and not missing(cached()):
        return cached(), ""
    if not shutil.which("mmdebstrap"):
        return None, ("no root with kernel headers and kbuild: set P2PKIT_KBUILD_ROOT to a Debian root holding "
                      f"{', '.join(packages())}, or install mmdebstrap so the tests make one")
    return make()


def make() -> tuple[Path | None, str]:
    """mmdebstrap the root into the cache, once (a lock: another test run may be making it)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "kbuild-root.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        if cached().is_dir() and not missing(cached()):
            return cached(), ""
        tmp = cached().with_name(cached().name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run(["mmdebstrap", "--variant=minbase", f"--include={','.join(packages())}", SUITE, str(tmp)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            return None, f"mmdebstrap could not make a root with kernel headers (exit {r.returncode}: {tail})"
        os.replace(tmp, cached())
    return cached(), ""


def run(root: Path, script: str, check: bool = True) -> subprocess.CompletedProcess:
    """A shell script run in the root (chroot), its output captured."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    r = subprocess.run(["chroot", str(root), "/bin/sh", "-c", script], capture_output=True, text=True, env=env,
                       timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"in {root}: {script}\nexit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


if __name__ == "__main__":
    path, why = root()
    print(path or why)
    sys.exit(0 if path else 1)
