"""Each simulated scenario makes the right stage fail with the right check and hint."""

import json

import pytest

from p2pkit.core.artifacts import Store
from p2pkit.sim import lifecycle

pytestmark = pytest.mark.slow


def up_through_reboot(cli, root, *args):
    r = cli("--root", str(root), "up", *args)
    if r.code == 4:
        lifecycle.reboot(root)
        r = cli("--root", str(root), "up", *args)
    return r


def failing(root, stage):
    doc = Store(root / "var/lib/p2pkit").read(stage)
    assert doc is not None and doc["status"] == "failed", doc and doc["status"]
    return {c["id"]: c for c in doc["checks"] if c["status"] == "fail"}


@pytest.mark.parametrize("scenario,stage,check,hint", [
    ("no-gpu", "preflight", "preflight.gpu_count", "p2pkit sim init"),
    ("one-gpu", "preflight", "preflight.gpu_count", "P2P needs two"),
    ("wrong-os", "preflight", "preflight.os", "host.allow_other_os"),
    ("secure-boot-on", "preflight", "preflight.secure_boot", "P2PKIT_MOK_PASSWORD"),
    ("driver-595", "driver", "driver.pin", "595's GSP firmware cannot build the BAR1 P2P mailbox"),
    ("gsp-firmware-missing", "driver", "driver.gsp_firmware", "error -2"),
    ("small-bar", "rebar", "rebar.bar1.0000:01:00.0", "Resizable BAR and Above 4G Decoding"),
    ("behind-switch", "topology", "topology.root_port.0000:03:00.0", "PCIe switch (PLX)"),
    ("gen4-slot", "topology", "topology.capability.0000:41:00.0", "Gen5 x8 CPU slot"),
    ("p2p-chipset-not-supported", "topology", "topology.p2p_read", "CNS: chipset not supported"),
])
def test_scenario_fails_at_the_right_stage(cli, sim, scenario, stage, check, hint):
    root = sim(scenario)
    r = up_through_reboot(cli, root)
    assert r.code == 1, r.err
    assert f"{stage} failed: {check}" in r.err
    if stage == "preflight":  # a first run that stops at preflight records nothing (issue 47 item 11)
        assert not (root / "var/lib/p2pkit").exists() and not (root / "run/p2pkit.core.lock").exists()
        doc = json.loads(cli("--root", str(root), "--json", "up").out)
        bad = {c["id"]: c for c in doc["stages"][0]["checks"] if c["status"] == "fail"}
    else:
        bad = failing(root, stage)
    assert check in bad, list(bad)
    assert hint in bad[check]["hint"]
    assert bad[check]["measured"] is not None and bad[check]["expected"] is not None


