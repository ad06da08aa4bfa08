"""Driver restore after Ubuntu upgrades (P02): the kernel hook, `p2pkit restore`, the units."""

import datetime as dt
import itertools
import json
import shutil
import subprocess

import pytest

from p2pkit.app.reboot import render_resume_unit
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.sim import lifecycle

pytestmark = pytest.mark.slow
NEW = "6.8.0-90-generic"


def brought_up(cli, root):
    t0 = dt.datetime.now(dt.UTC)
    r = cli("--root", str(root), "up", "--reboot", "--to", "link")
    t1 = dt.datetime.now(dt.UTC)
    assert r.code == 0, r.err
    every_pass_recorded(root, t0, t1)
    # after the reboot the p2p-module stage proved and did not act again: one playbook run, both passes timed
    assert r.err.count("ansible-playbook p2p-module.yml (output:") == 1  # the line a playbook run starts with
    doc = json.loads((root / "var/lib/p2pkit/p2p-module.json").read_text())
    assert doc["acted"]["after_reboot"].startswith("nothing") and doc["acted"]["before_reboot"]
    assert doc["before_reboot"]["seconds"] > 0 and doc["before_reboot"]["boot_id"] != doc["host"]["boot_id"]
    return root


def every_pass_recorded(root, t0, t1):
    """Each stage's artifact records its time, and the pass before a reboot too: every pass lies
    inside the run, none overlaps another, and their seconds add up to no more than the run's wall
    (what is left is p2pkit between stages and the reboot itself). Structural, not a timing bound."""
    store = Store(root / "var/lib/p2pkit")
    passes = []
    for stage in ("preflight", "driver", "p2p-module", "rebar", "topology", "link"):
        doc = store.read(stage)
        for p in (doc.get("before_reboot"), doc):
            if p:
                start, end = (dt.datetime.fromisoformat(p[k]) for k in ("started", "finished"))
                assert 0 <= p["seconds"] <= (end - start).total_seconds() + 0.002, (stage, p)  # timed inside it
                passes.append((start, end, p["seconds"], stage))
    assert [p[3] for p in passes].count("p2p-module") == 2  # the pass before the reboot and the proof after it
    passes.sort()
    slack = dt.timedelta(milliseconds=2)  # the artifacts' times are rounded to milliseconds
    assert passes[0][0] >= t0 - slack and passes[-1][1] <= t1 + slack
    for a, b in itertools.pairwise(passes):
        assert a[1] <= b[0] + slack, (a, b)  # one pass at a time
    assert sum(p[2] for p in passes) <= (t1 - t0).total_seconds() + 0.01


def safeguards_drift(root):
    """P02's safeguards undone by hand or by an upgrade: the restore timer disabled, the kernel and
    apt hooks deleted, the package holds removed. Returns the packages that were held."""
    subprocess.run(["systemctl", f"--root={root}", "disable", "p2pkit-restore.timer"], check=True,
                   capture_output=True)
    (root / "etc/kernel/postinst.d/zz-p2pkit").unlink()
    (root / "etc/apt/apt.conf.d/99p2pkit-restore").unlink()
    apt_mark = str(root / "usr/bin/apt-mark")  # the real apt-mark on the simulated root's dpkg database
    held = subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split()
    assert held
    subprocess.run([apt_mark, "unhold", *held], check=True, capture_output=True)
    return held


def test_stock_module_after_upgrade_then_restore(cli, sim):
    """An unattended upgrade brought a new kernel and a stock DKMS module, and the hook did not run:
    after the reboot P2P is gone; `p2pkit restore` rebuilds, swaps the module live (nothing holds the
    GPUs: the stock module could not even load), and P2P is back without another reboot."""
    root = brought_up(cli, sim("healthy"))
    lifecycle.upgrade(root, NEW, stock_module=True, run_hooks=False)
    lifecycle.reboot(root)
    r = cli("--root", str(root), "--json", "status")
    states = {s["stage"]: s for s in r.json()["stages"]}
    assert states["p2p-module"]["state"] == "stale"
    r = cli("--root", str(root), "verify", "p2p-module")
    assert r.code == 1 and "p2p.modinfo_file" in r.err and "updates/dkms" in r.err
    r = cli("--root", str(root), "restore")
    assert r.code == 0, r.err
    assert "live reload: swapped live" in r.err
    backup = root / "var/lib/p2pkit/backup/p2p-module/files/lib/modules" / NEW / "updates/dkms/nvidia.ko"
    assert "version=580.95.05" in backup.read_text()  # the stock copy is kept, not deleted
    assert not (root / f"lib/modules/{NEW}/updates/dkms/nvidia.ko").exists()
    r = cli("--root", str(root), "restore")
    assert r.code == 0 and "no drift" in r.err
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 0, r.err
    link = Store(root / "var/lib/p2pkit").read("link")
    assert link["host"]["kernel"] == NEW and link["status"] == "passed"
    records = sorted((root / "var/lib/p2pkit/restore").glob("*.json"))
    assert len(records) == 2
    first = json.loads(records[0].read_text())
    assert first["exit_code"] == 0 and first["drift"]["p2p-module"]
    assert any("p2p-module" in a for a in first["actions"])  # (and the driver stage: the dkms package held)


