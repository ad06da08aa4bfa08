"""Condition-level guards for the link stage's checks (bench/check_guard.py --conditions --only link): each
test gives a check function the facts where one of its conditions decides the outcome, and asserts the
finding's status, id, pitfall and measured value or text, so replacing that condition by True or False
fails a test."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.rules.findings import FAIL, PASS, SKIP, WARN
from p2pkit.stages.link import checks as link

P = config.load(None)  # two RTX 5090s, Gen5 x8, no RoCE
ONE = replace(P, gpus=replace(P.gpus, count=1))  # one GPU per host, no RoCE required
SPARK = config.load("dual-spark-vllm")  # one GPU per node, RoCE on enp1s0f0np0/enp1s0f1np1 at >= 200 Gb/s


def by_id(checks):
    return {c.id: c for c in checks}


# ------------------------------------------------------------------------------------ locked_clocks

def nvml_gpu(index=0, **kw):
    return {"index": index, "bus_id": f"00000000:0{index + 1}:00.0", "clock_event_reasons": 0,
            "locked_clocks": {"applications_clocks_setting": False}, **kw}


def test_locked_clocks_without_nvml_says_nothing():
    assert link.locked_clocks(None) == []


@pytest.mark.parametrize("nv, why", [
    ({"error": "NVML not loaded"}, "NVML not loaded"),
    ({"driver_version": "615.71.09"}, "None"),  # read, but no GPU list: nothing to judge
])
def test_locked_clocks_unreadable_nvml_is_one_skip(nv, why):
    (c,) = link.locked_clocks(nv)
    assert (c.id, c.status, c.pitfall) == ("link.clocks_locked", SKIP, "P04")
    assert c.measured == f"could not determine: {why}"


def test_locked_clocks_judged_per_gpu():
    nv = {"gpus": [nvml_gpu(0, clock_event_reasons=0),
                   nvml_gpu(1, clock_event_reasons=4, locked_clocks={"applications_clocks_setting": True})]}
    c = by_id(link.locked_clocks(nv))
    assert set(c) == {"link.clocks_locked.gpu0", "link.clocks_locked.gpu1"}
    free, locked = c["link.clocks_locked.gpu0"], c["link.clocks_locked.gpu1"]
    assert (free.status, free.pitfall, free.measured, free.hint) == (PASS, "P04", "free (reasons 0)", "")
    assert (locked.status, locked.pitfall) == (FAIL, "P04")
    assert locked.measured == "applications clocks setting limits the clocks (reasons 4)"
    assert "nvidia-smi -rgc" in locked.hint


@pytest.mark.parametrize("lc, why", [
    (None, "NVML gave no clock event reasons"),  # NVML answered nothing for this GPU
    ("Not Supported", "NVML gave no clock event reasons"),
    ({}, "None"),  # a dict without the reason: it names no error either
    ({"error": "Not Supported"}, "Not Supported"),  # NVML's own error is shown
])
def test_locked_clocks_gpu_without_the_reason_is_a_skip_not_a_pass(lc, why):
    nv = {"gpus": [nvml_gpu(0, locked_clocks=lc), nvml_gpu(1)]}
    c = by_id(link.locked_clocks(nv))
    assert (c["link.clocks_locked.gpu0"].status, c["link.clocks_locked.gpu0"].pitfall) == (SKIP, "P04")
    assert c["link.clocks_locked.gpu0"].measured == f"could not determine: {why}"
    assert c["link.clocks_locked.gpu1"].status == PASS  # the next GPU is still judged


# ------------------------------------------------------------------------------------------- check

def load_gpu(index, gen=5, width=16, **kw):
    return {"index": index, "max_seen": {"gen": gen, "width": width}, "idle": {"gen": 1, "width": width},
            "trained_after_s": 0.04, "replay_before": 0, "replay_after": 0, "app_clocks_reason_under_load": False,
            "host": {"h2d_gbps": 54.6, "d2h_gbps": 55.1}, **kw}


def load_pair(**kw):
    return {"from": 0, "to": 1, "peer_access": True, "unidir_gbps": 55.0, "staged_gbps": 20.0, "bidir_gbps": 100.0,
            "latency_us": 0.4, "integrity": {"equal": True, "mismatches": 0, "elements": 1 << 20, "zeros": 0}, **kw}


def load(gpus=None, pairs=None, device_count=2):
    return {"link_load": {"gpus": gpus if gpus is not None else [load_gpu(0), load_gpu(1)],
                          "device_count": device_count, "pairs": pairs if pairs is not None else [load_pair()],
                          "load_seconds": 5.0}}


def test_doctor_without_load_skips_link_load_and_still_judges_locked_clocks():
    c = link.check({"nvml": {"gpus": [nvml_gpu(0)]}}, P)
    assert [x.id for x in c] == ["link.load", "link.clocks_locked.gpu0"]
    assert (c[0].status, c[0].pitfall) == (SKIP, "P03") and c[0].measured.startswith("not measured here")


@pytest.mark.parametrize("r, why", [(None, "no result"), ({"error": "torch not importable"}, "torch not importable")])
def test_a_load_run_that_gave_nothing_is_a_failure(r, why):
    (c,) = link.check({"link_load": r}, P)
    assert (c.id, c.status) == ("link.load", FAIL) and c.measured == f"could not determine: {why}"


@pytest.mark.parametrize("profile, status, hint", [(P, FAIL, "P2P over BAR1 needs a PCIe link NVML can read"),
                                                   (ONE, SKIP, "")])
def test_a_gpu_nvml_reports_no_link_for(profile, status, hint):
    f = load(gpus=[load_gpu(0), load_gpu(1, gen=None, width=None)])
    c = by_id(link.check(f, profile))
    t = c["link.trained.gpu1"]
    assert (t.status, t.pitfall, t.measured) == (status, "P03", "NVML reports no PCIe link for this GPU")
    assert t.hint.startswith(hint) and bool(t.hint) == bool(hint)
    assert t.expected == f">= Gen{profile.pcie.min_gen} x{profile.pcie.min_width}"
    # nothing else is judged for it: no replay, clock or bandwidth finding
    assert not [k for k in c if k.endswith(".gpu1") and k != "link.trained.gpu1"]
    assert c["link.trained.gpu0"].status == PASS


def test_p2p_bandwidth_against_the_profile_ceiling_when_a_gpu_has_no_link():
    # GPU1's link is unreadable: the pair's ceiling is the profile's Gen5 x8 (31.5 GB/s), not GPU0's x16
    f = load(gpus=[load_gpu(0), load_gpu(1, gen=None, width=None)], pairs=[load_pair(unidir_gbps=30.0)])
    bw = by_id(link.check(f, P))["link.p2p_bw.gpu0-gpu1"]
    ceil = link.ceiling_gbps(5, 8)
    assert (bw.status, bw.value) == (PASS, round(30.0 / ceil, 4))
    assert bw.measured.endswith(f"(30.0 GB/s of {ceil:.1f} GB/s; host-staged 20.0, x1.5; both ways 100.0)")


def test_p2p_bandwidth_against_the_pair_links_own_ceiling():
    # both GPUs trained Gen5 x16 (63.0 GB/s): 40 GB/s is 0.63 of it (a fail), though above Gen5 x8's 31.5
    bw = by_id(link.check(load(pairs=[load_pair(unidir_gbps=40.0)]), P))["link.p2p_bw.gpu0-gpu1"]
    ceil = link.ceiling_gbps(5, 16)
    assert (bw.status, bw.value, bw.pitfall) == (FAIL, round(40.0 / ceil, 4), "P17")
    assert f"40.0 GB/s of {ceil:.1f} GB/s" in bw.measured


@pytest.mark.parametrize("t, context", [
    (0.04, "to Gen5 x16; idle Gen1 x16"),
    (None, "best Gen5 x16 in 5.0 s of load; idle Gen1 x16"),
])
def test_trained_context_names_when_or_the_best_reached(t, context):
    c = by_id(link.check(load(gpus=[load_gpu(0, trained_after_s=t), load_gpu(1)]), P))["link.trained.gpu0"]
    assert c.status == (PASS if t is not None else FAIL) and c.pitfall == "P03"
    assert c.measured.endswith(f"({context})")


@pytest.mark.parametrize("before, after, rise, status", [(2, 7, 5, FAIL), (3, 3, 0, PASS), (None, 4, None, WARN),
                                                         (4, None, None, WARN), (None, None, None, WARN)])
def test_replay_rise_is_judged_only_from_two_readings(before, after, rise, status):
    """A counter read before and after the load: its rise is judged. One NVML did not give (before or
    after) is no rise of 0 (an after-only reading of 4 is not 4 replays, a before-only one is not
    minus 4): a warning that says it was not read."""
    g = load_gpu(0, replay_before=before, replay_after=after)
    c = by_id(link.check(load(gpus=[g, load_gpu(1)]), P))["link.replays.gpu0"]
    assert (c.value, c.status) == (rise, status)
    assert c.measured == (f"{rise} (replays under load: {before} -> {after})" if rise is not None else
                          f"not read (replays under load: {before} -> {after})")
    assert ("NVML gave no PCIe replay counter" in c.hint) == (status == WARN)


@pytest.mark.parametrize("on, status, text", [(True, WARN, "applications/locked clocks limit active"),
                                              (False, PASS, "free")])
def test_clocks_under_load(on, status, text):
    c = by_id(link.check(load(gpus=[load_gpu(0, app_clocks_reason_under_load=on), load_gpu(1)]), P))
    assert (c["link.clocks.gpu0"].status, c["link.clocks.gpu0"].measured, c["link.clocks.gpu0"].pitfall) == \
        (status, text, "P04")


def test_host_bandwidth_ratio_of_the_trained_link():
    c = by_id(link.check(load(), P))
    ceil = link.ceiling_gbps(5, 16)
    assert (c["link.h2d.gpu0"].status, c["link.h2d.gpu0"].value) == (PASS, round(54.6 / ceil, 4))
    assert c["link.d2h.gpu0"].measured.endswith(f"(55.1 GB/s of Gen5 x16's {ceil:.1f} GB/s)")


def test_a_link_reported_as_gen0_gets_no_bandwidth_ratio():
    # a Gen0 link has no ceiling to divide by: trained is judged, host bandwidth is not
    f = load(gpus=[load_gpu(0, gen=0, trained_after_s=None), load_gpu(1)])
    c = by_id(link.check(f, P))
    assert c["link.trained.gpu0"].status == FAIL
    assert "link.h2d.gpu0" not in c and "link.d2h.gpu0" not in c and "link.h2d.gpu1" in c
    bw = c["link.p2p_bw.gpu0-gpu1"]  # the pair falls back to the profile's Gen5 x8 ceiling
    assert bw.value == round(55.0 / link.ceiling_gbps(5, 8), 4)


def test_one_gpu_per_host_judges_no_pair_but_the_fabric():
    f = load(gpus=[load_gpu(0)], pairs=[], device_count=1)
    ids = [x.id for x in link.check(f, ONE)]
    assert "link.p2p_pair" not in ids and "link.nccl_allreduce" not in ids and "link.trained.gpu0" in ids
    c = by_id(link.check(f, SPARK))  # the one-GPU node's peer is over RoCE: its ports are judged instead
    assert "link.p2p_pair" not in c and c["link.fabric"].status == FAIL and c["link.fabric"].pitfall == "P24"
    two = by_id(link.check(load(), P))
    assert (two["link.p2p_pair"].status, two["link.p2p_pair"].value) == (PASS, 2)
    assert two["link.nccl_allreduce"].status == SKIP


@pytest.mark.parametrize("integrity, differ", [
    ({"equal": False, "mismatches": 0, "elements": 100, "zeros": 0}, 1),  # unequal with no count is never 0
    ({"equal": False, "mismatches": 7, "elements": 100, "zeros": 7}, 7),
    ({"equal": True, "mismatches": 0, "elements": 100, "zeros": 0}, 0),
])
def test_p2p_integrity_counts_an_unequal_copy_as_a_difference(integrity, differ):
    c = by_id(link.check(load(pairs=[load_pair(integrity=integrity)]), P))["link.p2p_integrity.gpu0-gpu1"]
    assert (c.status, c.value, c.pitfall) == (PASS if differ == 0 else FAIL, differ, "P17")
    assert c.measured.endswith(f"(int32 of 100 differ; {integrity['zeros']} zero)")


# ---------------------------------------------------------------------------------- nccl_allreduce

def nccl(**kw):
    return {"nccl_allreduce": {"env": {"NCCL_P2P_LEVEL": "SYS"}, "tail": ["init done", "allreduce ok"],
                               "timed_out": False, "timeout_s": 120, "exit": 0, "transports": ["P2P/CUMEM/read"],
                               "result": {"elements": 1048576, "wrong": [0, 0], "seconds": 0.25,
                                          "nccl_version": "2.27.3"}, **kw}}


def test_nccl_not_run_or_unreadable():
    (c,) = link.nccl_allreduce({}, P)
    assert (c.status, c.pitfall) == (SKIP, "P28") and c.measured.startswith("not measured here")
    (c,) = link.nccl_allreduce({"nccl_allreduce": {"error": "no torch"}}, P)
    assert (c.status, c.pitfall, c.measured) == (FAIL, "P28", "could not determine: no torch")


def test_nccl_exact_over_p2p_passes():
    (c,) = link.nccl_allreduce(nccl(), P)
    assert (c.id, c.status, c.pitfall, c.value, c.unit) == ("link.nccl_allreduce", PASS, "P28", 0.25, "s")
    assert c.measured == ("via P2P/CUMEM/read: 1048576 floats exact on both GPUs, NCCL 2.27.3, 0.25 s "
                          "(NCCL_P2P_LEVEL=SYS)")


@pytest.mark.parametrize("env, tail, shown_env, last", [
    ({"NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "INFO"}, ["init", "ring 0"], "NCCL_P2P_LEVEL=SYS, NCCL_DEBUG=INFO",
     "ring 0"),
    ({}, [], "no NCCL variables", "no output"),
])
def test_nccl_hang_names_the_last_line_and_the_environment(env, tail, shown_env, last):
    (c,) = link.nccl_allreduce(nccl(env=env, tail=tail, timed_out=True, timeout_s=60, result=None), P)
    assert (c.status, c.pitfall, c.value) == (FAIL, "P28", 60)
    assert c.measured == f"no result within 60.00 s: NCCL hung (last line: {last}; {shown_env})"


@pytest.mark.parametrize("result, text", [
    (None, "exit 1: allreduce ok"),  # no result: the last line says why
    ({}, "exit 1: allreduce ok"),
    ({"error": "unhandled cuda error"}, "exit 1: unhandled cuda error"),
    ({"error": ""}, "exit 1: allreduce ok"),
])
def test_nccl_without_a_result_fails_with_its_error(result, text):
    (c,) = link.nccl_allreduce(nccl(result=result, exit=1), P)
    assert (c.status, c.pitfall, c.measured) == (FAIL, "P28", text)


@pytest.mark.parametrize("transports, env, pitfall, why", [
    (["SHM/direct/direct"], {}, "P30", "NCCL's default P2P level stops short"),
    ([], {}, "P30", "NCCL's default P2P level stops short"),
    (["P2P/CUMEM/read", "NET/Socket"], {}, "P30", "NCCL's default P2P level stops short"),
    (["SHM/direct/direct"], {"NCCL_P2P_DISABLE": "1"}, "P17", "the engine's environment says NCCL_P2P_DISABLE=1"),
])
def test_nccl_not_over_p2p_fails_naming_the_blocker(transports, env, pitfall, why):
    (c,) = link.nccl_allreduce(nccl(transports=transports, env=env), P)
    via = ", ".join(transports) or "no channel line"
    shown = ", ".join(f"{k}={v}" for k, v in env.items()) or "no NCCL variables"
    assert (c.status, c.pitfall, c.measured) == (FAIL, pitfall, f"via {via} ({shown})")
    assert c.hint.startswith("NCCL did not take P2P: " + why)


def test_nccl_wrong_floats_fail_with_the_most_wrong():
    res = {"elements": 1024, "wrong": [0, 3], "seconds": 0.2, "nccl_version": "2.27.3"}
    (c,) = link.nccl_allreduce(nccl(result=res), P)
    assert (c.status, c.pitfall, c.value) == (FAIL, "P32", 3)
    assert c.measured == "via P2P/CUMEM/read: 3 of 1024 floats wrong on a GPU (per GPU: [0, 3])"


# ------------------------------------------------------------------------------------------ fabric

def roce_port(**kw):
    return {"device": "rocep1s0f0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
            "netdevs": ["enp1s0f0np0"], "rate": "200 Gb/sec (2X NDR)", "rate_gbps": 200.0, **kw}


def test_fabric_not_required_is_not_judged():
    assert link.fabric({"roce": [roce_port(rate_gbps=10.0)]}, P) == []


@pytest.mark.parametrize("found, why", [(None, "not read"), ({"error": "ibv_devinfo missing"}, "ibv_devinfo missing")])
def test_fabric_unreadable(found, why):
    (c,) = link.fabric({"roce": found}, SPARK)
    assert (c.id, c.status, c.pitfall, c.measured) == ("link.fabric", FAIL, "P24", f"could not determine: {why}")


@pytest.mark.parametrize("netdevs, named", [(["enp1s0f0np0", "enp1s0f1np1"], "enp1s0f0np0, enp1s0f1np1"),
                                            ([], "any netdev")])
def test_fabric_without_an_active_port_names_the_netdevs(netdevs, named):
    p = replace(SPARK, network=replace(SPARK.network, fabric_netdevs=netdevs))
    (c,) = link.fabric({"roce": [roce_port(state="DOWN")]}, p)
    assert (c.id, c.status, c.pitfall) == ("link.fabric", FAIL, "P24")
    assert c.measured == f"no ACTIVE Ethernet port on {named}"


@pytest.mark.parametrize("port, status, measured", [
    (roce_port(), PASS, "200 Gb/s (200 Gb/sec (2X NDR))"),
    (roce_port(rate="100 Gb/sec (2X HDR)", rate_gbps=100.0), FAIL, "100 Gb/s (100 Gb/sec (2X HDR))"),
    (roce_port(rate="", rate_gbps=None), FAIL, "unknown (the kernel reports no rate)"),
])
def test_fabric_rate_of_each_port(port, status, measured):
    (c,) = link.fabric({"roce": [port]}, SPARK)
    assert (c.id, c.status, c.measured) == ("link.fabric_rate.rocep1s0f0:1", status, measured)


# ------------------------------------------------------------------------------------------ wedged

QUIET = {"bar_no_space": [], "resize_fatal": [], "wpr2": [], "io_page_fault": []}
WPR2 = "[  12.3] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x62:0x65:1870) WPR2 already up"


def smi_gpu(bus, util, processes=()):
    return {"bus_id": bus, "util_gpu_pct": util, "processes": list(processes)}


def wedged(nvml, kernel_log):
    return link.wedged({"nvml": nvml, "kernel_log": kernel_log}, P)


@pytest.mark.parametrize("util, busy", [(90, True), (89, False), (None, False), ({"error": "Not Supported"}, False)])
def test_wedged_busy_from_ninety_percent_with_a_number(util, busy):
    (c,) = wedged({"gpus": [smi_gpu("00000000:01:00.0", util)]}, QUIET)
    assert (c.id, c.status, c.pitfall) == ("field.gpu_wedged", FAIL if busy else PASS, "P35")
    if busy:
        assert (c.value, c.measured) == (90, "00000000:01:00.0 90% busy, no process")
    else:
        assert (c.value, c.measured) == (None, "no busy GPU without a process, no WPR2 line")


@pytest.mark.parametrize("processes, wedged_", [([], True), ([{"pid": 7, "used": 1 << 30}], False),
                                                ({"error": "Not Supported"}, False)])
def test_wedged_only_with_an_empty_process_list(processes, wedged_):
    g = {"bus_id": "00000000:01:00.0", "util_gpu_pct": 100, "processes": processes}
    (c,) = wedged({"gpus": [g]}, QUIET)
    assert c.status == (FAIL if wedged_ else PASS) and c.value == (100 if wedged_ else None)


def test_wedged_names_every_busy_gpu_and_the_busiest_as_the_figure():
    nv = {"gpus": [smi_gpu("00000000:01:00.0", 95), smi_gpu("00000000:41:00.0", 100), smi_gpu("00000000:81:00.0", 3)]}
    (c,) = wedged(nv, {**QUIET, "wpr2": [WPR2, "second {} line", "third"]})
    assert (c.status, c.value, c.unit) == (FAIL, 100, "%")
    # the busiest GPU's figure goes first into the text; a kernel line's own braces stay as read; two lines at most
    assert c.measured == ("00000000:01:00.0 95% busy, no process; 00000000:41:00.0 100% busy, no process; "
                          f"{WPR2}; second {{}} line")


def test_wedged_kernel_line_alone_fails_with_the_line():
    (c,) = wedged({"gpus": [smi_gpu("00000000:01:00.0", 0)]}, {**QUIET, "wpr2": [WPR2]})
    assert (c.status, c.value, c.pitfall, c.measured) == (FAIL, None, "P35", WPR2)
    assert "WPR2 already up" in c.hint


def test_wedged_with_nvml_unreadable_judges_the_kernel_log():
    (c,) = wedged({"error": "NVML not loaded"}, {**QUIET, "wpr2": [WPR2]})
    assert (c.id, c.status, c.measured) == ("field.gpu_wedged", FAIL, WPR2)
    (c,) = wedged(None, QUIET)
    assert (c.status, c.measured) == (PASS, "no busy GPU without a process, no WPR2 line")


@pytest.mark.parametrize("k", [None, {"error": "dmesg: Operation not permitted", "by_hand": "sudo dmesg"}])
def test_wedged_with_the_kernel_log_unreadable_judges_nvml_and_says_so(k):
    c = wedged({"gpus": [smi_gpu("00000000:01:00.0", 100)]}, k)
    assert [x.id for x in c] == ["field.gpu_wedged", "field.gpu_wedged.kernel_log"]
    assert (c[0].status, c[0].value) == (FAIL, 100)
    assert (c[1].status, c[1].pitfall) == (WARN, "P35") and c[1].measured.startswith("could not check, because")


def test_wedged_with_nothing_readable_is_one_could_not_check():
    (c,) = wedged({"error": "NVML not loaded"}, {"error": "dmesg: Operation not permitted", "by_hand": "sudo dmesg"})
    assert (c.id, c.status, c.pitfall) == ("field.gpu_wedged", WARN, "P35")
    assert c.measured == "could not check, because dmesg: Operation not permitted"
    assert c.hint == "run by hand: sudo dmesg"


# -------------------------------------------------------------------------------------------- roce

V4 = "0000:0000:0000:0000:0000:ffff:c0a8:6401"
V6 = "fe80:0000:0000:0000:0e42:a1ff:fe7e:1b2c"


def gid_port(netdev="enp1s0f0np0", state="ACTIVE", gids=None, mtu=9000):
    return {"device": "rocep1s0f0", "port": 1, "state": state, "netdevs": [netdev],
            "gids": gids if gids is not None else [{"index": 3, "type": "RoCE v2", "gid": V4}], "mtu": {netdev: mtu}}


def roce(ports, p=SPARK, pinned=None):
    if pinned is not None:
        p = replace(p, serve=replace(p.serve, env={**p.serve.env, "NCCL_IB_GID_INDEX": pinned}))
    return by_id(link.roce({"roce_gids": {"ports": ports}}, p))


def test_roce_not_required_is_not_judged():
    assert link.roce({"roce_gids": {"ports": [gid_port(gids=[])]}}, P) == []


@pytest.mark.parametrize("r", [None, {"error": "rdma tool missing", "by_hand": "rdma link show"}])
def test_roce_unreadable_is_could_not_check(r):
    (c,) = link.roce({"roce_gids": r}, SPARK)
    assert (c.id, c.status, c.pitfall) == ("field.roce", WARN, "P38")
    assert c.measured.startswith("could not check, because")


def test_roce_judges_only_active_ports_on_the_fabric_netdevs():
    assert roce([gid_port(state="DOWN", gids=[])]) == {}
    assert roce([gid_port(netdev="eno1", gids=[])]) == {}  # not a fabric netdev of the profile
    c = roce([gid_port()])
    assert set(c) == {"field.roce.gid.rocep1s0f0:1", "field.roce.mtu.enp1s0f0np0"}
    assert c["field.roce.gid.rocep1s0f0:1"].status == PASS
    # no fabric netdevs named: every ACTIVE port is NCCL's
    anyp = replace(SPARK, network=replace(SPARK.network, fabric_netdevs=[]))
    c = roce([gid_port(netdev="eno1", gids=[])], p=anyp)
    assert c["field.roce.gid.rocep1s0f0:1"].status == FAIL


@pytest.mark.parametrize("gids, idx", [
    ([{"index": 2, "type": "RoCE v1", "gid": V4}, {"index": 1, "type": "RoCE v2", "gid": V6},
      {"index": 3, "type": "RoCE v2", "gid": V4}], "3"),
    ([{"index": 2, "type": "RoCE v1", "gid": V4}, {"index": 1, "type": "RoCE v2", "gid": V6}], "none"),
    ([{"index": 3, "type": "RoCE v2", "gid": V4}, {"index": 5, "type": "RoCE v2", "gid": V4}], "3,5"),
])
def test_roce_v2_ipv4_gids_only(gids, idx):
    c = roce([gid_port(gids=gids)])["field.roce.gid.rocep1s0f0:1"]
    assert (c.status, c.pitfall) == (PASS if idx != "none" else FAIL, "P38")
    assert c.measured == f"RoCE v2 IPv4 GID index {idx} on enp1s0f0np0"


@pytest.mark.parametrize("pinned, status", [("3", PASS), ("5", FAIL)])
def test_roce_pinned_gid_index_must_be_a_v2_ipv4_one(pinned, status):
    gids = [{"index": 5, "type": "RoCE v1", "gid": V4}, {"index": 3, "type": "RoCE v2", "gid": V4}]
    c = roce([gid_port(gids=gids)], pinned=pinned)["field.roce.gid.rocep1s0f0:1"]
    assert (c.status, c.pitfall) == (status, "P38")
    assert c.measured == f"RoCE v2 IPv4 GID index 3 on enp1s0f0np0; NCCL_IB_GID_INDEX={pinned} pinned"


# ---------------------------------------------------------------------- reproved (the link gate)

MIB256 = 256 << 20


def gbps(nbytes, ms):
    return nbytes / (sorted(ms)[len(ms) // 2] / 1000) / 1e9


def load_fact(**pair_kw) -> dict:
    h2d, d2h, uni = [9.6, 9.7, 9.5], [9.8, 9.9, 9.7], [9.4, 9.3, 9.5]
    pair = {"from": 0, "to": 1, "bytes": MIB256, "unidir_ms": uni, "unidir_gbps": gbps(MIB256, uni),
            "integrity": {"elements": 100, "equal": True, "mismatches": 0, "zeros": 0}}
    pair.update(pair_kw)
    host = {"bytes": MIB256, "h2d_ms": h2d, "d2h_ms": d2h, "h2d_gbps": gbps(MIB256, h2d), "d2h_gbps": gbps(MIB256, d2h)}
    return {"link_load": {"gpus": [{"index": 0, "host": host}], "pairs": [pair]}}


def test_reproved_passes_figures_that_are_their_samples_median():
    (c,) = link.reproved(load_fact(), None, P)
    assert (c.id, c.status, c.measured, c.hint) == ("link.figures_from_samples", PASS,
                                                    "4 figures agree with their samples", "")


def test_reproved_a_pair_figure_without_its_samples_is_caught():
    f = load_fact()
    del f["link_load"]["pairs"][0]["unidir_ms"]
    (c,) = link.reproved(f, None, P)
    assert c.status == FAIL and c.measured.startswith("GPU0->GPU1 unidir_gbps: no timed samples")


def test_reproved_uses_the_recorded_size_of_a_copy():
    half = MIB256 // 2
    f = load_fact(bytes=half, unidir_gbps=gbps(half, [9.4, 9.3, 9.5]))
    assert link.reproved(f, None, P)[0].status == PASS


@pytest.mark.parametrize("part", ["host", "integrity"])
def test_reproved_a_part_that_is_no_table_is_left_alone(part):
    f = load_fact()
    if part == "host":
        f["link_load"]["gpus"][0]["host"] = "not a table"
    else:
        f["link_load"]["pairs"][0]["integrity"] = None
    (c,) = link.reproved(f, None, P)
    assert c.status == PASS and c.measured == ("2 figures agree with their samples" if part == "host" else
                                               "3 figures agree with their samples")


def test_reproved_without_a_load_says_nothing():
    assert link.reproved({}, None, P) == [] and link.reproved({"link_load": {"error": "x"}}, None, P) != []


def test_reproved_an_edited_host_figure_is_caught():
    f = load_fact()
    f["link_load"]["gpus"][0]["host"]["h2d_gbps"] += 0.001
    (c,) = link.reproved(f, None, P)
    assert c.status == FAIL and c.measured.startswith("GPU0 h2d_gbps: ") and "its 3 samples give" in c.measured
    assert "up --from link" in c.hint


def test_reproved_a_gpu_without_host_figures_is_not_judged_on_them():
    f = load_fact()
    f["link_load"]["gpus"][0]["host"] = None
    assert link.reproved(f, None, P)[0].measured == "2 figures agree with their samples"


def test_reproved_an_edited_pair_figure_is_caught_and_the_old_size_comes_from_the_profile():
    f = load_fact(unidir_gbps=30.0)
    (c,) = link.reproved(f, None, P)
    assert c.status == FAIL and c.measured.startswith("GPU0->GPU1 unidir_gbps: 30.000 GB/s where its 3 samples")
    f = load_fact()
    del f["link_load"]["pairs"][0]["bytes"]  # an artifact from before the bytes were recorded: sample_mib
    assert link.reproved(f, None, P)[0].status == PASS
    assert link.reproved(f, None, replace(P, link=replace(P.link, sample_mib=128)))[0].status == FAIL


@pytest.mark.parametrize("key, ms, k", [("bidir_gbps", "bidir_ms", 2), ("staged_gbps", "staged_ms", 1)])
def test_reproved_bidir_and_staged_are_judged_where_their_samples_are_recorded(key, ms, k):
    samples = [20.0, 19.0, 21.0]
    ok = load_fact(**{ms: samples, key: gbps(MIB256 * k, samples)})
    assert link.reproved(ok, None, P)[0].measured == "5 figures agree with their samples"
    bad = load_fact(**{ms: samples, key: gbps(MIB256 * k, samples) * 1.01})
    assert link.reproved(bad, None, P)[0].measured.startswith(f"GPU0->GPU1 {key}: ")
    assert link.reproved(load_fact(**{key: 1.0}), None, P)[0].status == PASS  # no samples recorded: not judged


@pytest.mark.parametrize("integrity, ok", [
    ({"elements": 100, "equal": False, "mismatches": 3, "zeros": 1}, True),
    ({"elements": 100, "equal": True, "mismatches": 3, "zeros": 0}, False),
    ({"elements": 100, "equal": False, "mismatches": 0, "zeros": 0}, False),
    ({"elements": 100, "equal": True, "mismatches": 0, "zeros": 101}, False),
    ({"elements": 100, "equal": False, "mismatches": 101, "zeros": 0}, False),
    ({"elements": 100, "equal": True, "mismatches": -1, "zeros": 0}, False),
    ({"elements": 100, "equal": True, "mismatches": 0, "zeros": -1}, False),
    ({"elements": "100", "equal": True, "mismatches": 0, "zeros": 0}, False),
    ({"elements": 100, "equal": True, "mismatches": None, "zeros": 0}, False),
    ({"elements": 100, "equal": True, "mismatches": 0, "zeros": "0"}, False),
    ({"equal": True}, True),  # no counts recorded: nothing to hold them to
])
def test_reproved_integrity_counts_are_ones_the_pattern_allows(integrity, ok):
    (c,) = link.reproved(load_fact(integrity=integrity), None, P)
    assert c.status == (PASS if ok else FAIL), c.measured
    assert ok or c.measured.startswith("GPU0->GPU1 integrity: ")


@pytest.mark.parametrize("figure_, ms, nbytes, why", [
    (1.0, None, MIB256, "no timed samples"), (1.0, [], MIB256, "no timed samples"),
    (1.0, [0.0], MIB256, "no timed samples"), (1.0, [float("inf")], MIB256, "no timed samples"),
    (1.0, ["9"], MIB256, "no timed samples"), (1.0, [9.0], 0, "no figure or size"),
    (1.0, [9.0], "256", "no figure or size"), (None, [9.0], MIB256, "no figure or size"),
])
def test_from_samples_refuses_what_is_no_sample_or_size(figure_, ms, nbytes, why):
    assert link._from_samples(figure_, ms, nbytes).startswith(why)


def test_from_samples_holds_a_figure_to_a_billionth():
    want = gbps(MIB256, [9.0])
    assert link._from_samples(want, [9.0], MIB256) is None
    assert link._from_samples(want * (1 + 1e-8), [9.0], MIB256) is not None
    assert link._from_samples(want * (1 + 1e-11), [9.0], MIB256) is None
