"""A distro's NVIDIA kernel module met before p2pkit (Debian's nvidia-open-kernel-dkms, Ubuntu's nvidia-dkms-N
that `ubuntu-drivers` installs): P34's cousin. Two nvidia modules on one box, DKMS building the distro's again at
every kernel upgrade, modprobe.d sending `modprobe nvidia` to it, the initramfs holding it.

What p2pkit does with it, and why: the package stays installed; its DKMS module is taken out of DKMS
(`dkms remove NAME/VERSION --all`: its modules leave every kernel and DKMS no longer builds it when a kernel is
installed), the modprobe.d file that routes `nvidia` to it moved aside and every initramfs rebuilt. What DKMS
kept (its tree: the source link, each kernel's built modules and make.log; the modules it installed) and the
modprobe.d file are copied into the p2p-module backup first, so `p2pkit rollback p2p-module` puts the package's
module back as it was, byte for byte, without a rebuild (a rebuild of NVIDIA's open modules is many minutes, and
needs the headers of every kernel it was built for). Removing the package instead (apt-get purge) was not chosen:
apt would take the packages that depend on it with it (the distro's userspace metapackage), and putting it back
needs the archive and that rebuild. The driver stage's hold (P02) keeps an upgrade of the package from adding the
module to DKMS again.

A package the user holds (`apt-mark hold`) is the user saying "leave this driver as it is": p2pkit refuses
before anything changes, naming it and the fix. A package whose DKMS build failed half-way is left half-configured
by dpkg: preflight refuses it (preflight.nvidia_packages) before anything changes."""

from __future__ import annotations

from p2pkit.core.errors import Exit, P2pkitError


def user_holds(mods: list[dict], held_before: list[str] | None) -> list[dict]:
    """The modules whose package is held by its user: held now, and (where the driver stage has recorded the holds
    it found, its backup's held_before) held before p2pkit's driver stage added its own holds."""
    return [m for m in mods if m.get("package") and m.get("held")
            and (held_before is None or m["package"] in held_before)]


def held_refusal(held: list[dict]) -> P2pkitError | None:
    if not held:
        return None
    pkgs = sorted({m["package"] for m in held})
    what = "; ".join(f"{m['package']} {m.get('package_version') or ''} (DKMS {m['dkms']}"
                     + (f", built for {', '.join(sorted(m['kernels']))}" if m["kernels"] else "") + ")" for m in held)
    return P2pkitError(
        f"the distro NVIDIA kernel module package {', '.join(pkgs)} is held (apt-mark hold): {what}. p2pkit would "
        "take its DKMS module out of every kernel for the P2P-patched one, and a hold says to leave it as it is: "
        "nothing was changed",
        hint=f"to let p2pkit replace it: `sudo apt-mark unhold {' '.join(pkgs)}`, then run `p2pkit up` again (p2pkit "
             "keeps the package installed, takes its module out of DKMS and keeps a copy: `p2pkit rollback "
             f"p2p-module` puts it back); to keep that driver instead, do not run p2pkit on this host",
        code=Exit.CHECK_FAILED)


def plan(mods: list[dict], routes: dict[str, list[str]]) -> str:
    """What the p2p-module stage will do with them, in one sentence."""
    said = []
    for m in mods:
        built = ", ".join(f"{k}: {s}" for k, s in sorted(m["kernels"].items())) or (m.get("state") or "added")
        said.append(f"{m.get('package') or 'no package'} {m.get('package_version') or ''} (DKMS {m['dkms']}; {built})")
    out = ("keeps " + "; ".join(said) + " installed and takes its module out of DKMS (`dkms remove --all`: DKMS no "
           "longer builds it for a new kernel), copied into p2pkit's backup first")
    if routes:
        out += f"; moves aside {', '.join(sorted(routes))} ({'; '.join(ln for v in routes.values() for ln in v)})"
    return out + "; rebuilds every initramfs; `p2pkit rollback p2p-module` puts them back"
