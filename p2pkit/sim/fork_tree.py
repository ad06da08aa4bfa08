"""A tree in the shape of the P2P fork (aikitoria/open-gpu-kernel-modules) for the container host:
a real git repository whose `make modules` / `make modules_install` drive the real kbuild against
real kernel headers, and whose modules are tiny real kernel modules, so that the real modinfo,
depmod and scripts/sign-file act on them (vermagic, srcversion, version, signer, sig_key).

The interface is the real fork's, as read at its branch 570.86.16-p2p (commit 0e943687, recorded
in tests/fixtures/fork-570.86.16-p2p/README.md, where each fact below is quoted file:line); the
Makefiles here are written for this tree, not copied from the fork:

- Makefile imitates the fork's top-level Makefile: targets all (the default, = modules), modules,
  modules_install and clean, each run in kernel-open/ by a sub-make; the variables given on the
  command line (SYSSRC, SYSOUT, INSTALL_MOD_PATH, INSTALL_MOD_DIR, DEPMOD, -j) reach kernel-open/
  and kbuild through make's own MAKEFLAGS, as in the fork. It differs where the fork first builds
  its OS-agnostic cores (src/nvidia and src/nvidia-modeset: nv-kernel.o and nv-modeset-kernel.o,
  nearly all of its build time) and links them in as kernel-open/*/nv*-kernel.o_binary: this tree
  has no such core, and `clean` has no src/ part to clean.
- version.mk imitates the fork's version.mk (NVIDIA_VERSION = <version>).
- kernel-open/Makefile imitates the fork's kernel-open/Makefile: read twice (by the user's make,
  and by kbuild through Kbuild when KERNELRELEASE is set); the kernel's source tree is SYSSRC, or
  /lib/modules/$(KERNEL_UNAME)/source, .../build/source or .../build, whichever exists first
  (KERNEL_UNAME defaults to `uname -r`); its output tree is SYSOUT when given and different,
  otherwise /lib/modules/$(KERNEL_UNAME)/build when the sources were found under source/, otherwise
  the sources; CC defaults to the compiler named in the kernel's CONFIG_CC_VERSION_TEXT when it is
  installed; ARCH from `uname -m`; the modules are the ones of nvidia, nvidia-uvm,
  nvidia-vgpu-vfio, nvidia-modeset, nvidia-drm and nvidia-peermem that have a folder, less
  NV_EXCLUDE_KERNEL_MODULES; INSTALL_MOD_DIR defaults to kernel/drivers/video; targets modules,
  module, modules_install, clean and clean_conftest, kbuild run as
  `make -C <sources> M=<kernel-open> ...`. It differs in what the fork's conftest, linker scripts and
  split-object-file.sh do (none here), and in NV_VERBOSE/SPECTRE_V2_RETPOLINE (not read).
- kernel-open/Kbuild imitates the fork's: one <module>/<module>.Kbuild included per module, the
  version string compiled in as NV_VERSION_STRING (the fork's Kbuild carries it as a literal; here
  it is written there from the version too). Of the fork's conftest (hundreds of compile and header
  tests run by conftest.sh) one header test is kept: linux/stdarg.h under the kernel's source tree
  (NV_KERNEL_SOURCES/include), and the fork's fallback to the compiler's <stdarg.h> when it is not
  found, which kbuild cannot compile: so SYSSRC pointing at a tree without the headers (Debian's
  build/ alone) fails here as it fails the fork ("stdarg.h: No such file or directory"; the fork
  first prints its "conftest failed!" errors).
- kernel-open/<module>/<module>.Kbuild: `obj-m += <module>.o` with the objects under the module's
  folder, so each .ko lands in kernel-open/ itself, as the fork's do.
- The modules declare what the fork's declare (MODULE_LICENSE, MODULE_INFO(supported, "external"),
  MODULE_VERSION(NV_VERSION_STRING); nvidia-peermem its own author, description and "Dual BSD/GPL")
  and depend on what the built fork's depend on (modinfo's depends:, through one symbol each, never
  called): nvidia on drm; nvidia-uvm on nvidia; nvidia-modeset on nvidia and video; nvidia-drm on
  nvidia-modeset, drm and drm_kms_helper; nvidia-peermem, built without MLNX_OFED, on nothing (the
  kernel's modules only where its configuration has them). The fork's nvidia.ko also imports the
  DMA_BUF namespace, has a soft dependency on ecdh_generic/ecdsa_generic and declares its PCI
  aliases, firmware files and NVreg_* parameters; these do not. Each carries a description saying it
  is SIMULATED; the fork's have none (nvidia-peermem's says what it is, and so does this one's,
  after the word SIMULATED).
- kernel-open/nvidia/nv-pci.c is where the fork's P2P patch sits (the BAR1 mapping); here it holds
  a comment saying so on the patched branch, and, for a kernel newer than `max_kernel`, a call to a
  function that kernel lacks: the real compiler's "implicit declaration" error, as a branch meets a
  kernel newer than it supports (P36). With `resize_bar1` it also makes the fork's own call to
  pci_resize_resource() with three arguments (its nv-pci.c:240), compiled, never run: the tree then
  builds where 570.86.16-p2p builds and fails where it fails, with the same compiler error (Debian's
  6.1.0-47 builds; 6.1.0-57, whose 6.1.192 gave the function a fourth argument, does not): a real
  kernel upgrade that breaks the module build.
- The top-level Makefile also has the fork's kernel-open.clean (kernel-open/ cleaned alone).
"""

