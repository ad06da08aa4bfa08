"""The field pitfalls P28-P39 (shared/PITFALLS.md): parsers and checks on real outputs quoted from the
public threads (fixtures/field/README.md), the "could not check" findings, and doctor over the
simulated scenarios that show each fault at the files and commands a real host would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pkit.core import config
from p2pkit.core.ansible import COLLECTION
from p2pkit.parse import field as pf
from p2pkit.rules import engine_env
from p2pkit.stages.engine import checks as engine
from p2pkit.stages.link import checks as link
from p2pkit.stages.p2p_module import checks as p2p_module
from p2pkit.stages.rebar import checks as rebar
from p2pkit.stages.service import checks as service
from p2pkit.stages.topology import checks as topology
from tests.conftest import FIXTURES

FX = FIXTURES / "field"
NINFER = config.load("dual-5090-ninfer")
LLAMA = config.load("dual-5090-llamacpp")
SPARK = config.load("dual-spark-vllm")


def fx(name: str) -> str:
    return (FX / name).read_text()


def status(checks, id_: str) -> str:
    return next(c.status for c in checks if c.id == id_)


# ------------------------------------------------------------------------------------------- P28

def params_fact(text: str) -> dict:
    params = pf.driver_params(text)
    return {"loaded": True, "params": params, "registry_dwords": pf.registry_dwords(params.get("RegistryDwords", ""))}


def test_p28_static_bar1_from_the_live_params_file():
    other = p2p_module.static_bar1({"driver_params": params_fact(fx("params_other_dwords.txt"))}, NINFER)
    assert other[0].status == "fail" and "RMIntrLockingMode=1" in other[0].measured and other[0].pitfall == "P28"
    assert pf.driver_params(fx("params_dynamic_power.txt")) == {"DynamicPowerManagement": "3"}
    # club-3090 PR #885's live value, in the params file's line format
    live = p2p_module.static_bar1({"driver_params": params_fact(
        'RegistryDwords: "RMForceStaticBar1=1;PeerMappingOverride=1"\n')}, NINFER)
    assert live[0].status == "pass"


def test_p28_params_missing_on_an_older_driver_is_could_not_check():
    missing = {"error": "/proc/driver/nvidia/params does not exist", "by_hand": "grep"}
    c = p2p_module.static_bar1({"driver_params": missing}, NINFER)[0]
    assert c.status == "warn" and c.measured.startswith("could not check, because") and "run by hand" in c.hint


# ------------------------------------------------------------------------------------------- P29

def acs_config(ctl: int) -> bytes:
    """A 4 KiB config space dump with the ACS extended capability at 0x100 holding `ctl` (nccl#2079's 0x001d)."""
    cfg = bytearray(4096)
    cfg[0x100:0x104] = (0x000D | 1 << 16 | 0x000 << 20).to_bytes(4, "little")
    cfg[0x106:0x108] = ctl.to_bytes(2, "little")
    return bytes(cfg)


def test_p29_acs_redirect_from_lspci_and_from_config_space():
    redirecting = [x for x in pf.lspci_acs(fx("lspci_acsctl_nccl523.txt")) if pf.redirects(x["flags"])]
    assert len(redirecting) == 2 and not [x for x in pf.lspci_acs(fx("lspci_acsctl_off_nccl1405.txt"))
                                          if pf.redirects(x["flags"])]
    ctl = pf.acs_ctl_from_config(acs_config(0x001D))
    assert [k for k, v in pf.acs_flags(ctl).items() if v] == ["SrcValid", "ReqRedir", "CmpltRedir", "UpstreamFwd"]
    facts = {"acs": {"ports": [{"bdf": "0000:00:03.1", "ctl": ctl, "flags": pf.acs_flags(ctl)}]}}
    c = topology.acs_redirect(facts, NINFER)[0]
    assert c.status == "fail" and "ReqRedir+ CmpltRedir+" in c.measured and "pci=noacs" in c.hint
    off = {"acs": {"ports": [{"bdf": "0000:00:03.1", "ctl": 0, "flags": pf.acs_flags(0)}]}}
    assert topology.acs_redirect(off, NINFER)[0].status == "pass"


def test_p29_config_space_unreadable_without_root_is_could_not_check():
    with pytest.raises(ValueError, match="root only"):
        pf.acs_ctl_from_config(bytes(64))  # what a non-root read of sysfs config returns
    assert pf.lspci_acs("00:01.1 PCI bridge: AMD\n\tCapabilities: <access denied>\n")[0]["denied"]
    facts = {"acs": {"ports": [{"bdf": "0000:00:01.1", "error": "readable by root only", "by_hand": "sudo lspci"}]}}
    checks = topology.acs_redirect(facts, NINFER)
    assert [c.status for c in checks] == ["warn"] and checks[0].measured.startswith("could not check")


# ------------------------------------------------------------------------------------- P30, P17

def topo(rel: str) -> dict:
    return {"matrix": {"GPU0": {"GPU0": "X", "GPU1": rel}, "GPU1": {"GPU0": rel, "GPU1": "X"}}}


def test_p30_nccl_default_level_from_ncclparhs():
    assert pf.nccl_level_needed("PHB", "GenuineIntel", 2) == "PHB"
    assert pf.nccl_level_needed("NODE", "GenuineIntel", 2) == "PHB"
    assert pf.nccl_level_needed("SYS", "AuthenticAMD", 2) is None  # AMD with two GPUs: SYS by default
    assert pf.nccl_level_needed("SYS", "AuthenticAMD", 4) == "SYS"
    assert pf.nccl_level_needed("PXB", "GenuineIntel", 2) is None
    assert engine_env.engine_env(LLAMA, engine_env.p2p_level("PHB", "GenuineIntel", 2))["NCCL_P2P_LEVEL"] == "PHB"
    assert "NCCL_P2P_LEVEL" not in engine_env.engine_env(LLAMA, engine_env.p2p_level("NODE", "AuthenticAMD", 2))


def test_p30_installed_env_without_the_level_fails_and_rendered_one_passes():
    base = {"smi_topo_m": topo("PHB"), "iommu": {"cpu_vendor": "GenuineIntel"}}
    bare = {**base, "engine_env_file": {"path": "/etc/p2pkit/engine.env", "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}}
    c = service.nccl_p2p_level(bare, LLAMA)
    assert status(c, "field.nccl_p2p_level") == "fail" and "NCCL_P2P_LEVEL=PHB" in c[0].hint
    rendered = {**base, "engine_env_file": {"env": None}}
    assert status(service.nccl_p2p_level(rendered, LLAMA), "field.nccl_p2p_level") == "pass"


def test_p30_shm_and_p2p_channel_lines_read_as_such():
    assert {pf.transport_kind(t) for t in pf.nccl_transports(fx("nccl_shm_nccl1516.txt").splitlines())} == \
        {"shm", "net"}
    assert pf.nccl_transports(fx("nccl_shm_old_nccl1190.txt").splitlines()) == ["direct shared memory"]
    assert pf.transport_kind("direct shared memory") == "shm"
    assert pf.nccl_transports(fx("nccl_p2p_direct_nccl1817.txt").splitlines()) == ["P2P/direct pointer"]


@pytest.mark.parametrize("env, bad", [({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE=1"),
                                      ({"NCCL_P2P_LEVEL": "PIX"}, "NCCL_P2P_LEVEL=PIX"),
                                      ({"NCCL_P2P_LEVEL": "SYS"}, None)])
def test_p17_engine_env_that_turns_nccl_p2p_off_is_named(env, bad):
    prof = config.load("dual-5090-llamacpp", [f"serve.env.{k}={v}" for k, v in env.items()])
    facts = {"smi_topo_m": topo("NODE"), "iommu": {"cpu_vendor": "AuthenticAMD"}, "engine_env_file": {"env": None}}
    c = next(x for x in service.nccl_p2p_level(facts, prof) if x.id == "field.engine_nccl_p2p")
    assert c.pitfall == "P17"
    assert (c.status == "fail" and bad in c.measured) if bad else c.status == "pass"


def test_p17_llamacpp_service_env_has_ggml_cuda_p2p():
    facts = {"smi_topo_m": topo("NODE"), "iommu": {"cpu_vendor": "AuthenticAMD"}, "engine_env_file": {"env": None}}
    assert status(service.nccl_p2p_level(facts, LLAMA), "field.ggml_cuda_p2p") == "pass"
    stale = {**facts, "engine_env_file": {"path": "/etc/p2pkit/engine.env", "env": {"NCCL_P2P_LEVEL": "SYS"}}}
    assert status(service.nccl_p2p_level(stale, LLAMA), "field.ggml_cuda_p2p") == "fail"


# ------------------------------------------------------------------------------------- P31, P35

def test_p31_bar_lines_in_both_kernel_formats():
    for name in ("dmesg_bar_nospace_rk3588.txt", "dmesg_bar_old_format_kata4211.txt"):
        c = rebar.bar_assignment({"kernel_log": pf.kernel_log(fx(name))}, NINFER)[0]
        assert c.status == "fail" and "BAR 1" in c.measured and "Above 4G" in c.hint, name
    assert rebar.bar_assignment({"kernel_log": pf.kernel_log(fx("dmesg_bar_ok_aikitoria9.txt"))}, NINFER)[0].status == \
        "pass"
    fatal = pf.kernel_log("[    5.1] NVRM: Fatal Error while attempting to resize PCIe BARs.\n")  # nv-pci.c, PR #1109
    assert rebar.bar_assignment({"kernel_log": fatal}, NINFER)[0].status == "fail"


def test_p35_wpr2_line_and_busy_gpu_without_process():
    c = link.wedged({"kernel_log": pf.kernel_log(fx("dmesg_wpr2_ogkm1230.txt")), "nvml": {"gpus": []}}, NINFER)[0]
    assert c.status == "fail" and "WPR2 already up" in c.measured and "reboot" in c.hint
    gpu = {"bus_id": "00000000:01:00.0", "util_gpu_pct": 100, "processes": []}
    quiet = pf.kernel_log("")
    assert link.wedged({"kernel_log": quiet, "nvml": {"gpus": [gpu]}}, NINFER)[0].status == "fail"
    idle = {"gpus": [{**gpu, "util_gpu_pct": 0}]}
    assert link.wedged({"kernel_log": quiet, "nvml": idle}, NINFER)[0].status == "pass"
    # busy with its own process is a GPU at work, not a wedged one
    working = {**gpu, "processes": [{"pid": 4242, "used": 1 << 30}]}
    assert link.wedged({"kernel_log": quiet, "nvml": {"gpus": [working]}}, NINFER)[0].status == "pass"
    # where NVML cannot list processes (NOT_SUPPORTED), "no process" is not claimed
    unlisted = {**gpu, "processes": {"error": "Not Supported"}}
    assert link.wedged({"kernel_log": quiet, "nvml": {"gpus": [unlisted]}}, NINFER)[0].status == "pass"


def test_kernel_lines_each_pitfalls_sources_print_are_read():
    """Issue 47 item 8: the kernel lines the public sources give that the readers missed, each read under its own
    pitfall: WPR2 without the "GPUn" prefix (aikitoria#9, P35), the NVRM probe's "BAR1 is 0M @ 0x0" (gpu-operator
    #492, P31), Intel's IOMMU faults in both formats and their DRHD header (tt-umd#1814, OpenNetworkLinux PR #897,
    P32: the reader asked for "DMAR" twice in a line, so no Intel fault was ever read)."""
    k = pf.kernel_log(fx("dmesg_wpr2_noprefix_aikitoria9.txt"))
    assert len(k["wpr2"]) == 2 and not k["bar_no_space"], k
    c = link.wedged({"kernel_log": k, "nvml": {"gpus": []}}, NINFER)[0]
    assert c.status == "fail" and c.pitfall == "P35" and "_kgspBootGspRm" in c.measured
    k = pf.kernel_log(fx("dmesg_bar1_0m_gpuoperator492.txt"))
    assert k["bar_no_space"] == ["NVRM: BAR1 is 0M @ 0x0 (PCI:0000:14:00.0)"], k
    c = rebar.bar_assignment({"kernel_log": k}, NINFER)[0]
    assert c.status == "fail" and c.pitfall == "P31" and "BAR1 is 0M" in c.measured
    k = pf.kernel_log(fx("dmesg_dmar_no_pasid_ttumd1814.txt"))
    assert len(k["io_page_fault"]) == 2 and "NO_PASID" in k["io_page_fault"][1], k
    old = pf.kernel_log(fx("dmesg_dmar_write_onl897.txt"))["io_page_fault"]  # the pre-5.13 "[DMA Write]" format
    assert len(old) == 4 and old[0].startswith("[10672.868940] DMAR: [DMA Write]"), old
    gpus = [{"bdf": "0000:01:00.0", "iommu_group": "identity"}, {"bdf": "0000:02:00.0", "iommu_group": "identity"}]
    c = topology.iommu_translating({"pci_gpus": gpus, "kernel_log": k}, NINFER)[0]
    assert c.status == "fail" and c.pitfall == "P32" and "DMAR" in c.measured
    # a BAR that was assigned, and an NVRM line that names BAR1 with its size, are no finding
    ok = pf.kernel_log("NVRM: BAR1 is 32768M @ 0x4000000000 (PCI:0000:01:00.0)\n" + fx("dmesg_bar_ok_aikitoria9.txt"))
    assert ok == {"bar_no_space": [], "resize_fatal": [], "wpr2": [], "io_page_fault": []}, ok


def test_dmesg_restrict_is_could_not_check_never_a_pass():
    k = {"error": "dmesg exited 1: dmesg: read kernel buffer failed: Operation not permitted", "by_hand": "sudo dmesg"}
    c = rebar.bar_assignment({"kernel_log": k}, NINFER)[0]
    assert c.status == "warn" and c.measured.startswith("could not check") and "sudo dmesg" in c.hint


# ------------------------------------------------------------------------------------- P37, P16

def test_p37_nccl_mapped_by_the_engine_against_the_floor():
    maps = ("ffff8a000000-ffff8b000000 r-xp 00000000 103:02 3414 /usr/local/lib/python3.12/dist-packages/nvidia/"
            "nccl/lib/libnccl.so.2\n"
            "ffff8c000000-ffff8c200000 rw-s 00000000 00:1a 77 /dev/shm/nccl-Ab12Cd\n")
    assert pf.maps_nccl(maps) == ["/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"]
    assert pf.nccl_version("2.28.9+cuda13.0") == (2, 28, 9)  # the wheel's file carries no version in its name
    e = {"pid": 4242, "libraries": [{"path": pf.maps_nccl(maps)[0], "version": "2.28.9"}]}
    c = service.nccl_floor({"engine_nccl": e}, SPARK)[-1]
    assert c.status == "fail" and c.pitfall == "P37" and c.expected == ">= 2.29.3"
    ok = {"pid": 4242, "libraries": [{"path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.29.3", "version": "2.29.3"}]}
    assert service.nccl_floor({"engine_nccl": ok}, SPARK)[-1].status == "pass"


def test_p16_floor_of_the_llamacpp_profile():
    assert LLAMA.engine.nccl_min == "2.26.2"
    v = pf.nccl_version(fx("nccl_2251_5090_nccl1637.txt"))
    c = service.nccl_floor({"profile_nccl": {"path": "/opt/nccl/lib/libnccl.so.2", "version": ".".join(map(str, v))}},
                      LLAMA)[0]
    assert c.status == "fail" and c.pitfall == "P16" and "2.25.1" in c.measured


# ------------------------------------------------------------------------------------------- P39

def test_p39_built_architectures_include_the_gpus():
    vllm_archs = pf.cuobjdump_archs(fx("cuobjdump_vllm1936.txt"))
    assert vllm_archs == ["sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
    c = engine.kernel_archs({"engine_archs": {"library": "_C.abi3.so", "archs": vllm_archs}}, SPARK)[0]
    assert c.status == "fail" and c.expected == "includes sm_121" and c.pitfall == "P39"
    assert pf.cuobjdump_archs(fx("cuobjdump_sdcpp604.txt")) == ["sm_86"]
    assert not pf.arch_covers(["sm_120a"], "sm_121") and pf.arch_covers(["sm_120", "sm_121a"], "sm_121")
    assert engine.kernel_archs({"engine_archs": {"library": "x", "archs": ["sm_121a"]}}, SPARK)[0].status == "pass"


# ------------------------------------------------------------------------- doctor over the scenarios

SCENARIO_FINDS = {  # scenario: the field finding, its status, and the stage that now owns (and gates on) it
    "field-no-static-bar1": ("field.static_bar1", "fail", "p2p-module"),
    "field-acs-redirect": ("field.acs", "fail", "topology"),
    "field-intel-phb": ("field.nccl_p2p_level", "fail", "service"),
    "field-bar-no-space": ("field.bar_assign", "fail", "rebar"),
    "iommu-translating": ("field.iommu_domain", "fail", "topology"),
    "field-display": ("field.display", "warn", "topology"),
    "stock-driver": ("field.module_sources", "fail", "p2p-module"),
    "field-wedged": ("field.gpu_wedged", "fail", "link"),
    "field-dmesg-restricted": ("field.bar_assign", "warn", "rebar"),
    "field-roce-mtu-1500": ("field.roce.gid.rocep1s0f0:1", "fail", "link"),
    "field-spark-sm120-only": ("field.kernel_archs", "fail", "engine"),
}


def field_checks(cli, root) -> dict:
    """Doctor's field findings by id, each with the stage group it sits in (no "field" group any more)."""
    r = cli("--root", str(root), "--json", "doctor")
    doc = json.loads(r.out)
    assert "field" not in [g["stage"] for g in doc["groups"]]
    return {c["id"]: {**c, "stage": g["stage"]} for g in doc["groups"] for c in g["checks"]
            if c["id"].startswith("field.")}


# the scenarios whose finding reads what a stage made: the engine stage builds a Spark node's vLLM environment
# (its kernels' architectures, P39), so the node is brought up to it first
BUILT_TO = {"spark-head": "engine", "field-spark-sm120-only": "engine"}


def laid_out(cli, sim, scenario: str) -> Path:
    root = sim(scenario)
    if scenario in BUILT_TO:
        cli("--root", str(root), "up", "--reboot", "--to", BUILT_TO[scenario])  # a failed check is what is read
    return root


def test_doctor_names_each_field_fault_on_its_scenario(cli, sim):
    healthy, spark = field_checks(cli, sim("p2p-up")), field_checks(cli, laid_out(cli, sim, "spark-head"))
    for scenario, (id_, want, stage) in SCENARIO_FINDS.items():
        got = field_checks(cli, laid_out(cli, sim, scenario))
        assert got[id_]["status"] == want, (scenario, got[id_])
        assert got[id_]["stage"] == stage, (scenario, got[id_])
        assert got[id_]["pitfall"] and got[id_]["pitfall_text"]
        base = spark if "spark" in scenario or "roce" in scenario else healthy  # without the fault: a pass
        assert base[id_]["status"] == "pass", (id_, base[id_])
    assert "could not check" in field_checks(cli, sim("field-dmesg-restricted", name="r"))["field.gpu_wedged"
                                                                                          ".kernel_log"]["measured"]


# ------------------------------------------------------------------------------------------- P36

def hook(tmp_path, p2pkit_exit: int) -> tuple:
    """The kernel postinst hook as the p2p-module role renders it, against a root in tmp_path."""
    import subprocess

    import jinja2

    root = tmp_path / "root"
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/osrelease").write_text("6.8.0-88-generic\n")
    (root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
    fake = tmp_path / "p2pkit"
    fake.write_text(f"#!/bin/sh\nexit {p2pkit_exit}\n")
    fake.chmod(0o755)
    tpl = (FIXTURES.parent.parent / COLLECTION / "roles/p2pkit_p2p_module/templates/p2pkit-kernel-postinst.j2"
           ).read_text()
    text = jinja2.Template(tpl).render(
        p2pkit_p2p_module_hook_exe=str(fake), p2pkit_p2p_module_hook_command=f"{fake} --yes restore",
        p2pkit_p2p_module_hook_hold=str(root / "etc/default/grub.d/61-p2pkit-boot-default.cfg"),
        p2pkit_p2p_module_hook_osrelease=str(root / "proc/sys/kernel/osrelease"))
    script = tmp_path / "zz-p2pkit"
    script.write_text(text)
    r = subprocess.run(["sh", str(script), "6.14.0-1-generic"], capture_output=True, text=True)
    return root, r


def test_p36_kernel_hook_keeps_the_working_kernel_as_boot_default(tmp_path):
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host

    root, r = hook(tmp_path, 1)
    assert r.returncode == 0 and "boot default stays 6.8.0-88-generic (P36)" in r.stderr
    hold = (root / "etc/default/grub.d/61-p2pkit-boot-default.cfg").read_text()
    assert 'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-88-generic"' in hold
    found = facts.collect(Host(root=root), ["boot_hold"])
    c = p2p_module.boot_default(found, NINFER)[0]
    assert c.status == "warn" and "6.14.0-1-generic" in c.measured and c.pitfall == "P36"
    # modinfo -k NEW finds no module: the hold's reason stands, and its fix is the restore that lifts it
    assert "did not build for 6.14.0-1-generic" in c.measured and "restore --kernel 6.14.0-1-generic" in c.hint
    held = {"held": {**found["boot_hold"]["held"], "module": {
        "modinfo_filename": "/lib/modules/6.14.0-1-generic/kernel/drivers/video/nvidia.ko",
        "modinfo_srcversion": "8E7D0F1A2B3C4D5E6F708192"}}}
    c = p2p_module.boot_default({"boot_hold": held}, NINFER)[0]  # the module there since (a restore by hand)
    assert c.status == "warn" and "whose module is there now" in c.measured and "did not build" not in c.measured
    assert "no longer needed" in c.hint and "restore --kernel 6.14.0-1-generic" in c.hint
    # the build succeeds for that kernel: the hook leaves the hold to the restore it ran (here a stand-in that
    # only exits 0), which lifts it once the module is proven (p2pkit/app/restore.py, lift_hold;
    # tests/test_pending_kernel.py and the container host)
    root, r = hook(tmp_path, 0)
    assert r.returncode == 0 and r.stderr == "" and (root / "etc/default/grub.d/61-p2pkit-boot-default.cfg").exists()


# ------------------------------------------------------------------ P28/P30 end to end: the link stage

@pytest.mark.slow
def test_link_stage_fails_when_nccl_hangs_or_takes_shm_although_topo_says_ok(cli, sim):
    """The one new `up`: a box brought up without the fork's driver parameter (P28) passes topology
    (P2P OK) and fails the link stage's NCCL all-reduce as hung; `verify link` then judges the same
    box with the parameter live on an Intel host whose GPUs meet at the CPU (P30): P2P with the
    rendered NCCL_P2P_LEVEL=PHB, SHM when [serve.env] disables P2P (P17)."""
    from p2pkit.core.artifacts import Store
    from p2pkit.sim import lifecycle
    from p2pkit.sim.render import load_state, render

    root = sim("healthy")
    unset = ("--set", "p2p_module.registry_dwords=", "--set", "link.nccl_timeout_s=8")
    r = cli("--root", str(root), "up", "--to", "link", *unset)
    if r.code == 4:
        lifecycle.reboot(root)
        r = cli("--root", str(root), "up", "--to", "link", *unset)
    assert r.code == 1 and "link failed" in r.err, r.err
    assert Store(root / "var/lib/p2pkit").read("topology")["status"] == "passed"  # topo -p2p r says OK
    checks = {c["id"]: c for c in Store(root / "var/lib/p2pkit").read("link")["checks"]}
    hung = checks["link.nccl_allreduce"]
    assert hung["status"] == "fail" and hung["pitfall"] == "P28" and "NCCL hung" in hung["measured"]
    assert "RMForceStaticBar1=1" in hung["hint"]
    st = load_state(root)
    st["module"]["loaded"]["registry_dwords"] = "RMForceStaticBar1=1"
    st.update(cpu_vendor="GenuineIntel", topo_relation="PHB")
    render(root, st)
    r = cli("--root", str(root), "--json", "verify", "link", *unset)
    nccl = {c["id"]: c for c in r.json()["stages"][0]["checks"]}["link.nccl_allreduce"]
    assert nccl["status"] == "pass" and "NCCL_P2P_LEVEL=PHB" in nccl["measured"], nccl
    r = cli("--root", str(root), "--json", "verify", "link", *unset, "--set", "serve.env.NCCL_P2P_DISABLE=1")
    nccl = {c["id"]: c for c in r.json()["stages"][0]["checks"]}["link.nccl_allreduce"]
    assert nccl["status"] == "fail" and "via SHM/direct/direct" in nccl["measured"] and nccl["pitfall"] == "P17"


def test_p37_nccl_the_running_engine_has_mapped_on_the_simulated_spark(cli, sim):
    """The pip wheel's NCCL (one file, libnccl.so.2, version inside it) mapped by the running engine."""
    import subprocess

    from p2pkit.sim.render import load_state, render

    root = sim("spark-head")
    engine = subprocess.Popen(["sleep", "120"])  # a live process stands in for the engine's main PID
    wheel = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
    st = load_state(root)
    st["services"] = {"p2pkit-engine.service": {"started": True, "pid": engine.pid}}
    st["engine_nccl"] = [wheel]
    st["files"] = {wheel.lstrip("/"): "\x7fELF SIMULATED libnccl NCCL version 2.28.9+cuda13.0\n"}
    render(root, st)
    c = field_checks(cli, root)["field.nccl_floor.engine"]
    assert c["status"] == "fail" and "2.28.9" in c["measured"] and c["pitfall"] == "P37", c
    st["files"] = {wheel.lstrip("/"): "\x7fELF SIMULATED libnccl NCCL version 2.29.3+cuda13.0\n"}
    render(root, st)
    try:
        assert field_checks(cli, root)["field.nccl_floor.engine"]["status"] == "pass"
    finally:
        engine.kill()
        engine.wait()


def test_static_bar1_on_the_real_h200_params_file():
    """P28 over the live /proc/driver/nvidia/params of a real host (tests/fixtures/h200-device/field-run):
    a stock driver with RegistryDwords empty, judged for the pair profile, is named P28."""
    import json

    from p2pkit.core import config
    facts = json.loads((FIXTURES / "h200-device/field-run/facts.json").read_text())["facts"]
    assert facts["driver_params"]["loaded"] and len(facts["driver_params"]["params"]) == 42
    (c,) = p2p_module.static_bar1(facts, config.load(None))
    assert c.status == "fail" and c.pitfall == "P28" and 'RegistryDwords: ""' in c.measured


def test_p38_mtu_floor_is_judged_on_its_own():
    # the GID is fine; only the MTU moves across the floor (4200: NVIDIA's RoCE guideline for active MTU 4096)
    def port(mtu):
        return {"ports": [{"device": "rocep1s0f0", "port": 1, "state": "ACTIVE", "netdevs": ["enp1s0f0np0"],
                           "gids": [{"index": 3, "type": "RoCE v2", "gid": "0000:0000:0000:0000:0000:ffff:c0a8:6401"}],
                           "mtu": {"enp1s0f0np0": mtu}}]}
    by = {m: {c.id: c for c in link.roce({"roce_gids": port(m)}, SPARK)} for m in (1500, 4199, 4200, 9000)}
    assert all(by[m]["field.roce.gid.rocep1s0f0:1"].status == "pass" for m in by)
    assert by[1500]["field.roce.mtu.enp1s0f0np0"].status == "warn" == by[4199]["field.roce.mtu.enp1s0f0np0"].status
    assert by[4200]["field.roce.mtu.enp1s0f0np0"].status == "pass" == by[9000]["field.roce.mtu.enp1s0f0np0"].status


def test_p32_without_the_kernel_log_judges_sysfs_and_says_the_log_could_not_be_read():
    gpus = [{"bdf": "0000:01:00.0", "iommu_group": "identity"}, {"bdf": "0000:41:00.0", "iommu_group": "identity"}]
    dmesg = {"error": "dmesg exited 1: Operation not permitted", "by_hand": "sudo dmesg | grep IO_PAGE_FAULT"}
    c = {x.id: x for x in topology.iommu_translating({"pci_gpus": gpus, "kernel_log": dmesg}, NINFER)}
    assert c["field.iommu_domain"].status == "pass"  # the sysfs half
    assert c["field.iommu_domain.kernel_log"].status == "warn" and c["field.iommu_domain.kernel_log"].pitfall == "P32"
    assert c["field.iommu_domain.kernel_log"].measured.startswith("could not check, because dmesg exited 1")
    quiet = {"pci_gpus": gpus, "kernel_log": pf.kernel_log("")}
    assert [x.id for x in topology.iommu_translating(quiet, NINFER)] == ["field.iommu_domain"]


def test_p36_hold_that_could_not_be_read_is_could_not_check_not_silence():
    (c,) = p2p_module.boot_default({"boot_hold": {"error": "could not determine boot_hold: PermissionError"}}, NINFER)
    assert c.status == "warn" and c.pitfall == "P36" and c.measured.startswith("could not check")
