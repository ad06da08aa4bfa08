"""Engine and host defaults read, not assumed: clocks locked before any load (P04, doctor too),
eager at TP2 with MTP (P22), BAR1 and the bridge window below VRAM (P31), llama-server's automatic
slot count where the profile omits --parallel (P20)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from p2pkit.core import config
from p2pkit.parse import field as pf
from p2pkit.parse import pci as pp
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import llamacpp as llamacpp_rules
from p2pkit.stages.link import checks as link
from p2pkit.stages.rebar import checks as rebar
from tests.conftest import FIXTURES

H200 = json.loads((FIXTURES / "h200-device/facts.json").read_text())["facts"]
NINFER = config.load("dual-5090-ninfer")
LLAMA = config.load("dual-5090-llamacpp")
SPARK = config.load("dual-spark-vllm")


def without(p: config.Profile, flag: str) -> config.Profile:
    return replace(p, serve=replace(p.serve, flags={k: v for k, v in p.serve.flags.items() if k != flag}))


# ---------------------------------------------------------------------------------------- P04

def test_p04_locked_clocks_judged_without_load_on_the_recorded_h200():
    """The H200's recorded NVML facts (clock event reasons 1: idle) pass; the same GPU with the
    applications clocks setting bit (0x2) active fails with the reset commands."""
    checks = {c.id: c for c in link.check(H200, config.load(None))}
    assert checks["link.load"].status == "skip"  # doctor puts no load on the GPUs, and still judges clocks
    assert checks["link.clocks_locked.gpu0"].status == "pass"
    locked = copy.deepcopy(H200)
    g = locked["nvml"]["gpus"][0]
    g["clock_event_reasons"] |= 0x2
    g["locked_clocks"]["applications_clocks_setting"] = True
    c = {c.id: c for c in link.check(locked, config.load(None))}["link.clocks_locked.gpu0"]
    assert c.status == "fail" and c.pitfall == "P04"
    assert "nvidia-smi -rgc" in c.hint and "nvidia-smi -rac" in c.hint


def test_p04_without_nvml_is_could_not_determine_never_a_pass():
    c = link.locked_clocks({"error": "NVML Shared Library Not Found"})[0]
    assert c.status == "skip" and c.measured.startswith("could not determine")


# ---------------------------------------------------------------------------------------- P22

def test_p22_mtp_at_tp2_without_enforce_eager_fails():
    ok = {c.id: c for c in engine_cmd.validate(SPARK)}["service.eager"]
    assert ok.status == "pass"
    c = {c.id: c for c in engine_cmd.validate(without(SPARK, "enforce-eager"))}["service.eager"]
    assert c.status == "fail" and c.pitfall == "P22" and "enforce-eager = true" in c.hint


# ---------------------------------------------------------------------------------------- P31

def test_p31_bar1_below_vram_fails_with_a_clean_kernel_log():
    """A clean kernel log (aikitoria#9's working box) and a GPU whose BAR1 is 256 MiB: the finding's own
    measured text names the small BAR1, so the check fails (it passed before)."""
    k = pf.kernel_log((FIXTURES / "field/dmesg_bar_ok_aikitoria9.txt").read_text())
    gpu = {"bdf": "0000:01:00.0", "aperture": {"index": 1, "size": 256 << 20}}
    c = rebar.bar_assignment({"kernel_log": k, "pci_gpus": [gpu]}, NINFER)[0]
    assert c.status == "fail" and "BAR1 256 MiB" in c.measured and c.pitfall == "P31"
    big = {**gpu, "aperture": {"index": 1, "size": 32 << 30}}
    assert rebar.bar_assignment({"kernel_log": k, "pci_gpus": [big]}, NINFER)[0].status == "pass"


def test_p31_bridge_window_below_vram_fails():
    k = pf.kernel_log((FIXTURES / "field/dmesg_bar_ok_aikitoria9.txt").read_text())
    gpu = {"bdf": "0000:01:00.0", "aperture": {"index": 1, "size": 32 << 30},
           "bridge_window": {"bdf": "0000:00:01.1", "prefetch_size": 256 << 20}}
    c = rebar.bar_assignment({"kernel_log": k, "pci_gpus": [gpu]}, NINFER)[0]
    assert c.status == "fail" and "prefetchable window 256 MiB" in c.measured


def test_bridge_prefetch_window_from_a_bridge_resource_table():
    """A bridge's sysfs resource table in the kernel's layout (17 lines: 6 BARs, ROM, 6 SR-IOV slots,
    then the I/O, memory and prefetchable windows; constructed here, no bridge table was recorded: the
    H200 VM's GPU sits on the root bus), and the H200's own recorded table (BARs only, no window): a
    device's own BARs (index < 7) never count as a window."""
    zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
    lines = [zero] * 13 + ["0x000000000000f000 0x000000000000ffff 0x0000000000000101",
                           "0x00000000fb000000 0x00000000fc0fffff 0x0000000000000200",
                           "0x000000a000000000 0x000000a7ffffffff 0x0000000000102201", zero]
    w = pp.bridge_prefetch_window(pp.resources("\n".join(lines)))
    assert w.index == 15 and w.size == 32 << 30
    gpu_like = [ln for ln in (FIXTURES / "h200-vm/sysfs_pci.txt").read_text().splitlines()
                if ln.startswith("0x")][:7]  # the H200's own table: BARs only, no window
    assert pp.bridge_prefetch_window(pp.resources("\n".join(gpu_like))) is None


# ---------------------------------------------------------------------------------------- P20

def test_p20_omitted_parallel_is_llama_servers_auto_default_not_one():
    help_text = (FIXTURES / "llamacpp/llama-server-help.txt").read_text()
    assert "number of server slots (default: -1, -1 = auto)" in help_text  # what -np defaults to
    p = without(LLAMA, "parallel")
    c = {c.id: c for c in engine_cmd.validate(p)}["service.spec_slots"]
    assert c.status == "warn" and "auto" in str(c.measured) and c.measured != 1 and c.pitfall == "P20"
    assert {c.id: c for c in engine_cmd.validate(LLAMA)}["service.spec_slots"].status == "pass"


def test_p20_slots_read_from_the_running_server():
    """/props total_slots (server-context.cpp get_res_props: n_parallel after auto resolved to 4)."""
    assert llamacpp_rules.running_slots(4, None).status == "warn"
    assert "--parallel omitted (auto)" in llamacpp_rules.running_slots(4, None).measured
    assert llamacpp_rules.running_slots(1, 1).status == "pass"
    unread = llamacpp_rules.running_slots({"error": "/props answered 404"}, None)
    assert unread.measured.startswith("could not determine")
    rec = json.loads((FIXTURES / "llamacpp/spec_on.json").read_text())
    fc_ = {"status": rec["completion_status"], "timings": rec["response"]["timings"], "alive_after": True,
           "metrics_status": 501, "total_slots": 4}
    got = llamacpp_rules.check_llamacpp_requests({"first_completion": fc_}, without(LLAMA, "parallel"))
    ids = {c.id: c for c in got}
    assert ids["service.spec_slots_running"].status == "warn"