from __future__ import annotations

import sys
from pathlib import Path

# the fork's modules, in the order its kernel-open/Makefile lists them (nvidia-vgpu-vfio has no
# folder on the fork's branches: it is not built)
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")

TOP_MAKEFILE = """\
# SIMULATED fork tree (p2pkit.sim.fork_tree) for branch {branch}: the interface of the fork's top-level
# Makefile (all, modules, modules_install, clean); the work is kbuild's, in kernel-open/.
# The fork first builds its OS-agnostic cores under src/; this tree has none.
include version.mk

.PHONY: all modules modules_install clean kernel-open.clean
all: modules

modules modules_install clean:
\t$(MAKE) -C kernel-open $@

kernel-open.clean:
\t$(MAKE) -C kernel-open clean
"""

VERSION_MK = "NVIDIA_VERSION = {version}\n"

KERNEL_OPEN_MAKEFILE = r"""# SIMULATED fork tree (p2pkit.sim.fork_tree): the interface of the fork's
# kernel-open/Makefile.
# Read by the user's make (KERNELRELEASE empty: find the kernel's trees, hand over to kbuild) and
# by kbuild itself (KERNELRELEASE set: the Kbuild file says what to build).
ifneq ($(KERNELRELEASE),)
include $(src)/Kbuild
else

KERNEL_UNAME ?= $(shell uname -r)
KERNEL_MODLIB := /lib/modules/$(KERNEL_UNAME)

# the kernel's source tree: SYSSRC, or the first of source/, build/source and build/ that exists
ifdef SYSSRC
KERNEL_SOURCES := $(SYSSRC)
else
KERNEL_SOURCES := $(firstword $(wildcard $(KERNEL_MODLIB)/source $(KERNEL_MODLIB)/build/source) \
                              $(KERNEL_MODLIB)/build)
endif

# its output tree: SYSOUT when it differs from the sources; without SYSOUT, build/ when the
# sources were found under source/; otherwise the sources themselves
KERNEL_OUTPUT := $(KERNEL_SOURCES)
KBUILD_PARAMS :=
ifdef SYSOUT
ifneq ($(SYSOUT),$(KERNEL_SOURCES))
KERNEL_OUTPUT := $(SYSOUT)
KBUILD_PARAMS := KBUILD_OUTPUT=$(KERNEL_OUTPUT)
endif
else ifneq ($(filter $(KERNEL_SOURCES),$(KERNEL_MODLIB)/source $(KERNEL_MODLIB)/build/source),)
KERNEL_OUTPUT := $(KERNEL_MODLIB)/build
KBUILD_PARAMS := KBUILD_OUTPUT=$(KERNEL_OUTPUT)
endif

# the compiler the kernel was built with (its .config's CONFIG_CC_VERSION_TEXT), when installed
ifeq ($(origin CC),default)
KERNEL_CC := $(firstword $(shell . $(KERNEL_OUTPUT)/.config 2>/dev/null; echo "$$CONFIG_CC_VERSION_TEXT"))
ifneq ($(KERNEL_CC),)
ifneq ($(shell command -v $(KERNEL_CC)),)
CC := $(KERNEL_CC)
else
$(warning WARNING: the kernel's compiler $(KERNEL_CC) (CONFIG_CC_VERSION_TEXT) is not installed)
endif
endif
endif
CC ?= cc
LD ?= ld

ARCH ?= $(shell uname -m | sed -e 's/aarch64/arm64/' -e 's/ppc64le/powerpc/')

NV_KERNEL_MODULES ?= $(wildcard nvidia nvidia-uvm nvidia-vgpu-vfio nvidia-modeset nvidia-drm nvidia-peermem)
NV_KERNEL_MODULES := $(filter-out $(NV_EXCLUDE_KERNEL_MODULES),$(NV_KERNEL_MODULES))
INSTALL_MOD_DIR ?= kernel/drivers/video

KBUILD_PARAMS += -C $(KERNEL_SOURCES) M=$(CURDIR) ARCH=$(ARCH)
KBUILD_PARAMS += NV_KERNEL_SOURCES=$(KERNEL_SOURCES) NV_KERNEL_OUTPUT=$(KERNEL_OUTPUT)
KBUILD_PARAMS += NV_KERNEL_MODULES="$(NV_KERNEL_MODULES)" INSTALL_MOD_DIR="$(INSTALL_MOD_DIR)"

.PHONY: modules module modules_install clean clean_conftest
modules modules_install clean:
	@$(MAKE) "CC=$(CC)" "LD=$(LD)" $(KBUILD_PARAMS) $@

module: modules

# the fork's conftest results live here; this tree has none, the target stays for callers
clean_conftest:
	$(RM) -r conftest
clean: clean_conftest

endif
"""

