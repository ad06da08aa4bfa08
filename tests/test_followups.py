"""No follow-up lost to a kill (issue 31, item 2): update-grub, update-initramfs and depmod are decided
by the p2p-module role's tasks from their effects (grub.cfg's default entries, the times of
modules.dep and the initramfs against the module), so a run killed after a file was written and
before its follow-up ran is repaired by the next `up`, and by `up --force`."""

import os
import subprocess
from pathlib import Path

from p2pkit.core.ansible import render
from p2pkit.host import Host, system
from p2pkit.sim.render import load_state
from p2pkit.stages.p2p_module import act as acting

FIX = Path(__file__).parent / "fixtures/grub"
KERNEL = "6.8.0-88-generic"
DROPIN = "etc/default/grub.d/60-p2pkit-iommu.cfg"
VIDEO_KO = "kernel/drivers/video/nvidia.ko"


# The test's oracle for what the next boot gets (the role decides update-grub from its own probe of
# grub.cfg, in the p2pkit_p2p_module role's tasks/followups.yml; this reads grub.cfg on its own).
def grub_default_args(cfg: str, kernel: str) -> list[list[str]]:
    """The kernel arguments of every `linux` line of /boot/grub/grub.cfg that GRUB_CMDLINE_LINUX_DEFAULT
    reaches (not a recovery entry, not linux16's memtest), for vmlinuz-<kernel> when a line names it,
    else for every kernel: what the next boot gets from the last update-grub."""
    lines = []
    for line in cfg.splitlines():
        words = line.split()
        if words[:1] != ["linux"] or len(words) < 2 or "vmlinuz" not in words[1] or "recovery" in words[2:]:
            continue
        lines.append((words[1], words[2:]))
    mine = [args for image, args in lines if image.endswith(f"vmlinuz-{kernel}")]
    return mine or [args for _image, args in lines]


def test_grub_default_args_skips_recovery_and_memtest_over_a_real_grub_cfg():
    text = (FIX / "linux-lines-6.8.0-57.txt").read_text()
    args = grub_default_args(text, "6.8.0-57-generic")
    assert len(args) == 2 and all(a[-3:] == ["quiet", "splash", "$vt_handoff"] for a in args), args
    assert len(grub_default_args(text, "6.9.9-1-generic")) == 3  # no entry names it: every default entry


def grub_carries(root: Path, option: str) -> bool:
    cfg = root / "boot/grub/grub.cfg"
    args = grub_default_args(cfg.read_text(), KERNEL) if cfg.is_file() else None
    return bool(args) and all(option in a for a in args)


def test_a_kill_between_the_drop_in_and_its_follow_ups_is_repaired_by_up_and_by_force(cli, sim):
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--to", "driver").code == 0
    host = Host.at(root)
    # killed after the role's file task, before update-grub: the drop-in as the role writes it, grub.cfg without it
    cmdline = acting.iommu_cmdline("passthrough", system.cpu_vendor(host))
    (root / DROPIN).write_text(render("grub-p2pkit-iommu.cfg.j2", p2pkit_p2p_module_cmdline=cmdline))
    assert not grub_carries(root, "iommu=pt")
    r = cli("--root", str(root), "up", "--to", "p2p-module")
    assert r.code == 4, r.err  # a reboot applies the option now
    assert grub_carries(root, "iommu=pt") and "iommu=pt" in load_state(root)["next_cmdline"]

    # the stage is done and its files are all in place; a kill left grub.cfg, depmod's map and the
    # initramfs behind the module (each as its own follow-up never having run)
    assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
    dropin = (root / DROPIN).read_text()
    (root / DROPIN).unlink()
    subprocess_run(root, "update-grub")
    (root / DROPIN).write_text(dropin)
    dep = root / "lib/modules" / KERNEL / "modules.dep"
    dep.write_text("".join(ln + "\n" for ln in dep.read_text().splitlines() if "video/nvidia.ko" not in ln))
    ko = root / "lib/modules" / KERNEL / VIDEO_KO
    img = root / "boot" / f"initrd.img-{KERNEL}"
    later = img.stat().st_mtime_ns + 10**9
    os.utime(ko, ns=(later, later))
    assert not grub_carries(root, "iommu=pt")
    updates = load_state(root).get("initramfs_updates", 0)
    assert cli("--root", str(root), "up", "--to", "p2p-module").code == 0  # done: plain up does no stage work
    r = cli("--root", str(root), "--json", "up", "--from", "p2p-module", "--to", "p2p-module", "--force")
    assert r.code in (0, 4), r.err
    assert grub_carries(root, "iommu=pt")
    assert VIDEO_KO in dep.read_text()
    assert load_state(root)["initramfs_updates"] == updates + 1 and img.stat().st_mtime_ns >= later


def subprocess_run(root: Path, tool: str) -> None:
    subprocess.run([str(root / "usr/bin" / tool)], check=True, capture_output=True)


def test_an_installer_killed_before_the_firmware_is_run_again_by_a_plain_up(cli, sim):
    """The kill campaign's find (bench/bench_kill.py, a kill 12 s into the driver stage): the userspace
    libraries in place, the GSP firmware for the version not yet. The driver stage's proof fails
    (driver.gsp_firmware); a plain `up` runs the installer again, judged by both of its effects."""
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--to", "driver").code == 0
    fw = root / "lib/firmware/nvidia" / load_state(root)["driver"]["userspace"]
    assert any(fw.glob("gsp_*.bin"))
    for f in fw.glob("gsp_*.bin"):
        f.unlink()
    r = cli("--root", str(root), "up", "--to", "driver")
    assert r.code == 0, r.err[-2000:]
    assert any(fw.glob("gsp_*.bin"))
