"""The simulated fork's build: what `make modules` / `make modules_install` do in the simulated
open-gpu-kernel-modules tree. Writes modules as small text files the stand-in modinfo reads."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")


def kernel_of(syssrc: str) -> str:
    # .../lib/modules/<kver>/build
    return Path(syssrc).parent.name


def srcversion(src: Path, kver: str) -> str:
    h = hashlib.sha256()
    for f in sorted((src / "kernel-open").glob("*.c")):
        h.update(f.read_bytes())
    h.update(kver.encode())
    return h.hexdigest()[:24].upper()


def main(argv: list[str]) -> int:
    target, src = argv[0], Path.cwd()
    opts = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    syssrc = opts.get("SYSSRC", "")
    kver = kernel_of(syssrc)
    meta = dict(line.split("=", 1) for line in (src / "VERSION").read_text().split())
    with (src / ".sim-make.log").open("a") as log:  # what was asked of the fork's Makefile, for the tests
        log.write(f"{target} {kver}\n")
    if target in ("clean", "kernel-open.clean"):  # the fork's clean also cleans src/ (the OS-agnostic cores)
        for ko in (src / "kernel-open").glob("*.ko"):
            ko.unlink()
        return 0
    if target == "modules":
        if not (Path(syssrc) / "Makefile").is_file():
            print(f"*** Unable to determine the target kernel version: kernel headers for {kver} not found "
                  f"at {syssrc}", file=sys.stderr)
            return 2
        if not (Path(syssrc) / "include/linux").is_dir():
            # the fork's conftest looks for the kernel's headers under SYSSRC/include (its conftest.sh; SYSSRC is
            # the output tree too unless SYSOUT says otherwise): none found, its compile tests fail and so
            # does the build (tests/fixtures/fork-570.86.16-p2p: fail-syssrc-build.stderr)
            conftest = src / "kernel-open/conftest/functions.h"
            print(f"{conftest}:76:2: error: #error dma_buf_export() conftest failed! (SIMULATED: no kernel "
                  f"headers under {syssrc}/include)\n"
                  f"make[3]: *** [{syssrc}/scripts/Makefile.build:255: {src / 'kernel-open/nvidia/nv.o'}] Error 1\n"
                  f"make[2]: *** [{syssrc}/Makefile:2065: {src / 'kernel-open'}] Error 2\n"
                  f"make[1]: *** [Makefile:115: modules] Error 2", file=sys.stderr)
            return 2
        major, minor = (int(x) for x in kver.split(".")[:2])
        if (major, minor) > (int(meta["MAX_KERNEL_MAJOR"]), int(meta["MAX_KERNEL_MINOR"])):
            # as the real build fails on a kernel whose API moved (tests/fixtures/fork-570.86.16-p2p:
            # fail-6.1.0-57.stderr): the compiler's error first, each make level's exit line after it
            nv_pci = src / "kernel-open/nvidia/nv-pci.c"
            print(f"{nv_pci}: In function \u2018nv_resize_pcie_bars\u2019:\n"
                  f"{nv_pci}:240:9: error: too few arguments to function \u2018pci_resize_resource\u2019 "
                  f"(SIMULATED: kernel {kver} is newer than this branch supports)\n"
                  f"make[4]: *** [{syssrc}/scripts/Makefile.build:255: {nv_pci.with_suffix('.o')}] Error 1\n"
                  f"make[4]: *** Waiting for unfinished jobs....\n"
                  f"make[3]: *** [{syssrc}/Makefile:2065: {src / 'kernel-open'}] Error 2\n"
                  f"make[2]: *** [Makefile:250: __sub-make] Error 2\n"
                  f"make[1]: *** [Makefile:115: modules] Error 2", file=sys.stderr)
            return 2
        sv = srcversion(src, kver)
        for name in MODULES:
            body = (f"P2PKIT-SIM-KO\nname={name}\nversion={meta['VERSION']}\nsrcversion={sv}\n"
                    f"patched={meta['PATCHED']}\nvermagic={kver}\nsigned=0\nbuilder=root@sim-dual5090\n")
            (src / "kernel-open" / f"{name}.ko").write_text(body)
        print(f"  LD [M]  kernel-open/nvidia.ko (SIMULATED build for {kver})")
        return 0
    if target == "modules_install":
        dest = Path(opts.get("INSTALL_MOD_PATH", "/")) / "lib/modules" / kver / opts.get(
            "INSTALL_MOD_DIR", "kernel/drivers/video")
        dest.mkdir(parents=True, exist_ok=True)
        for name in MODULES:
            built = src / "kernel-open" / f"{name}.ko"
            if not built.is_file():
                print(f"*** {built} not built: run make modules first", file=sys.stderr)
                return 2
            shutil.copyfile(built, dest / f"{name}.ko")
        print(f"  INSTALL {dest}/nvidia.ko (SIMULATED)")
        return 0
    print(f"make: *** No rule to make target '{target}'.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