KBUILD = """\
# SIMULATED fork tree (p2pkit.sim.fork_tree): what kbuild builds, one <module>/<module>.Kbuild per module.
NV_VERSION_STRING := {version}
$(foreach m,$(NV_KERNEL_MODULES),$(eval include $(src)/$(m)/$(m).Kbuild))
ccflags-y += -I$(src)/common/inc -DNV_VERSION_STRING=\\"$(NV_VERSION_STRING)\\"
# the one header-presence test of the fork's conftest kept here: linux/stdarg.h, looked for under the
# kernel's source tree (NV_KERNEL_SOURCES/include, as its conftest.sh does)
ifneq ($(wildcard $(NV_KERNEL_SOURCES)/include/linux/stdarg.h),)
ccflags-y += -DNV_LINUX_STDARG_H_PRESENT
endif
"""

MODULE_KBUILD = """\
# SIMULATED fork tree: {name}.ko, built in kernel-open/ from the objects under {name}/
obj-m += {name}.o
{ident}-y := {objects}
"""

COMMON_H = r"""/* SIMULATED fork tree (p2pkit.sim.fork_tree): what every module declares, as the fork's do. */
#ifndef NV_SIM_H
#define NV_SIM_H
#include <linux/module.h>
#include <linux/init.h>
/* as the fork's common/inc/nv_stdarg.h: the kernel's stdarg where its conftest found it, the
 * compiler's otherwise (which kbuild's -nostdinc hides since Linux 5.15) */
#if defined(NV_LINUX_STDARG_H_PRESENT)
#include <linux/stdarg.h>
#else
#include <stdarg.h>
#endif

#define NV_SIM_MODULE(init, exit, what)                                                   \
    module_init(init);                                                                    \
    module_exit(exit);                                                                    \
    MODULE_DESCRIPTION("SIMULATED " what " (p2pkit fork tree: loads nothing)");
#endif
"""

