"""A playbook starts only when one of its tasks has work (p2pkit/stages/work.py): p2pkit's own
probes decide, and the tasks get only that work. Each skip is proven both ways: on a host where
everything is in place no playbook starts; on one where a single thing differs the playbook
starts and puts exactly that right (a probe that missed it would leave it wrong)."""

import os
import subprocess
from pathlib import Path

import pytest

from p2pkit import config, pipeline
from p2pkit.artifacts import Store
from p2pkit.host import Host
from p2pkit.output import Output
from p2pkit.stages import acting, work


def test_differs_reads_content_mode_and_kind(tmp_path):
    host = Host.at(tmp_path)
    (tmp_path / "etc").mkdir()
    f = work.file_entry("/etc/x.conf", "a = 1\n", "0644")
    assert work.differs(host, f)  # missing
    (tmp_path / "etc/x.conf").write_text("a = 1\n")
    os.chmod(tmp_path / "etc/x.conf", 0o644)
    assert not work.differs(host, f)
    (tmp_path / "etc/x.conf").write_text("a = 2\n")  # one byte
    assert work.differs(host, f)
    (tmp_path / "etc/x.conf").write_text("a = 1\n")
    os.chmod(tmp_path / "etc/x.conf", 0o600)  # the mode
    assert work.differs(host, f)
    d = work.dir_entry("/etc", "0755")
    os.chmod(tmp_path / "etc", 0o700)  # an existing directory's mode is the operator's
    assert not work.differs(host, d)
    assert work.differs(host, work.dir_entry("/etc/x.conf"))  # a file where a directory belongs
    assert work.differs(host, {**f, "owner": "p2pkit-no-such-user"})  # the role creates the user first


def test_has_work_counts_flags_lists_and_files_only():
    assert work.has_work({"files": {"a": [], "b": []}, "install": False, "stock": []}) == []
    assert work.has_work({"files": {"a": [{"path": "/x"}]}, "install": True, "stock": [{"path": "/y"}]}) == \
        ["files.a", "install", "stock"]


def ctx_for(root: Path, profile=None) -> pipeline.Ctx:
    host = Host.at(root)
    return pipeline.Ctx(profile=profile or config.load(host.sim["profile"]), host=host,
                        store=Store(root / "var/lib/p2pkit"), out=Output())


def started(res: dict) -> bool:
    return res.get("started", True) and "returncode" in res


@pytest.mark.slow
def test_driver_and_p2p_module_start_a_playbook_only_for_work_and_fix_what_differs(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    assert started(acting.driver(ctx)) and started(acting.p2p_module(ctx))
    again = acting.driver(ctx), acting.p2p_module(ctx)
    assert [started(r) for r in again] == [False, False], again  # everything in place: no ansible-playbook
    log = ctx.store.dir / "logs/driver.log"
    before = log.stat().st_mtime_ns

    # driver: one file one byte off, the installer not executable, a guarded package unheld
    pin = root / "etc/apt/preferences.d/p2pkit-nvidia"
    good_pin = pin.read_text()
    pin.write_text(good_pin.replace("Pin-Priority: -1", "Pin-Priority: 1"))
    name = ctx.profile.driver.installer_url.rsplit("/", 1)[-1]
    installer = root / "var/cache/p2pkit" / name
    installer.chmod(0o644)
    apt_mark = str(root / "usr/bin/apt-mark")  # the real apt-mark on the simulated root's dpkg database
    held = subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split()
    subprocess.run([apt_mark, "unhold", *held], check=True, capture_output=True)
    res = acting.driver(ctx)
    assert started(res) and log.stat().st_mtime_ns != before
    assert res["work"]["files"] == {"all": ["/etc/apt/preferences.d/p2pkit-nvidia"]}
    assert res["work"]["executable"] and res["work"]["unheld"] == held and not res["work"]["download"]
    assert pin.read_text() == good_pin and installer.stat().st_mode & 0o777 == 0o755
    assert subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split() == held

    # driver: a cached installer that is not the pinned one is downloaded again; a missing library reinstalled
    installer.write_bytes(installer.read_bytes() + b"\n")
    lib = root / "usr/lib/x86_64-linux-gnu" / f"libnvidia-ml.so.{ctx.profile.driver.version}"
    lib.unlink()
    res = acting.driver(ctx)
    assert res["work"]["download"] and res["work"]["install"] and res["work"]["files"]["all"] == []
    assert work.sha256_of(installer) == ctx.profile.driver.installer_sha256 and lib.is_file()

    # p2p-module: the GRUB drop-in edited, the restore timer disabled, the installed module replaced
    grub = root / "etc/default/grub.d/60-p2pkit-iommu.cfg"
    good_grub = grub.read_text()
    grub.write_text("# emptied by hand\n")
    subprocess.run(["systemctl", f"--root={root}", "disable", "p2pkit-restore.timer"], check=True,
                   capture_output=True)
    ko = root / "lib/modules/6.8.0-88-generic/kernel/drivers/video/nvidia.ko"
    good_ko = ko.read_bytes()
    ko.write_bytes(good_ko.replace(b"patched=1", b"patched=0"))
    res = acting.p2p_module(ctx)
    assert started(res), res
    assert res["work"]["files"] == {"all": ["/etc/default/grub.d/60-p2pkit-iommu.cfg"]}
    assert res["work"]["enable_timer"] and res["work"]["install"] and not res["work"]["build"]
    assert grub.read_text() == good_grub and ko.read_bytes() == good_ko
    assert (root / "etc/systemd/system/timers.target.wants/p2pkit-restore.timer").is_symlink()
    p2p_log = (ctx.store.dir / "logs/p2p-module.log").read_text()
    # the drop-in's follow-up and the install's ran; the initramfs's too (the module changed), not systemd's
    ran = [ln.split(": ", 1)[1].rstrip("] *") for ln in p2p_log.splitlines()
           if ln.startswith("TASK [p2pkit_p2p_module : Ensure") and "changed:" in p2p_log.split(ln, 1)[1][:300]]
    assert {"Ensure grub.cfg carries the IOMMU drop-in's options", "Ensure depmod's map lists the installed modules",
            "Ensure the initramfs holds the patched module and its parameters"} <= set(ran), ran
    reload = p2p_log.rsplit("Ensure systemd has read the restore units]", 1)[1].split("PLAY RECAP")[0]
    assert "skipping: [localhost]" in reload
    assert started(acting.p2p_module(ctx)) is False  # and now there is nothing left


def test_the_failure_named_is_the_one_that_stopped_the_run_not_one_a_rescue_caught():
    from p2pkit.ansible import failed_task

    log = ("TASK [r : Download the installer and check its pinned sha256] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "The checksum did not match"}\n'
           "TASK [r : Keep the download with the wrong checksum aside] ***\nchanged: [localhost]\n"
           "TASK [r : Stop on a wrong checksum] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "has sha256 ab, not the pinned 00"}\n'
           "TASK [r : Hold packages] ***\n"
           'failed: [localhost] (item=a) => {"msg": "no such package a"}\n'
           'fatal: [localhost]: FAILED! => {"msg": "One or more items failed"}\n')
    assert failed_task(log) == "task 'r : Hold packages': no such package a"  # a loop: its first item's failure
    assert failed_task(log.split("TASK [r : Hold")[0]) == "task 'r : Stop on a wrong checksum': " \
                                                          "has sha256 ab, not the pinned 00"