def test_kernel_hook_builds_for_the_new_kernel_before_the_reboot(cli, sim):
    root = brought_up(cli, sim("healthy"))
    printed = lifecycle.upgrade(root, NEW, stock_module=True, run_hooks=True)
    assert printed and printed[0].startswith("zz-p2pkit: exit 0"), printed
    ko = root / f"lib/modules/{NEW}/kernel/drivers/video/nvidia.ko"
    assert "patched=1" in ko.read_text()
    state = lifecycle.reboot(root)
    assert state["module"]["loaded"]["patched"] is True
    r = cli("--root", str(root), "restore")
    # no drift: the hook's restore held the stock nvidia-dkms package the upgrade brought too (P02)
    assert r.code == 0 and "no drift" in r.err
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 0 and "kernel changed since" in r.err


def test_restore_reinstalls_a_replaced_userspace_driver(cli, sim):
    """And the upgrade safeguards undone too (P02): doctor and status name them with `p2pkit restore`
    as the fix; restore puts them back."""
    root = brought_up(cli, sim("healthy"))
    held = safeguards_drift(root)
    r = cli("--root", str(root), "--json", "doctor")
    checks = {c["id"]: c for g in r.json()["groups"] for c in g["checks"]}
    for cid, needle in (("p2p.safeguards", "restore timer enabled, kernel postinst hook, apt hook"),
                        ("driver.holds", held[0])):
        assert checks[cid]["status"] == "fail" and checks[cid]["pitfall"] == "P02", checks[cid]
        assert needle in checks[cid]["measured"] and f"`p2pkit --root {root} restore`" in checks[cid]["hint"]
    r = cli("--root", str(root), "--json", "status")
    driver = {s["stage"]: s for s in r.json()["stages"]}["driver"]
    assert r.code == 1 and driver["state"] == "stale" and "driver.holds" in driver["reason"]
    assert f"`p2pkit --root {root} restore`" in driver["reason"]
    lib = root / "usr/lib/x86_64-linux-gnu"
    for f in lib.glob("libnvidia-ml.so.*"):
        f.unlink()
    (lib / "libnvidia-ml.so.580.95.05").write_text("stock\n")
    r = cli("--root", str(root), "restore")
    assert r.code == 0, r.err
    assert sorted(p.name for p in lib.glob("libnvidia-ml.so.*")) == ["libnvidia-ml.so.1", "libnvidia-ml.so.615.71.09"]
    assert (lib / "libnvidia-ml.so.1").readlink().name == "libnvidia-ml.so.615.71.09"
    r = cli("--root", str(root), "--json", "doctor")  # restore put every safeguard back
    checks = {c["id"]: c for g in r.json()["groups"] for c in g["checks"]}
    assert checks["p2p.safeguards"]["status"] == checks["driver.holds"]["status"] == "pass"
    assert (root / "etc/systemd/system/timers.target.wants/p2pkit-restore.timer").is_symlink()