# each module: its objects (under its folder) and its C sources; licence, version and the symbols it
# exports or uses as the fork's module of that name does
SOURCES: dict[str, dict[str, str]] = {
    "nvidia": {
        "nv.c": r"""/* SIMULATED nvidia.ko (p2pkit fork tree): the fork's nvidia/nv.c declares the same licence,
 * support status and version; the symbols the other modules use stand for the fork's exports. */
#include "nv-sim.h"
#if IS_ENABLED(CONFIG_DRM)
#include <drm/drm_drv.h>
/* the fork's nvidia.ko uses the kernel's drm (modinfo: depends: drm): one reference, never called */
static void *const nv_sim_uses_drm __used = drm_dev_put;
#endif

int nvidia_get_rm_ops(void *ops) { return 0; }
EXPORT_SYMBOL(nvidia_get_rm_ops);
int nvUvmInterfaceRegisterGpu(void *gpu) { return 0; }
EXPORT_SYMBOL(nvUvmInterfaceRegisterGpu);

extern int nv_pci_register_driver(void);
static int __init nvidia_init_module(void) { return nv_pci_register_driver(); }
static void __exit nvidia_exit_module(void) { }
NV_SIM_MODULE(nvidia_init_module, nvidia_exit_module, "nvidia")

MODULE_LICENSE("Dual MIT/GPL");
MODULE_INFO(supported, "external");
MODULE_VERSION(NV_VERSION_STRING);
""",
        "nv-pci.c": None,  # written by nv_pci(): the patch marker and the kernel the branch supports
        "nv-p2p.c": r"""/* SIMULATED nvidia.ko: the P2P interface the fork exports from nvidia/nv-p2p.c. */
#include <linux/module.h>

int nvidia_p2p_get_pages(void *a, void *b) { return 0; }
EXPORT_SYMBOL(nvidia_p2p_get_pages);
""",
    },
    "nvidia-uvm": {
        "uvm.c": r"""/* SIMULATED nvidia-uvm.ko (p2pkit fork tree): as the fork's nvidia-uvm/uvm.c, on nvidia. */
#include "nv-sim.h"

extern int nvUvmInterfaceRegisterGpu(void *gpu);
static int __init uvm_init_entry(void) { return nvUvmInterfaceRegisterGpu(NULL); }
static void __exit uvm_exit_entry(void) { }
NV_SIM_MODULE(uvm_init_entry, uvm_exit_entry, "nvidia-uvm")

MODULE_LICENSE("Dual MIT/GPL");
MODULE_INFO(supported, "external");
MODULE_VERSION(NV_VERSION_STRING);
""",
    },
    "nvidia-modeset": {
        "nvidia-modeset-linux.c": r"""/* SIMULATED nvidia-modeset.ko (p2pkit fork tree): as the fork's
 * nvidia-modeset/nvidia-modeset-linux.c, on nvidia; exports what nvidia-drm uses. */
#include "nv-sim.h"
#include <linux/acpi.h>
#include <acpi/video.h>

/* the fork's nvidia-modeset.ko uses the kernel's ACPI video (modinfo: depends: nvidia,video) */
static void *const nvkms_sim_uses_video __used = acpi_video_get_edid;
extern int nvidia_get_rm_ops(void *ops);
int nvKmsKapiGetFunctionsTable(void *table) { return 0; }
EXPORT_SYMBOL(nvKmsKapiGetFunctionsTable);

static int __init nvkms_init(void) { return nvidia_get_rm_ops(NULL); }
static void __exit nvkms_exit(void) { }
NV_SIM_MODULE(nvkms_init, nvkms_exit, "nvidia-modeset")

MODULE_LICENSE("Dual MIT/GPL");
MODULE_INFO(supported, "external");
MODULE_VERSION(NV_VERSION_STRING);
""",
    },
    "nvidia-drm": {
        "nvidia-drm-linux.c": r"""/* SIMULATED nvidia-drm.ko (p2pkit fork tree): as the fork's
 * nvidia-drm/nvidia-drm-linux.c, on nvidia-modeset and the kernel's drm and drm_kms_helper. */
#include "nv-sim.h"
#if IS_ENABLED(CONFIG_DRM)
#include <drm/drm_drv.h>
static void *const nv_drm_sim_uses_drm __used = drm_dev_put;
#endif
#if IS_ENABLED(CONFIG_DRM_KMS_HELPER)
#include <drm/drm_probe_helper.h>
static void *const nv_drm_sim_uses_kms_helper __used = drm_kms_helper_poll_fini;
#endif

extern int nvKmsKapiGetFunctionsTable(void *table);
static int __init nv_linux_drm_init(void) { return nvKmsKapiGetFunctionsTable(NULL); }
static void __exit nv_linux_drm_exit(void) { }
NV_SIM_MODULE(nv_linux_drm_init, nv_linux_drm_exit, "nvidia-drm")

MODULE_LICENSE("Dual MIT/GPL");
MODULE_INFO(supported, "external");
MODULE_VERSION(NV_VERSION_STRING);
""",
    },
    "nvidia-peermem": {
        "nvidia-peermem.c": r"""/* SIMULATED nvidia-peermem.ko (p2pkit fork tree): as the fork's
 * nvidia-peermem/nvidia-peermem.c built without MLNX_OFED's peer-memory symbols: it then uses none of
 * nvidia's (modinfo: depends: nothing). */
#include <linux/module.h>
#include <linux/init.h>

static int __init nv_mem_client_init(void) { return 0; }
static void __exit nv_mem_client_cleanup(void) { }
module_init(nv_mem_client_init);
module_exit(nv_mem_client_cleanup);

MODULE_AUTHOR("Yishai Hadas");
MODULE_DESCRIPTION("SIMULATED NVIDIA GPU memory plug-in (p2pkit fork tree: loads nothing)");
MODULE_LICENSE("Dual BSD/GPL");
MODULE_VERSION(NV_VERSION_STRING);
""",
    },
}


