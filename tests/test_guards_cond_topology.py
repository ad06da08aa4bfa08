"""Condition guards for the topology stage (bench/check_guard.py --conditions --only topology): each condition
of p2pkit.stages.topology.checks judged on the facts where it decides the finding, the check functions
called directly with typed facts (p2pkit.facts.types: PciGpu, Upstream, Nvml, SmiMatrix, RocePort, Acs,
KernelLog, Drm) and the built-in profiles, so a condition replaced by True or by False changes a status, a
measured or expected text or a hint asserted here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.stages.topology import checks as topology

P = config.load(None)  # dual-5090-ninfer: a pair of GPUs, >= Gen5 x8, no PCIe switch allowed, no RoCE
SPARK = config.load("dual-spark-vllm")  # one GPU per host, RoCE on enp1s0f0np0 / enp1s0f1np1
ERR = {"error": "permission denied"}
A, B = "0000:01:00.0", "0000:81:00.0"
ROOT_A = {"bdf": "0000:00:01.1", "port_type": "root port"}
ROOT_B = {"bdf": "0000:80:01.1", "port_type": "root port"}
SW_DOWN = {"bdf": "0000:02:00.0", "port_type": "switch downstream"}
SW_UP = {"bdf": "0000:01:00.0", "port_type": "switch upstream"}
LINK = {"max_gen": 5, "max_width": 16}
PARENT = {"bdf": "0000:00:01.1", "max_gen": 5, "max_width": 16}
OK_MATRIX = {"matrix": {"GPU0": {"GPU0": "X", "GPU1": "OK"}, "GPU1": {"GPU0": "OK", "GPU1": "X"}}}
PORT_UP = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet", "netdevs": ["enp1s0f0np0"]}
PORT_DOWN = {"device": "mlx5_1", "port": 1, "state": "DOWN", "link_layer": "Ethernet", "netdevs": ["enp1s0f1np1"]}
LOG = {"bar_no_space": [], "resize_fatal": [], "wpr2": [], "io_page_fault": []}


def gpu(bdf=A, upstream=(ROOT_A,), **kw) -> dict:
    return {"bdf": bdf, "device_id": "0x2b85", "name": "NVIDIA GeForce RTX 5090", "link": dict(LINK),
            "parent_link": dict(PARENT), "upstream": [dict(u) for u in upstream], "iommu_group": "passthrough", **kw}


def pair_facts(**kw) -> dict:
    f = {"pci_gpus": [gpu(A), gpu(B, (ROOT_B,))], "smi_p2p_read": OK_MATRIX, "smi_p2p_write": OK_MATRIX,
         "smi_topo_m": {**OK_MATRIX, "pair": "SYS"},
         "nvml": {"gpus": [], "p2p": [{"from": 0, "to": 1, "read": "OK", "write": "OK"},
                                      {"from": 1, "to": 0, "read": "OK", "write": "OK"}]}}
    return f | kw


def net(p, **kw):
    return replace(p, network=replace(p.network, **kw))


def by_id(checks) -> dict:
    return {c.id: c for c in checks}


# ------------------------------------------------------------------------------------------ check

def test_topology_one_gpu_profile_counts_the_gpu_and_judges_roce_only_when_required():
    f = {"pci_gpus": [gpu(A)], "roce": [PORT_UP]}
    ids = [c.id for c in topology.check(f, SPARK)]
    assert ids == ["topology.gpu_count", f"topology.capability.{A}", "topology.roce"]
    c = by_id(topology.check(f, SPARK))["topology.gpu_count"]
    assert (c.status, c.value, c.op, c.limit) == ("pass", 1, "==", 1)
    no_roce = net(SPARK, require_roce=False)
    assert [c.id for c in topology.check(f, no_roce)] == ["topology.gpu_count", f"topology.capability.{A}"]


def test_topology_pair_judges_p2p_both_ways_and_roce_only_when_required():
    ids = [c.id for c in topology.check(pair_facts(), P)]
    assert ids == ["topology.gpu_pair",
                   f"topology.root_port.{A}", f"topology.capability.{A}", f"topology.iommu.{A}",
                   f"topology.root_port.{B}", f"topology.capability.{B}", f"topology.iommu.{B}",
                   "topology.p2p_read", "topology.p2p_write", "topology.nvml_p2p", "topology.topo_m"]
    assert all(c.status == "pass" for c in topology.check(pair_facts(), P))
    roce = topology.check(pair_facts(roce=[PORT_UP]), net(P, require_roce=True))
    assert roce[-1].id == "topology.roce" and roce[-1].status == "pass" and len(roce) == len(ids) + 1


def test_topology_one_gpu_of_a_pair_judges_no_p2p_matrix():
    ids = [c.id for c in topology.check(pair_facts(pci_gpus=[gpu(A)]), P)]
    assert ids == ["topology.gpu_pair", f"topology.root_port.{A}", f"topology.capability.{A}", f"topology.iommu.{A}"]


# ------------------------------------------------------------------------------------------- _roce

def test_roce_active_port_on_a_fabric_netdev_is_the_nccl_hca():
    c = topology._roce({"roce": [PORT_UP, PORT_DOWN]}, SPARK)
    assert (c.id, c.status, c.pitfall) == ("topology.roce", "pass", "P24")
    assert c.measured == "NCCL_IB_HCA=mlx5_0:1"
    assert c.expected == "an ACTIVE Ethernet port on enp1s0f0np0, enp1s0f1np1"


def test_roce_no_active_port_shows_each_port_seen():
    c = topology._roce({"roce": [PORT_DOWN, {**PORT_DOWN, "device": "mlx5_2", "netdevs": []}]}, SPARK)
    assert (c.status, c.pitfall) == ("fail", "P24")
    assert c.measured == "mlx5_1:1 DOWN Ethernet (enp1s0f1np1), mlx5_2:1 DOWN Ethernet (-)"
    assert "ip link set <netdev> up" in c.hint


def test_roce_without_fabric_netdevs_takes_any_netdev():
    c = topology._roce({"roce": [PORT_UP]}, net(SPARK, fabric_netdevs=[]))
    assert (c.status, c.measured, c.expected) == ("pass", "NCCL_IB_HCA=mlx5_0:1", "an ACTIVE Ethernet port on any "
                                                                                   "netdev")


@pytest.mark.parametrize("found, why", [
    (None, "not read"),  # a facts file recorded before the fact existed
    ({"error": "no /sys/class/infiniband"}, "no /sys/class/infiniband"),
])
def test_roce_unread_fact_is_could_not_determine(found, why):
    c = topology._roce({"roce": found}, SPARK)
    assert (c.id, c.status, c.pitfall, c.measured) == ("topology.roce", "fail", "P24", f"could not determine: {why}")


# -------------------------------------------------------------------------------------- _root_port

@pytest.mark.parametrize("upstream, allow_switch, status, measured", [
    ([ROOT_A], False, "pass", "0000:00:01.1 (root port)"),
    ([SW_DOWN, SW_UP, ROOT_A], False, "fail",
     "0000:02:00.0 (switch downstream) > 0000:01:00.0 (switch upstream) > 0000:00:01.1 (root port)"),
    ([SW_DOWN, SW_UP, ROOT_A], True, "warn",
     "0000:02:00.0 (switch downstream) > 0000:01:00.0 (switch upstream) > 0000:00:01.1 (root port)"),
    ([{"bdf": "0000:00:01.1", "port_type": None}], False, "warn", "0000:00:01.1 (type unknown)"),
    ([{"bdf": "0000:00:01.1", "port_type": "downstream port"}], False, "fail", "0000:00:01.1 (downstream port)"),
    ([{"bdf": "0000:02:00.0", "port_type": "pci bridge"}, ROOT_A], False, "fail",
     "0000:02:00.0 (pci bridge) > 0000:00:01.1 (root port)"),
])
def test_root_port_judges_the_chain_above_the_gpu(upstream, allow_switch, status, measured):
    p = replace(P, pcie=replace(P.pcie, allow_switch=allow_switch))
    c = topology._root_port(gpu(A, upstream), p)
    assert (c.id, c.status, c.measured, c.expected) == (f"topology.root_port.{A}", status, measured, "root port")
    if "switch" in measured:
        assert c.hint.startswith("a PCIe switch (PLX) sits between this GPU and the CPU")
    elif "type unknown" in measured:
        assert c.hint == "could not read the port type from config space (run as root)"
    elif status == "fail":
        assert c.hint == "the GPU is not directly on a root port: use a CPU-attached slot"


def test_root_port_no_bridge_above_is_a_vm_warning():
    c = topology._root_port(gpu(A, []), P)
    assert (c.status, c.expected) == ("warn", "root port") and c.measured.startswith("on the root bus")


# ------------------------------------------------------------------------------------- _capability

@pytest.mark.parametrize("link, parent, status, measured", [
    ({"max_gen": 5, "max_width": 16}, {"max_gen": 5, "max_width": 8}, "pass", "Gen5 x8"),
    ({"max_gen": 5, "max_width": 16}, {"max_gen": 4, "max_width": 16}, "fail", "Gen4 x16"),  # a Gen4 slot
    ({"max_gen": 5, "max_width": 16}, {"max_gen": 5, "max_width": 4}, "fail", "Gen5 x4"),  # an x4 slot
])
def test_capability_the_weaker_of_gpu_and_slot_against_the_profile(link, parent, status, measured):
    c = topology._capability(gpu(A, link=link, parent_link=parent), P)
    assert (c.id, c.status, c.measured, c.expected) == (f"topology.capability.{A}", status, measured, ">= Gen5 x8")


@pytest.mark.parametrize("link, errors, hint", [
    ({}, [], "check /sys/bus/pci/devices/<bdf>/max_link_*"),
    ({"max_gen": 5}, ["max_link_width: permission denied"], "max_link_width: permission denied"),
    ({"max_width": 16}, ["max_link_speed: no such file", "current_link_speed: no such file"],
     "max_link_speed: no such file; current_link_speed: no such file"),
])
def test_capability_without_both_link_files_could_not_determine(link, errors, hint):
    c = topology._capability(gpu(A, link=link, parent_link={}, errors=errors), P)
    assert (c.status, c.measured, c.hint) == ("fail", "could not determine: no link files in sysfs", hint)


# ------------------------------------------------------------------------------------ _smi, _topo_m

def test_smi_unread_matrix_is_could_not_determine():
    c = topology._smi({"smi_p2p_read": {"error": "nvidia-smi: not found"}}, "read", "smi_p2p_read")
    assert (c.id, c.status, c.measured) == ("topology.p2p_read", "fail", "could not determine: nvidia-smi: not found")


@pytest.mark.parametrize("fact, why", [
    (None, "not collected"),
    ({"error": "nvidia-smi topo -m timed out"}, "nvidia-smi topo -m timed out"),
    ({"matrix": {}, "pair_error": "fewer than two GPUs in the matrix"}, "fewer than two GPUs in the matrix"),
])
def test_topo_m_unread_is_a_skip_saying_why(fact, why):
    c = topology._topo_m(fact, [gpu(A), gpu(B, (ROOT_B,))])
    assert (c.id, c.status, c.measured) == ("topology.topo_m", "skip", f"could not determine: {why}")


def test_topo_m_sys_on_root_ports_agrees():
    c = topology._topo_m({"pair": "SYS"}, [gpu(A), gpu(B, (ROOT_B,))])
    assert c.status == "pass"
    assert c.measured.endswith("; sysfs: each GPU on a CPU root port") and c.measured.startswith("SYS (")


def test_topo_m_phb_with_a_switch_in_sysfs_disagrees():
    c = topology._topo_m({"pair": "PHB"}, [gpu(A, (SW_DOWN, SW_UP, ROOT_A)), gpu(B, (ROOT_B,))])
    assert c.status == "warn"
    assert c.measured.endswith("; sysfs: a PCIe switch (0000:02:00.0, 0000:01:00.0)")


def test_topo_m_a_gpu_with_no_bridge_above_is_a_vm_warning():
    c = topology._topo_m({"pair": "SYS"}, [gpu(A, []), gpu(B, (ROOT_B,))])
    assert (c.status, c.expected) == ("warn", "agreement")
    assert c.measured.endswith("; sysfs shows no bridge above a GPU")


def test_topo_m_nvlink_pair_is_not_a_pcie_path():
    c = topology._topo_m({"pair": "NV4"}, [gpu(A), gpu(B, (ROOT_B,))])
    assert (c.status, c.expected) == ("warn", "a PCIe path")
    assert c.measured.endswith("; sysfs: each GPU on a CPU root port") and "NVLink" in c.hint


# ------------------------------------------------------------------------------------------ _nvml_p2p

def test_nvml_p2p_unread_is_could_not_determine():
    c = topology._nvml_p2p({"nvml": {"error": "NVML Shared Library Not Found"}})
    assert (c.id, c.status, c.measured) == ("topology.nvml_p2p", "fail",
                                            "could not determine: NVML Shared Library Not Found")


@pytest.mark.parametrize("read, write, measured, hint", [
    ("CNS", "OK", "0->1 read CNS write OK", "CNS: " + topology.P2P_CAUSES["CNS"]),
    ("OK", "TNS", "0->1 read OK write TNS", "TNS: " + topology.P2P_CAUSES["TNS"]),
    ({"error": "Not Supported"}, "OK", "0->1 read {'error': 'Not Supported'} write OK", ""),
])
def test_nvml_p2p_a_direction_not_ok_fails_naming_its_code(read, write, measured, hint):
    nv = {"p2p": [{"from": 0, "to": 1, "read": read, "write": write},
                  {"from": 1, "to": 0, "read": "OK", "write": "OK"}]}
    c = topology._nvml_p2p({"nvml": nv})
    assert (c.id, c.status, c.pitfall, c.measured, c.hint) == ("topology.nvml_p2p", "fail", "P17", measured, hint)


# ------------------------------------------------------------------------------------------ acs_redirect

def acs_port(bdf, **flags):
    return {"bdf": bdf, "gpu": A, "ctl": 0, "flags": {"ReqRedir": False, "CmpltRedir": False, **flags}}


def test_acs_redirect_judged_only_for_a_pair():
    f = {"acs": {"ports": [acs_port("0000:00:01.1", ReqRedir=True)]}}
    assert topology.acs_redirect(f, SPARK) == []
    assert topology.acs_redirect({}, SPARK) == []
    (c,) = topology.acs_redirect(f, P)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.acs", "fail", "0000:00:01.1 ReqRedir+", "P29")


def test_acs_redirect_clean_bridges_are_named():
    f = {"acs": {"ports": [acs_port("0000:00:01.1"), acs_port("0000:80:01.1")]}}
    (c,) = topology.acs_redirect(f, P)
    assert (c.id, c.status, c.measured) == ("field.acs", "pass", "no redirect on 0000:00:01.1, 0000:80:01.1")


def test_acs_redirect_unreadable_fact_could_not_check():
    (c,) = topology.acs_redirect({"acs": ERR}, P)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.acs", "warn", "could not check, because permission "
                                                                           "denied", "P29")


def test_acs_redirect_an_unread_bridge_is_its_own_warning():
    unread = {"bdf": "0000:80:01.1", "gpu": B, "error": "config space needs root", "by_hand": "sudo lspci -vvv"}
    c = topology.acs_redirect({"acs": {"ports": [acs_port("0000:00:01.1"), unread]}}, P)
    assert [(x.id, x.status) for x in c] == [("field.acs.unread", "warn"), ("field.acs", "pass")]
    assert c[0].measured == "could not check, because config space needs root"
    assert c[1].measured == "no redirect on 0000:00:01.1"
    # every bridge unread: only that warning, not a "no bridge found" one besides
    (only,) = topology.acs_redirect({"acs": {"ports": [unread]}}, P)
    assert (only.id, only.status) == ("field.acs.unread", "warn")


def test_acs_redirect_no_bridge_found():
    (c,) = topology.acs_redirect({"acs": {"ports": []}}, P)
    assert (c.id, c.status) == ("field.acs", "warn")
    assert c.measured == "could not check, because no bridge above the GPUs was found in sysfs"


# -------------------------------------------------------------------------------------- iommu_translating

def test_iommu_translating_judged_only_for_a_pair():
    f = {"pci_gpus": [gpu(A, iommu_group="translating")], "kernel_log": LOG}
    assert topology.iommu_translating(f, SPARK) == []


@pytest.mark.parametrize("groups, faults, status, measured", [
    (["passthrough", "passthrough"], [], "pass", "passthrough (identity) or no IOMMU group on every GPU"),
    (["translating", "passthrough"], [], "fail", f"{A} (translating)"),
    (["passthrough", "none"], ["AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000d address=0x0]"] * 3, "fail",
     "AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000d address=0x0]; "
     "AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000d address=0x0]"),
    (["translating", "passthrough"], ["DMAR: [DMA Read] fault"], "fail", f"{A} (translating); DMAR: [DMA Read] fault"),
])
def test_iommu_translating_a_translating_domain_or_a_page_fault_fails(groups, faults, status, measured):
    f = {"pci_gpus": [gpu(A, iommu_group=groups[0]), gpu(B, (ROOT_B,), iommu_group=groups[1])],
         "kernel_log": {**LOG, "io_page_fault": faults}}
    (c,) = topology.iommu_translating(f, P)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.iommu_domain", status, measured, "P32")


def test_iommu_translating_unread_gpus_judge_the_kernel_log_alone():
    (c,) = topology.iommu_translating({"pci_gpus": ERR, "kernel_log": LOG}, P)
    assert (c.id, c.status, c.measured) == ("field.iommu_domain", "pass",
                                            "passthrough (identity) or no IOMMU group on every GPU")


# ------------------------------------------------------------------------------------------------ displays

def connector(bdf, status="connected", name="DP-1", card="card1"):
    return {"connector": name, "card": card, "status": status, "bdf": bdf}


def test_displays_judged_only_for_a_pair():
    f = {"drm": {"connectors": [connector(A)]}, "pci_gpus": [gpu(A)]}
    assert topology.displays(f, SPARK) == []
    assert topology.displays({"drm": ERR}, SPARK) == []


def test_displays_unreadable_drm_could_not_check():
    (c,) = topology.displays({"drm": ERR, "pci_gpus": [gpu(A), gpu(B)]}, P)
    assert (c.id, c.status, c.measured, c.pitfall) == ("field.display", "warn", "could not check, because "
                                                                               "permission denied", "P33")


def test_displays_a_connected_display_on_a_gpu_of_the_pair_warns():
    drm = {"connectors": [connector(A), connector(A, "disconnected", "HDMI-A-1"),
                          connector(B, name="DP-2", card="card2"),
                          connector("0000:00:02.0", card="card0", name="eDP-1")]}  # the iGPU's screen
    (c,) = topology.displays({"drm": drm, "pci_gpus": [gpu(A), gpu(B, (ROOT_B,))]}, P)
    assert (c.id, c.status, c.pitfall) == ("field.display", "warn", "P33")
    assert c.measured == f"card1-DP-1 on {A}; card2-DP-2 on {B}"


@pytest.mark.parametrize("drm, gpus", [
    ({"connectors": [connector(A, "disconnected"), connector("0000:00:02.0", card="card0", name="eDP-1")]},
     [gpu(A), gpu(B, (ROOT_B,))]),
    ({"connectors": [connector(A)]}, ERR),  # no GPU read from sysfs: no display is on one of them
])
def test_displays_none_on_the_pair_is_headless(drm, gpus):
    (c,) = topology.displays({"drm": drm, "pci_gpus": gpus}, P)
    assert (c.id, c.status, c.measured, c.hint) == ("field.display", "pass", "no connected display on the GPUs", "")