def test_units_and_hooks_are_installed_and_verify(cli, sim, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    root = brought_up(cli, sim("healthy"))
    units = root / "etc/systemd/system"
    assert (units / "timers.target.wants/p2pkit-restore.timer").is_symlink()
    assert (root / "etc/apt/apt.conf.d/99p2pkit-restore").read_text().count("--no-block") == 1
    # systemd-analyze resolves ExecStart paths on this machine: check copies whose paths exist here
    service = (units / "p2pkit-restore.service").read_text()
    assert f"--root {root}" in service  # never the real / for a simulated host
    d = tmp_path / "units"
    d.mkdir()
    (d / "p2pkit-restore.service").write_text(service)
    shutil.copy(units / "p2pkit-restore.timer", d)  # as the role wrote it
    resume = render_resume_unit(config.load("dual-5090-ninfer", ["serve.port=8001"]), root / "var/lib/p2pkit")
    assert "--profile dual-5090-ninfer --set serve.port=8001 --state-dir" in resume  # the run's overrides too
    (d / "p2pkit-resume.service").write_text(resume)
    for unit in ("p2pkit-restore.service", "p2pkit-restore.timer", "p2pkit-resume.service"):
        r = subprocess.run(["systemd-analyze", "verify", str(d / unit)], capture_output=True, text=True)
        relevant = [ln for ln in r.stderr.splitlines() if unit in ln or "p2pkit" in ln]
        assert r.returncode == 0 and not relevant, r.stderr


def test_restore_stops_the_engine_around_the_rebuild_and_starts_it_after(cli, sim):
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot").code == 0  # the whole sequence: the engine serves
    doc = json.loads(cli("--root", str(root), "--json", "doctor").out)  # the healthy host brought up: no finding
    assert doc["failed"] == [], doc["failed"]
    archs = next(c for g in doc["groups"] for c in g["checks"] if c["id"] == "field.kernel_archs")
    assert archs["status"] == "pass" and "sm_120a" in archs["measured"], archs
    model = root / "srv/models/qwen38-27b-nvfp4-dflash2.ninfer"
    before = model.read_bytes()
    engine_bin = root / "opt/p2pkit/ninfer/build/apps/ninfer-serve"
    engine_sha = engine_bin.read_bytes()
    lifecycle.upgrade(root, NEW, stock_module=True, run_hooks=False)
    lifecycle.reboot(root)  # after the reboot the engine is not running (a reboot ends every process)
    from p2pkit.sim.render import load_state
    from p2pkit.sim.standins import systemctl

    assert systemctl(root, load_state(root), ["start", "p2pkit-engine.service"]) == 0  # systemd starts it at boot
    r = cli("--root", str(root), "restore")
    assert r.code == 0, r.err
    assert "stop p2pkit-engine.service" in r.err and "start p2pkit-engine.service" in r.err
    rec = json.loads(sorted((root / "var/lib/p2pkit/restore").glob("*.json"))[-1].read_text())
    assert {"engine_service": "stopped for the rebuild"} in rec["actions"]
    assert {"engine_service": "started again"} in rec["actions"]
    assert model.read_bytes() == before and engine_bin.read_bytes() == engine_sha  # never touched



def test_after_an_upgrade_and_a_reboot_restore_names_the_one_command_that_makes_status_done(cli, sim):
    """The operator's morning after an unattended upgrade: the host booted the new kernel, restore finds
    no drift (the kernel hook built the module), yet every stage was proven on the old kernel. Restore
    says so and names the one command; that command, run as printed, leaves `status` done (exit 0)."""
    import re
    import shlex

    root = sim("healthy")
    r = cli("--root", str(root), "up", "--reboot")
    assert r.code == 0, r.err[-3000:]
    r = cli("sim", "upgrade", str(root))
    assert r.code == 0, r.err
    # the kernel hook's own p2pkit lines, each labelled SIMULATED once (not "SIMULATED   SIMULATED [restore]")
    assert "SIMULATED   [restore] building the P2P-patched module" in r.err and "SIMULATED   SIMULATED" not in r.err
    r = cli("sim", "reboot", str(root))
    assert r.code == 0, r.err
    r = cli("--root", str(root), "restore")
    assert r.code == 0 and "no drift" in r.err, r.err
    assert "9 of 9 stages are not done (preflight: stale, kernel changed since" in r.out, r.out
    named = re.findall(r"`(p2pkit [^`]*)`", r.out)
    assert named == [f"p2pkit --root {root} up"], r.out  # one command, for this host
    s = cli("--root", str(root), "status")
    assert s.code == 1 and f"next: run `p2pkit --root {root} up`" in s.err, s.err  # status names it too
    doc = cli("--root", str(root), "--json", "restore").json()
    assert doc["next"]["not_done"][0] == "preflight" and doc["next"]["fix"].startswith(f"run `{named[0]}`")
    r = cli(*shlex.split(named[0])[1:])
    assert r.code == 0, r.err[-3000:]
    s = cli("--root", str(root), "status")
    assert s.code == 0 and "next:" not in s.err, s.out + s.err
    r = cli("--root", str(root), "restore")  # and now restore has nothing left to name
    assert r.code == 0 and "not done" not in r.out and "`" not in r.out, r.out