# the fork's kernel-open/nvidia/nv-pci.c:240 (570.86.16): BAR1 resized with the three arguments of
# pci_resize_resource() that Debian's 6.1.192 (6.1.0-57) no longer takes (it gained `exclude_bars`)
RESIZE_BAR1 = """#include <linux/pci.h>
/* as the fork's nv_resize_pcie_bars(): never called here, compiled as the fork's is */
static int nv_resize_bar1(struct pci_dev *pci_dev, int requested_size)
{
    return pci_resize_resource(pci_dev, 1, requested_size);
}
static void *const nv_sim_resize_bar1 __used = nv_resize_bar1;
"""


P2P_MARK = "P2PKIT-SIM-P2P-BAR1"


def nv_pci(patched: bool, max_kernel: tuple[int, int], resize_bar1: bool = False) -> str:
    """nvidia/nv-pci.c: where the fork's P2P patch sits; for a kernel past the branch's newest, a call
    to a function that kernel lacks (the real compiler's implicit-declaration error); with
    `resize_bar1`, the fork's own call to pci_resize_resource() with three arguments."""
    major, minor = max_kernel
    # the patched branch's code carries a string the container host's simulated driver looks for in the
    # loaded nvidia.ko (p2pkit.sim.guest.P2P_MARK): what the patch does is code, and this stands in for it
    marker = ("/* P2P over BAR1: the fork's patch sits in this file (the static BAR1 mapping). */\n"
              f'static const char nv_p2p_bar1_mark[] __used = "{P2P_MARK}";\n' if patched
              else "/* NVIDIA's own tree: no P2P patch. */\n")
    return (f"/* SIMULATED nvidia.ko (p2pkit fork tree): nvidia/nv-pci.c. */\n{marker}"
            "#include <linux/module.h>\n#include <linux/version.h>\n\n"
            + (RESIZE_BAR1 if resize_bar1 else "")
            + f"/* this branch supports kernels up to {major}.{minor} */\n"
            f"#if LINUX_VERSION_CODE >= KERNEL_VERSION({major}, {minor + 1}, 0)\n"
            "int nv_pci_register_driver(void) { return nv_pci_rebar_get_possible_sizes(NULL, 0); }\n"
            "#else\nint nv_pci_register_driver(void) { return 0; }\n#endif\n")