def test_behind_switch_each_bridge_has_its_own_address_and_the_finding_names_them_in_order(cli, sim, tmp_path):
    """The simulated PLX layout as a real one is: root port > the switch's upstream port > its downstream
    port > the GPU, four devices at four addresses (buses numbered depth first); the finding reads the
    chain from the root port down, each bridge by its own type."""
    root = tmp_path / "bs"
    r = cli("sim", "init", "--force", str(root), "--scenario", "behind-switch")
    assert r.code == 0, r.err
    for gpu, chain in (("0000:03:00.0", ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0"]),
                       ("0000:43:00.0", ["0000:40:01.1", "0000:41:00.0", "0000:42:00.0"])):
        real = (root / "sys/bus/pci/devices" / gpu).resolve()
        assert [p.name for p in real.parents][:3][::-1] == chain and real.name == gpu
        assert len({*chain, gpu}) == 4
        for bdf in chain:  # each address is its own device, not the GPU's
            assert (root / "sys/bus/pci/devices" / bdf).resolve() == real.parents[len(chain) - 1 - chain.index(bdf)]
    r = up_through_reboot(cli, root)
    assert r.code == 1
    assert ("topology failed: topology.root_port.0000:03:00.0: 0000:00:01.1 (root port) > 0000:01:00.0 (switch "
            "upstream) > 0000:02:00.0 (switch downstream) (expected root port). Fix: a PCIe switch (PLX) sits "
            "between this GPU and the CPU") in r.err, r.err[-2000:]
    lifecycle.stop_services(root)


@pytest.mark.parametrize("reboot", [[], ["--reboot"]])
def test_no_gpu_real_message(cli, sim, reboot):
    root = sim("no-gpu")
    r = cli("--root", str(root), "up", *reboot)
    assert r.code == 1 and "Traceback" not in r.err
    headline = r.err.strip().splitlines()[-1]
    assert "preflight failed: preflight.gpu_count: 0" in headline
    assert "no NVIDIA GPU was found under /sys/bus/pci/devices" in headline and "p2pkit sim init" in headline
    # issue 47 item 11: a first run that stops at preflight changes nothing (the README): no state directory, no
    # lock, no artifact; the table still shows why
    assert not (root / "var/lib/p2pkit").exists() and not (root / "run/p2pkit.core.lock").exists()
    assert "preflight.gpu_count: 0 (nothing recorded on this host)" in r.out, r.out


def test_a_preflight_failure_where_state_is_recorded_is_kept(cli, sim):
    """Where the host has a state directory already (an earlier run), preflight's failure is its artifact, as
    ever: status shows it."""
    root = sim("no-gpu")
    (root / "var/lib/p2pkit").mkdir(parents=True)
    assert cli("--root", str(root), "up").code == 1
    assert failing(root, "preflight")["preflight.gpu_count"]["measured"] == "0"


def test_driver_595_refused_before_anything_runs(cli, sim):
    root = sim("driver-595")
    cli("--root", str(root), "up")
    assert not (root / "var/lib/p2pkit/logs/driver.log").exists()  # no playbook started
    assert not list((root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so.*")) if \
        (root / "usr/lib/x86_64-linux-gnu").exists() else True
    assert failing(root, "driver")["driver.pin"]["pitfall"] == "P01"


def test_iommu_translating_is_fixed_by_the_p2p_module_stage(cli, sim):
    root = sim("iommu-translating")
    r = cli("--root", str(root), "up")
    assert r.code == 4
    doc = Store(root / "var/lib/p2pkit").read("p2p-module")
    pending = {c["id"] for c in doc["checks"] if c["status"] == "pending"}
    assert "p2p.iommu" in pending
    grub = (root / "etc/default/grub.d/60-p2pkit-iommu.cfg").read_text()
    assert "amd_iommu=on iommu=pt" in grub
    lifecycle.reboot(root)
    r = cli("--root", str(root), "up", "--to", "link")
    assert r.code == 0, r.err
    topo = Store(root / "var/lib/p2pkit").read("topology")
    assert all(c["status"] == "pass" for c in topo["checks"] if c["id"].startswith("topology.iommu"))
    # P28/P34 prevented: the fork's driver parameter in modprobe.d and the initramfs, live after the boot
    assert 'NVreg_RegistryDwords="RMForceStaticBar1=1"' in (root / "etc/modprobe.d/p2pkit-nvidia.conf").read_text()
    initrd = (root / "boot/initrd.img-6.8.0-88-generic").read_text()
    assert "kernel/drivers/video/nvidia.ko" in initrd and "etc/modprobe.d/p2pkit-nvidia.conf" in initrd
    assert 'RegistryDwords: "RMForceStaticBar1=1"' in (root / "proc/driver/nvidia/params").read_text()
    link = {c["id"]: c for c in Store(root / "var/lib/p2pkit").read("link")["checks"]}
    assert link["link.nccl_allreduce"]["status"] == "pass" and "via P2P/" in link["link.nccl_allreduce"]["measured"]


def test_translating_iommu_left_in_place_fails_link_integrity(cli, sim):
    """What a real box does with P2P over a translating IOMMU: status OK, data zero-filled. The real
    load worker runs against the simulated host's devices and NVML."""
    from p2pkit.core import config
    from p2pkit.host import Host
    from p2pkit.load import worker
    from p2pkit.sim.render import load_state, save
    from p2pkit.stages.link import checks as link
    from tests.conftest import install_userspace

    root = sim("iommu-translating")
    install_userspace(root, "615.71.09")
    state = load_state(root)
    state["module"]["loaded"] = {"version": "615.71.09", "srcversion": "X", "patched": True}
    save(root, state)
    prof = config.load(None)
    cfg = {"load_seconds": 30, "poll_ms": 100, "sample_mib": 64, "samples": 3, "min_gen": 5, "min_width": 8,
           "backend": Host.at(root).load_backend()}
    res = worker.main(cfg)
    assert res["simulated"] is True and res["pairs"][0]["integrity"]["zeros"] == 16 << 20
    checks = {c.id: c for c in link.check({"link_load": res}, prof)}
    assert checks["link.p2p_integrity.gpu0-gpu1"].status == "fail"
    assert "iommu=pt" in checks["link.p2p_integrity.gpu0-gpu1"].hint
    assert checks["link.trained.gpu0"].status == "pass"


def test_capped_cgroup_is_a_warning_not_a_failure(cli, sim):
    root = sim("capped-cgroup")
    r = cli("--root", str(root), "up", "--to", "preflight")
    assert r.code == 0, r.err
    doc = Store(root / "var/lib/p2pkit").read("preflight")
    cg = {c["id"]: c for c in doc["checks"]}["preflight.cgroup"]
    assert cg["status"] == "warn" and cg["pitfall"] == "P12" and "8.0 GiB" in cg["measured"]
    assert "does not inherit" in cg["hint"]


def test_package_tools_are_the_real_ones_on_the_simulated_database(sim):
    """dpkg-query, dpkg and apt on a simulated host are shell scripts that run this machine's real
    tools on the host's own database, found from where the script lies (through a link to the host
    too); the other stand-ins run without site-packages (-S) and still answer."""
    import subprocess

    root = sim("p2p-up")
    link = root.parent / "link-to-host"
    link.symlink_to(root)
    q = link / "usr/bin/dpkg-query"
    assert q.read_text().startswith("#!/bin/sh\n")
    r = subprocess.run([str(q), "-W", "-f=${Package}\\n"], capture_output=True, text=True)
    status = (root / "var/lib/dpkg/status").read_text()
    assert r.returncode == 0 and r.stdout.split() == [ln.split()[1] for ln in status.splitlines()
                                                      if ln.startswith("Package: ")], r.stderr
    own = subprocess.run(["dpkg-query", "-W", "-f=${Package}\\n"], capture_output=True, text=True).stdout
    assert r.stdout != own  # not this machine's packages
    smi = root / "usr/bin/nvidia-smi"
    assert smi.read_text().splitlines()[0].endswith(" -S")
    r = subprocess.run([str(smi), "topo", "-p2p", "r"], capture_output=True, text=True)
    assert r.returncode == 0 and "GPU0" in r.stdout, r.stderr


# ---------------------------------------------------------------- the field pitfalls gate `up` (issue 28)

@pytest.mark.parametrize("scenario,stage,check,pitfall", [
    ("field-acs-redirect", "topology", "field.acs", "P29"),
    ("field-bar-no-space", "rebar", "field.bar_assign", "P31"),
    ("field-wedged", "link", "field.gpu_wedged", "P35"),
    ("field-roce-mtu-1500", "link", "field.roce.gid.rocep1s0f0:1", "P38"),
    ("field-spark-sm120-only", "engine", "field.kernel_archs", "P39"),
])
def test_field_fault_stops_up_at_its_stage(cli, sim, scenario, stage, check, pitfall):
    """A scenario built to show a field pitfall stops `up` at the stage whose result it breaks (doctor
    alone named these before), with the pitfall's id."""
    root = sim(scenario)
    r = up_through_reboot(cli, root)
    assert r.code == 1, r.err
    assert f"{stage} failed: " in r.err
    bad = failing(root, stage)
    assert check in bad, list(bad)
    assert bad[check]["pitfall"] == pitfall and bad[check]["hint"]


def test_field_display_is_a_warning_up_goes_on(cli, sim):
    root = sim("field-display")
    r = up_through_reboot(cli, root, "--to", "topology")
    assert r.code == 0, r.err
    c = {c["id"]: c for c in Store(root / "var/lib/p2pkit").read("topology")["checks"]}["field.display"]
    assert c["status"] == "warn" and c["pitfall"] == "P33"


def test_field_no_static_bar1_is_fixed_by_the_p2p_module_stage(cli, sim):
    """P28 shown by a module loaded without RMForceStaticBar1=1: the p2p-module stage writes the parameter
    and the stage's own field.static_bar1 proves it live (pending until the boot, if one is needed)."""
    root = sim("field-no-static-bar1")
    r = up_through_reboot(cli, root, "--to", "p2p-module")
    assert r.code == 0, r.err
    c = {c["id"]: c for c in Store(root / "var/lib/p2pkit").read("p2p-module")["checks"]}["field.static_bar1"]
    assert c["status"] == "pass" and c["pitfall"] == "P28"
