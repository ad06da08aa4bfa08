"""A repository in the shape of aikitoria/open-gpu-kernel-modules whose modules are real: tiny kernel
modules built by the real kbuild against the root's real headers, for the container host (CI cannot
reach GitHub, so it cannot build the fork itself).

The interface is the fork's as p2pkit's role drives it (playbooks/roles/p2pkit_p2p_module/tasks/build.yml):
`make modules -jN SYSSRC=DIR`, `make modules_install SYSSRC=DIR INSTALL_MOD_PATH=/ INSTALL_MOD_DIR=...
DEPMOD=...`, `make clean`; the modules are built in kernel-open/ (nvidia.ko, nvidia-uvm.ko,
nvidia-modeset.ko, nvidia-drm.ko, nvidia-peermem.ko). Each module carries MODULE_VERSION of the driver
and a dual MIT/GPL licence, as the open modules do, so the real modinfo shows version, srcversion,
vermagic and, once sign-file ran, signer and sig_key. What the P2P patch changes is code; the simulated
driver (p2pkit.sim.guest) enables GeForce P2P when the loaded nvidia.ko carries the mark below, which
only the -p2p branch's nvidia.c has.
"""

from __future__ import annotations

from pathlib import Path

from p2pkit.sim.provision import _git

MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
P2P_MARK = "P2PKIT-SIM-P2P-BAR1"  # p2pkit.sim.guest.P2P_MARK

MAKEFILE = """\
# SIMULATED open-gpu-kernel-modules ({branch}): the fork's interface, real kbuild, tiny modules
SYSSRC ?= /lib/modules/$(shell uname -r)/build
SYSOUT ?= $(SYSSRC)
INSTALL_MOD_DIR ?= kernel/drivers/video
KBUILD_PARAMS := -C $(SYSOUT) M=$(CURDIR)/kernel-open

modules:
\t$(MAKE) $(KBUILD_PARAMS) modules

modules_install:
\t$(MAKE) $(KBUILD_PARAMS) INSTALL_MOD_DIR=$(INSTALL_MOD_DIR) modules_install

clean:
\t$(MAKE) $(KBUILD_PARAMS) clean

.PHONY: modules modules_install clean
"""

SOURCE = """\
// SPDX-License-Identifier: GPL-2.0 OR MIT
/* SIMULATED {name} ({branch}): a real module with the open driver's fields and no driver in it */
#include <linux/module.h>
#include <linux/init.h>
{mark}
static int __init sim_init(void) {{ return 0; }}
static void __exit sim_exit(void) {{ }}
module_init(sim_init);
module_exit(sim_exit);
MODULE_LICENSE("Dual MIT/GPL");
MODULE_VERSION("{version}");
MODULE_DESCRIPTION("SIMULATED {name} (p2pkit container host)");
"""


def make(root: Path, version: str, patched: bool = True) -> tuple[Path, str]:
    """Lay the repository out under <root>/.p2pkit-sim/git (a work tree and a bare clone, as the simulated
    host's fork): the branch <version>-p2p (or <version>, NVIDIA's own tree). Returns (bare, commit)."""
    work = root / ".p2pkit-sim/git/work"
    bare = root / ".p2pkit-sim/git/open-gpu-kernel-modules.git"
    (work / "kernel-open").mkdir(parents=True, exist_ok=True)
    branch = f"{version}-p2p" if patched else version
    (work / "Makefile").write_text(MAKEFILE.format(branch=branch))
    (work / "version.mk").write_text(f"NVIDIA_VERSION = {version}\n")
    (work / "kernel-open/Kbuild").write_text("obj-m := " + " ".join(f"{m}.o" for m in MODULES) + "\n")
    for m in MODULES:
        mark = (f'static const char p2p_mark[] __used = "{P2P_MARK}";\n' if patched and m == "nvidia" else "")
        (work / "kernel-open" / f"{m}.c").write_text(SOURCE.format(name=m, branch=branch, version=version, mark=mark))
    (work / ".gitignore").write_text("*.o\n*.ko\n*.mod\n*.mod.c\n*.cmd\n.*.cmd\nModule.symvers\nmodules.order\n"
                                     ".p2pkit-built-*\n")
    _git(work, "init", "-q", "-b", branch)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"SIMULATED {branch}" + (": P2P over BAR1" if patched else ""))
    commit = _git(work, "rev-parse", "HEAD")
    _git(root / ".p2pkit-sim/git", "clone", "-q", "--bare", str(work), str(bare))
    return bare, commit