def write_tree(work: Path, version: str, *, patched: bool = True, max_kernel: tuple[int, int] = (6, 17),
               resize_bar1: bool = False, modules: tuple[str, ...] = MODULES) -> None:
    """Lay out the fork-shaped tree in `work` (its files only; make_fork_tree commits it)."""
    branch = f"{version}-p2p" if patched else version
    ko = work / "kernel-open"
    (ko / "common/inc").mkdir(parents=True, exist_ok=True)
    (work / "Makefile").write_text(TOP_MAKEFILE.format(branch=branch))
    (work / "version.mk").write_text(VERSION_MK.format(version=version))
    (ko / "Makefile").write_text(KERNEL_OPEN_MAKEFILE)
    (ko / "Kbuild").write_text(KBUILD.format(version=version))
    (ko / "common/inc/nv-sim.h").write_text(COMMON_H)
    for name in modules:
        d = ko / name
        d.mkdir(exist_ok=True)
        files = SOURCES[name]
        for fname, text in files.items():
            (d / fname).write_text(nv_pci(patched, max_kernel, resize_bar1) if text is None else text)
        objects = " ".join(f"{name}/{f[:-2]}.o" for f in files)
        (d / f"{name}.Kbuild").write_text(MODULE_KBUILD.format(name=name, ident=name, objects=objects))
    # what a build leaves in the tree (the fork's .gitignore lists its objects; the rest is kbuild's)
    (work / ".gitignore").write_text("*.o\n*.o.cmd\n*.o.d\n*.ko\n*.ko.cmd\n*.mod\n*.mod.c\n*.mod.cmd\n.*.cmd\n"
                                     "modules.order\nModule.symvers\nconftest/\n.p2pkit-built-*\n")


def make_fork_tree(dest: Path, version: str, *, patched: bool = True, max_kernel: tuple[int, int] = (6, 17),
                   resize_bar1: bool = False, modules: tuple[str, ...] = MODULES) -> tuple[Path, str]:
    """A real git repository in dest: the tree committed on the branch <version>-p2p (<version> for
    NVIDIA's own tree) in dest/work, cloned bare to dest/open-gpu-kernel-modules.git; returns the bare
    repository and the commit (what a profile's p2p_module.repo and commit name)."""
    from p2pkit.sim.provision import _git

    work, bare = dest / "work", dest / "open-gpu-kernel-modules.git"
    work.mkdir(parents=True, exist_ok=True)
    branch = f"{version}-p2p" if patched else version
    write_tree(work, version, patched=patched, max_kernel=max_kernel, resize_bar1=resize_bar1, modules=modules)
    _git(work, "init", "-q", "-b", branch)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"SIMULATED fork tree {branch}" + (": P2P over BAR1" if patched else ""))
    commit = _git(work, "rev-parse", "HEAD")
    _git(dest, "clone", "-q", "--bare", str(work), str(bare))
    return bare, commit


def main(argv: list[str]) -> int:
    """python -m p2pkit.sim.fork_tree DEST VERSION [--stock]: make the repository, print it and the commit."""
    if len(argv) < 2 or argv[0].startswith("-"):
        print("usage: python -m p2pkit.sim.fork_tree DEST VERSION [--stock]", file=sys.stderr)
        return 2
    bare, commit = make_fork_tree(Path(argv[0]), argv[1], patched="--stock" not in argv[2:])
    print(f"{bare} {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
