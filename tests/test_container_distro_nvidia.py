"""A distro's NVIDIA kernel module met on the container host (issue 49 item 9): Debian's own
nvidia-open-kernel-dkms installed with apt before p2pkit, its DKMS build run by its postinst against the real
headers (the layers "distro-nvidia" and "distro-nvidia-built" over the image: p2pkit/sim/container.py LAYERS,
cached beside it). Every assertion reads the real tool: dpkg-query, dkms status, modinfo -k, modprobe -S's
resolution, lsinitramfs.

The archive's 535.261.03-1 does not build on the image's 6.1.0-56 (tests/fixtures/distro-nvidia-dkms): that
half-configured package is the first test's host, as met. The second's has that one line fixed (SIMULATED: the
upload the archive lacks) and the real DKMS build done."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from p2pkit.sim import container
from tests.test_container_host import bring_up, doctor_checks, status

WHY = container.cannot_boot()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=f"this machine cannot boot a container host: {WHY}")]

PKG, DKMS = "nvidia-open-kernel-dkms", "nvidia-current-open/535.261.03"
# the modalias the kernel hands modprobe for an NVIDIA GPU (vendor 10de, class 0300): what udev's coldplug loads
MODALIAS = "pci:v000010DEd00002B85sv000010DEsd00000000bc03sc00i00"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return container.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def distro_host(tmp_path, wheel):
    """distro_host(layer): a container host made from the image with the layer (and those below it), booted;
    stopped and unmounted afterwards."""
    made = []

    def make(layer: str) -> container.ContainerHost:
        if not container.cached_layer(layer) and os.environ.get("P2PKIT_CT_LAYERS") != "1":
            pytest.skip(f"the container host's {layer} layer is not made: Debian's NVIDIA package and its real DKMS "
                        "builds take 26 min of two cores cold (make them once with `python -m p2pkit.sim.container "
                        "layers`, or run with P2PKIT_CT_LAYERS=1)")
        h = container.ContainerHost.create(tmp_path / f"ct-{len(made)}", container.image(), wheel=wheel,
                                           layers=tuple(container.layer_stack(layer)))
        made.append(h)
        h.boot()
        return h
    yield make
    for h in made:
        h.stop()
        assert not Path(h.root).is_mount(), f"{h.root} is still mounted"


def dpkg(h) -> str:
    return h.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}", PKG]).stdout


def dkms_status(h) -> str:
    return h.run(["dkms", "status"]).stdout.strip()


def idle(h, timeout: float = 900) -> None:
    """Until no restore runs (apt's hook starts p2pkit-restore.service after a package is installed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = h.run(["systemctl", "show", "-p", "ActiveState", "--value", "p2pkit-restore.service"]).stdout.strip()
        if state in ("inactive", "failed"):
            return
        time.sleep(1)
    raise AssertionError(f"p2pkit-restore.service still {state} after {timeout:g} s")


def test_a_distro_module_whose_dkms_build_failed_half_way_is_refused_before_anything_changes(distro_host):
    """The real failure: nvidia-open-kernel-dkms's DKMS build stops at nv-pci.c (pci_resize_resource() gained an
    argument in a 6.1 stable backport), dpkg leaves the package half-configured and DKMS holds it "added".
    `up` stops in preflight naming the package, its state, DKMS's build log and the fix, with nothing changed;
    the user removes the package as told, and `up` goes on past preflight."""
    h = distro_host("distro-nvidia")
    before_dpkg, before_dkms = dpkg(h), dkms_status(h)
    if not before_dpkg.startswith("iF"):
        pytest.skip(f"{PKG} built on this image after all ({before_dpkg}): the archive changed since the fixture")
    assert before_dkms == f"{DKMS}: added", before_dkms
    r = h.p2pkit("--yes", "up", "--to", "p2p-module", timeout=1200)
    assert r.returncode == 1, r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert "error: preflight failed: preflight.distro_module" in said and "half-configured" in said, said[-3000:]
    assert f"apt-get purge {PKG}" in said and f"/var/lib/dkms/{DKMS}/build/make.log" in said, said[-3000:]
    # nothing changed: the package and DKMS as they were, no stage acted (no backup, no userspace driver)
    assert dpkg(h) == before_dpkg and dkms_status(h) == before_dkms
    assert h.run(["test", "-e", "/var/lib/p2pkit/backup"], check=False).returncode == 1
    assert h.run(["test", "-e", "/usr/bin/nvidia-smi"], check=False).returncode == 1
    assert status(h)["driver"] == "not run"
    # the fix as said: the package purged (its prerm takes it out of DKMS), then up goes on past preflight (the
    # rest of the way is the whole path's test: test_container_host.py)
    h.run(["apt-get", "-q", "purge", "-y", PKG], env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=600)
    assert dkms_status(h) == "" and h.run(["dpkg-query", "-W", PKG], check=False).returncode != 0
    r = h.p2pkit("--yes", "up", "--to", "driver", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    st = status(h)
    assert st["preflight"] == "done" and st["driver"] == "done", st


def test_a_distro_module_built_by_dkms_gives_way_to_the_fork_and_rollback_puts_it_back(distro_host):
    """Debian's module installed and built by DKMS, in the initramfs (the user's early KMS), what the GPU's
    modalias loads. A hold of the package by its user: refused before anything changes, naming it and the fix.
    Unheld: preflight says what will be done; after `up`, DKMS no longer knows the module (and builds nothing at a
    kernel upgrade), modprobe and modinfo resolve to the fork's module, no initramfs holds the distro's, the
    package is still installed; rollback puts its module back byte for byte, in DKMS and in the initramfs."""
    h = distro_host("distro-nvidia-built")
    kernel = h.run(["uname", "-r"]).stdout.strip()
    ko = f"/lib/modules/{kernel}/updates/dkms/nvidia-current-open.ko"
    initrd = f"/boot/initrd.img-{kernel}"
    assert dpkg(h) == "ii |535.261.03-1", dpkg(h)
    assert dkms_status(h) == f"{DKMS}, {kernel}, x86_64: installed", dkms_status(h)
    assert h.run(["modinfo", "-k", kernel, "-n", "nvidia-current-open"]).stdout.strip() == ko
    assert "nvidia_current_open" in h.run(["modprobe", "-S", kernel, "-R", MODALIAS]).stdout.split()
    assert "nvidia-current-open.ko" in h.run(["lsinitramfs", initrd]).stdout
    sha = h.run(["sha256sum", ko]).stdout.split()[0]

    # held by its user: refused before anything changes
    h.run(["apt-mark", "hold", PKG])
    r = h.p2pkit("--yes", "up", "--to", "p2p-module", timeout=1200)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"the distro NVIDIA kernel module package {PKG} is held" in r.stderr, r.stderr[-3000:]
    assert f"apt-mark unhold {PKG}" in r.stderr and "nothing was changed" in r.stderr
    assert dkms_status(h) == f"{DKMS}, {kernel}, x86_64: installed"
    assert h.run(["test", "-e", "/usr/bin/nvidia-smi"], check=False).returncode == 1
    h.run(["apt-mark", "unhold", PKG])

    # preflight says what the p2p-module stage will do
    [said] = doctor_checks(h, "preflight.distro_module")
    assert said["status"] == "warn" and PKG in said["measured"] and "dkms remove --all" in said["hint"], said

    bring_up(h)
    assert set(status(h).values()) == {"done"}
    assert dkms_status(h) == ""
    assert re.match(r"^[ih]i \|535\.261\.03-1$", dpkg(h)), dpkg(h)  # kept installed (held by the driver stage)
    assert h.run(["modinfo", "-k", kernel, "-n", "nvidia"]).stdout.strip() == \
        f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    assert h.run(["modinfo", "-k", kernel, "nvidia-current-open"], check=False).returncode != 0
    assert "nvidia_current_open" not in h.run(["modprobe", "-S", kernel, "-R", MODALIAS], check=False).stdout
    assert "nvidia-current-open" not in h.run(["lsinitramfs", initrd]).stdout
    assert "615.71.09" in h.run(["cat", "/proc/driver/nvidia/version"]).stdout

    # a kernel upgrade: DKMS's own kernel hook builds nothing of the distro's for it
    new = h.manifest()["upgrade_kernel"]
    apt = h.upgrade_kernel()
    assert "nvidia-current-open" not in apt.stdout + apt.stderr, (apt.stdout + apt.stderr)[-3000:]
    assert dkms_status(h) == ""
    assert h.run(["test", "-e", f"/lib/modules/{new}/updates/dkms"], check=False).returncode == 1

    # rollback: the distro's module back in DKMS, in /lib/modules (the same bytes) and in the initramfs (after the
    # restore apt's hook started has ended: one p2pkit run at a time)
    idle(h)
    r = h.p2pkit("--yes", "rollback", "p2p-module")
    assert r.returncode in (0, 4), r.stderr[-3000:]
    assert dkms_status(h) == f"{DKMS}, {kernel}, x86_64: installed", dkms_status(h)
    assert h.run(["sha256sum", ko]).stdout.split()[0] == sha
    assert h.run(["modinfo", "-k", kernel, "-n", "nvidia-current-open"]).stdout.strip() == ko
    assert "nvidia_current_open" in h.run(["modprobe", "-S", kernel, "-R", MODALIAS]).stdout.split()
    assert "nvidia-current-open.ko" in h.run(["lsinitramfs", initrd]).stdout
