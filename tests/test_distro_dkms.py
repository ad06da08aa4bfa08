"""A distro's NVIDIA module under DKMS (p2pkit.rules.distro): the parsers over the real tools' text (Debian's
nvidia-open-kernel-dkms, tests/fixtures/distro-nvidia-dkms), the refusal of a user's hold and preflight's word.
The real package on a real dpkg and DKMS: tests/test_container_distro_nvidia.py."""

from __future__ import annotations

from pathlib import Path

from p2pkit.parse import field as pf
from p2pkit.parse import system as ps
from p2pkit.rules import distro
from p2pkit.stages.preflight.checks import _distro

FIX = Path(__file__).parent / "fixtures/distro-nvidia-dkms"
MOD = {"dkms": "nvidia-current-open/535.261.03", "name": "nvidia-current-open", "version": "535.261.03",
       "kernels": {"6.1.0-56-cloud-amd64": "installed"}, "state": None, "modules": [],
       "package": "nvidia-open-kernel-dkms", "package_version": "535.261.03-1", "package_status": "ii ", "held": False}


def test_dkms_status_in_both_formats_and_a_module_never_built():
    got = ps.dkms_status("nvidia-current-open/535.261.03, 6.1.0-56-cloud-amd64, x86_64: installed\n"
                         "nvidia-current-open/535.261.03: added\n"
                         "nvidia, 570.86.16, 6.8.0-51-generic, x86_64: installed (WARNING! Diff between built and "
                         "installed module!)\n")
    assert got[0] == {"name": "nvidia-current-open", "version": "535.261.03", "kernel": "6.1.0-56-cloud-amd64",
                      "arch": "x86_64", "state": "installed"}
    assert got[1]["kernel"] is None and got[1]["state"] == "added"
    assert got[2]["name"] == "nvidia" and got[2]["state"].startswith("installed (WARNING")


def test_debians_dkms_conf_builds_nvidia_under_its_own_name():
    mods = ps.dkms_conf_modules((FIX / "dkms.conf").read_text())
    assert mods[0] == {"built": "nvidia", "dest": "nvidia-current-open", "location": "/updates/dkms"}
    assert [m["dest"] for m in mods] == ["nvidia-current-open", "nvidia-current-open-modeset",
                                         "nvidia-current-open-drm", "nvidia-current-open-uvm",
                                         "nvidia-current-open-peermem"]


def test_a_modprobe_file_routing_nvidia_elsewhere_and_the_distros_names_in_an_initramfs():
    assert ps.modprobe_routes("# x\ninstall nvidia modprobe -i nvidia-current-open $CMDLINE_OPTS\n"
                              "options nvidia NVreg_X=1\nalias nvidia-drm x\n") == [
        "install nvidia modprobe -i nvidia-current-open $CMDLINE_OPTS"]
    listing = ("usr/lib/modules/6.1.0-56-cloud-amd64/updates/dkms/nvidia-current-open.ko\n"
               "usr/lib/modules/6.1.0-56-cloud-amd64/updates/dkms/nvidia-current-open-drm.ko\n"
               "usr/lib/modules/6.1.0-56-cloud-amd64/kernel/drivers/video/nvidia.ko\n")
    assert pf.initramfs_other_nvidia(listing) == listing.splitlines()[:2]
    assert pf.initramfs_nvidia(listing) == listing.splitlines()[2:]  # only nvidia.ko, as before


def test_a_hold_by_its_user_is_refused_naming_the_package_and_the_fix_and_p2pkits_own_is_not():
    held = {**MOD, "held": True, "package_status": "hi "}
    assert distro.user_holds([held], None) == [held]  # before the driver stage: every hold is the user's
    assert distro.user_holds([held], []) == []  # after it: not held before p2pkit, so the driver stage's
    e = distro.held_refusal(distro.user_holds([held], ["nvidia-open-kernel-dkms"]))
    assert e is not None and e.code == 1
    assert "nvidia-open-kernel-dkms" in e.message and "nothing was changed" in e.message
    assert "sudo apt-mark unhold nvidia-open-kernel-dkms" in e.hint


def test_preflight_refuses_a_half_configured_package_and_says_what_it_will_do_with_an_installed_one():
    broken = {**MOD, "kernels": {}, "state": "added", "package_status": "iF "}
    [c] = _distro({"distro_dkms": {"modules": [broken], "routes": {}}})
    assert c.status == "fail" and "half-configured (dpkg iF )" in c.measured
    assert "/var/lib/dkms/nvidia-current-open/535.261.03/build/make.log" in c.measured
    assert "sudo apt-get purge nvidia-open-kernel-dkms" in c.hint
    [c] = _distro({"distro_dkms": {"modules": [MOD], "routes": {}}})
    assert c.status == "warn" and "dkms remove --all" in c.hint and "rollback p2p-module" in c.hint
    [c] = _distro({"distro_dkms": {"modules": [], "routes": {}}})
    assert c.status == "pass"
