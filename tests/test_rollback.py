"""Undo and live reload (issue 9): rollback to the stock state, refusal on a changed backup,
live module swap with and without a process holding the GPUs."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from p2pkit.core.artifacts import Store
from p2pkit.sim import lifecycle
from p2pkit.sim.lifecycle import STOCK_KO

pytestmark = pytest.mark.slow
KERNEL = "6.8.0-88-generic"
SKIP = (".p2pkit-sim", "var/lib/p2pkit", "var/cache/p2pkit", "proc", "sys", "dev",
        "run/p2pkit.core.lock")  # the host's run lock: a runtime file p2pkit leaves for the next run, like /run's
# what the real dpkg and apt-mark write for their own bookkeeping when they run on the simulated root
# (locks, the previous status, the database format): not host state a rollback puts back
DPKG_BOOKKEEPING = {"var/lib/dpkg/lock", "var/lib/dpkg/lock-frontend", "var/lib/dpkg/triggers/Lock",
                    "var/lib/dpkg/status-old", "var/lib/dpkg/info/format"}


def tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.startswith(SKIP) or rel in DPKG_BOOKKEEPING or p.is_dir():
            continue
        out[rel] = "link:" + str(p.readlink()) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_install_rollback_install_again(cli, sim):
    root = sim("healthy")
    leftover = root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko"  # a stock DKMS copy from before
    leftover.parent.mkdir(parents=True)
    leftover.write_text(STOCK_KO.format(kernel=KERNEL))
    from p2pkit.sim.standins import write_initramfs, write_modules_dep

    write_modules_dep(root, KERNEL)  # DKMS runs depmod when it installs a module ...
    write_initramfs(root, KERNEL)  # ... and rebuilds the initramfs
    before = tree(root)
    assert cli("--root", str(root), "up", "--reboot", "--to", "link").code == 0
    assert not leftover.exists() and tree(root) != before
    r = cli("--root", str(root), "rollback", "driver", "--yes")
    assert r.code == 3 and f"roll it back first: `p2pkit --root {root} rollback p2p-module --yes`" in r.err
    plan = cli("--root", str(root), "--json", "rollback", "p2p-module").json()
    assert plan["acted"] is False and f"restore /lib/modules/{KERNEL}/updates/dkms/nvidia.ko" in plan["plan"]
    assert "remove /etc/default/grub.d/60-p2pkit-iommu.cfg" in plan["plan"]
    assert tree(root) != before  # the plan changed nothing
    units = ["p2pkit-restore.timer", "p2pkit-restore.service"]
    show = [str(root / "usr/bin/systemctl"), "show", *units, "-p", "LoadState,ActiveState,NeedDaemonReload"]
    assert "ActiveState=active" in subprocess.run(show, capture_output=True, text=True).stdout  # the reboot started it
    r = cli("--root", str(root), "rollback", "p2p-module", "--yes")
    assert r.code == 4, r.err
    # the manager's own view: the timer stopped and gone after the reload (it would fire and undo the rollback),
    # and the rebuilt initramfs holds no modprobe.d file of p2pkit's
    said = subprocess.run(show, capture_output=True, text=True).stdout
    assert said.strip().split("\n\n") == ["LoadState=not-found\nActiveState=inactive\nNeedDaemonReload=no"] * 2, said
    assert "systemd: p2pkit-restore.timer not-found, inactive" in r.err
    listing = subprocess.run([str(root / "usr/bin/lsinitramfs"), str(root / f"boot/initrd.img-{KERNEL}")],
                             capture_output=True, text=True).stdout
    assert "etc/modprobe.d/p2pkit-nvidia.conf" not in listing and "nvidia.ko" in listing, listing
    assert "p2p-module rolled back" in r.out and "error" not in r.err  # it worked: exit 4 asks for the reboot
    # the driver's pinned userspace stays: the command that completes the way back comes before the reboot
    assert f"next: `p2pkit --root {root} rollback driver --yes`, then `p2pkit sim reboot {root}`" in r.err
    assert leftover.read_text() == STOCK_KO.format(kernel=KERNEL)
    store = Store(root / "var/lib/p2pkit")
    assert store.exists("driver") and not store.exists("p2p-module") and not store.exists("link")
    r = cli("--root", str(root), "rollback", "driver", "--yes")
    assert r.code == 4, r.err
    assert tree(root) == before
    assert (root / "var/lib/p2pkit/logs/driver.log").exists()  # history kept
    assert len(list((root / "var/lib/p2pkit/rollback").glob("*.json"))) == 2
    lifecycle.reboot(root)
    r = cli("--root", str(root), "up", "--reboot", "--to", "link")
    assert r.code == 0, r.err


def test_rollback_refuses_when_a_backed_up_file_changed(cli, sim):
    root = sim("healthy")
    leftover = root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko"
    leftover.parent.mkdir(parents=True)
    leftover.write_text(STOCK_KO.format(kernel=KERNEL))
    assert cli("--root", str(root), "up", "--reboot", "--to", "link").code == 0
    copy = root / f"var/lib/p2pkit/backup/p2p-module/files/lib/modules/{KERNEL}/updates/dkms/nvidia.ko"
    copy.write_text("tampered\n")
    grub = root / "etc/default/grub.d/60-p2pkit-iommu.cfg"
    r = cli("--root", str(root), "rollback", "p2p-module", "--yes")
    assert r.code == 1
    assert str(copy) in r.err and "sha256 differs" in r.err
    assert grub.exists() and not leftover.exists()  # nothing was changed
    assert Store(root / "var/lib/p2pkit").exists("p2p-module")


def test_a_link_at_the_rollback_records_is_refused_before_anything_is_rolled_back(cli, sim, tmp_path):
    """issue 48 item 7's campaign: a link at var/lib/p2pkit/rollback was refused only after the module had been
    rolled back and its backup renamed, so the refusal's "run the same command again" met "nothing to roll back"
    and the record of what was undone was never written. The link is refused before anything changes."""
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
    victim = tmp_path / "victim"
    victim.mkdir()
    (root / "var/lib/p2pkit/rollback").symlink_to(victim)
    grub = root / "etc/default/grub.d/60-p2pkit-iommu.cfg"
    r = cli("--root", str(root), "rollback", "p2p-module", "--yes")
    assert r.code == 2 and f"{root}/var/lib/p2pkit/rollback is a symbolic link (to {victim})" in r.err, r.err
    assert list(victim.iterdir()) == []
    assert grub.exists() and (root / "var/lib/p2pkit/backup/p2p-module").is_dir()  # nothing rolled back
    assert Store(root / "var/lib/p2pkit").exists("p2p-module")
    (root / "var/lib/p2pkit/rollback").unlink()
    r = cli("--root", str(root), "rollback", "p2p-module", "--yes")  # the fix the refusal gives: it works
    assert r.code == 4, r.err
    assert not grub.exists() and len(list((root / "var/lib/p2pkit/rollback").glob("*.json"))) == 1


def test_live_reload_swaps_the_loaded_stock_module_without_a_reboot(cli, sim):
    root = sim("stock-driver")
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 0, r.err
    assert "live reload: swapped live: nvidia_drm nvidia_modeset nvidia_uvm nvidia" in r.err
    doc = Store(root / "var/lib/p2pkit").read("p2p-module")
    assert doc["status"] == "passed" and doc["acted"]["live_reload"]["done"] is True


def test_live_reload_falls_back_to_reboot_when_the_gpu_is_held(cli, sim):
    root = sim("stock-driver-display")
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 4
    assert "Xorg (pid 2301) hold(s) /dev/nvidia*" in r.err
    doc = Store(root / "var/lib/p2pkit").read("p2p-module")
    assert doc["acted"]["live_reload"]["holders"] == [{"pid": 2301, "command": "Xorg"}]
    lifecycle.reboot(root)
    assert cli("--root", str(root), "up", "--to", "link").code == 0


def test_live_reload_unloads_nothing_when_fuser_gives_no_answer(cli, sim):
    """fuser failing (exit 127, as a program that cannot start gives; the simulated one made to) is no answer
    about who holds /dev/nvidia*: nothing is unloaded, the reason says so, and the reboot path follows. Seen
    failing before the fix: the modules were unloaded as if nothing held them."""
    root = sim("stock-driver")
    state = root / ".p2pkit-sim/state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "fuser_broken": True}))
    loaded = (root / "sys/module/nvidia/srcversion").read_text()
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 4, r.err
    assert "which processes hold /dev/nvidia* could not be read" in r.err and "nothing was unloaded" in r.err, r.err
    doc = Store(root / "var/lib/p2pkit").read("p2p-module")
    assert doc["acted"]["live_reload"]["done"] is False
    assert (root / "sys/module/nvidia/srcversion").read_text() == loaded  # the stock module still loaded


def test_live_reload_can_be_turned_off(cli, sim, tmp_path):
    import json

    root = sim("stock-driver")
    prof = Path(json.loads((root / ".p2pkit-sim/state.json").read_text())["profile"])
    off = tmp_path / "off.toml"
    off.write_text(prof.read_text().replace('iommu = "passthrough"', 'iommu = "passthrough"\nlive_reload = false'))
    r = cli("--root", str(root), "--profile", str(off), "up", "--to", "link")
    assert r.code == 4 and "p2p_module.live_reload is off" in r.err


def test_rollback_to_stock_is_complete_and_nvml_initialises_afterwards(cli, sim):
    """Ubuntu's stock 580 driver is installed and loaded; the stages replace its libraries (NVIDIA's
    installer removes them) and its module. Rolled back, everything is as it was, and after a
    reboot NVML initialises on the stock driver again (issue 17)."""
    import json

    from p2pkit.host import Host, nvml

    root = sim("stock-driver")
    lib = root / "usr/lib/x86_64-linux-gnu"
    before = tree(root)
    assert nvml.facts(Host.at(root))["driver_version"] == "580.95.05"
    assert cli("--root", str(root), "up", "--to", "link").code == 0
    assert not (lib / "libnvidia-ml.so.580.95.05").exists()  # the installer removed the stock library
    manifest = json.loads((root / "var/lib/p2pkit/backup/driver/manifest.json").read_text())["entries"]
    stock_lib = manifest["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"]
    assert stock_lib["kind"] == "original" and len(stock_lib["sha256"]) == 64
    link = manifest["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]
    assert link["kind"] == "symlink" and link["target"] == "libnvidia-ml.so.580.95.05" and link["sha256"]
    assert manifest["/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin"]["kind"] == "original"
    assert manifest["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.615.71.09"]["kind"] == "absent"  # added by p2pkit
    assert manifest["/etc/modprobe.d/p2pkit-blacklist-nouveau.conf"]["kind"] == "absent"
    assert cli("--root", str(root), "rollback", "p2p-module", "--yes").code == 4
    plan = cli("--root", str(root), "--json", "rollback", "driver").json()["plan"]
    assert "restore /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05" in plan
    assert "restore /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in plan
    r = cli("--root", str(root), "rollback", "driver", "--yes")
    assert r.code == 4, r.err
    assert tree(root) == before
    lifecycle.reboot(root)
    after = nvml.facts(Host.at(root))
    assert "error" not in after and after["driver_version"] == "580.95.05", after


def test_rollback_says_what_the_reboot_loads_and_names_the_command_that_completes_it(cli, sim):
    """`rollback p2p-module` promised "a reboot loads the stock driver" whatever the host had: on a bare
    box there is no stock module at all, and after an upgrade the stock module meets the pinned 615
    userspace, which stays. Each plan now says what the next boot will do, and names the driver's
    rollback where it is needed; the simulated reboot then does what was said."""
    import re
    import shlex

    from p2pkit.host import Host, nvml

    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
    r = cli("--root", str(root), "rollback", "p2p-module")
    assert "a reboot loads the stock driver" not in r.out
    assert (f"after a reboot no nvidia module loads on kernel {KERNEL}: the host has none there besides p2pkit's; "
            f"the pinned 615.71.09 userspace p2pkit installed stays until `p2pkit --root {root} rollback driver "
            "--yes`") in r.out, r.out
    # an unattended upgrade brings a new kernel and Ubuntu's stock 580 DKMS module (the hook moves it aside)
    assert cli("sim", "upgrade", str(root)).code == 0
    assert cli("sim", "reboot", str(root)).code == 0
    new = "6.8.0-90-generic"
    stock = f"the stock module 580.95.05 (/lib/modules/{new}/updates/dkms/nvidia.ko)"
    r = cli("--root", str(root), "rollback", "p2p-module", "--yes")
    assert r.code == 4, r.err
    said = f"after a reboot kernel {new} loads {stock}, but NVIDIA's tools and CUDA refuse it (Driver/library " \
           "version mismatch): the pinned 615.71.09 userspace p2pkit installed stays; run "
    assert said in r.out and f"then a reboot loads {stock}" in r.out, r.out
    named = re.findall(r"next: `([^`]*)`", r.err)
    assert named == [f"p2pkit --root {root} rollback driver --yes"], r.err
    r = cli("sim", "reboot", str(root))  # what the plan said: the stock module loads, and NVML refuses it
    assert "nvidia module: 580.95.05" in r.err, r.err
    assert "mismatch" in nvml.facts(Host.at(root)).get("error", ""), nvml.facts(Host.at(root))
    r = cli("--root", str(root), "rollback", "driver")
    assert f"a reboot loads {stock} on kernel {new}" in r.out, r.out
    r = cli(*shlex.split(named[0])[1:])  # the named command, as printed
    assert r.code == 4 and f"a reboot loads {stock} on kernel {new}" in r.out, r.out + r.err
    r = cli("sim", "reboot", str(root))
    assert f"nvidia module: 580.95.05 /lib/modules/{new}/updates/dkms/nvidia.ko" in r.err, r.err


def test_after_both_driver_stages_are_rolled_back_and_a_reboot_the_engine_finds_no_gpu(cli, sim):
    """Issue 47 item 13: the simulated engine, started by the reboot with no nvidia module loaded, said "all-reduce
    p2p on" and `serve status` exited 0. A real engine finds no CUDA device there and stops, as this one now does
    (the directory host's boot records what modprobe said; the engine reads it)."""
    root = sim("healthy")
    try:
        assert cli("--root", str(root), "up", "--reboot").code == 0
        assert cli("--root", str(root), "rollback", "p2p-module", "--yes").code == 4
        assert cli("--root", str(root), "rollback", "driver", "--yes").code == 4
        lifecycle.reboot(root)
        r = cli("--root", str(root), "serve", "status")
        assert r.code != 0, r.out + r.err
        logs = cli("--root", str(root), "serve", "logs", "-n", "5")
        last = (logs.out + logs.err).rsplit("ninfer-serve (SIMULATED) starting", 1)[-1]  # the reboot's start
        assert "no CUDA-capable device is detected" in last and "all-reduce" not in last, logs.out + logs.err
    finally:
        lifecycle.stop_services(root)
