"""Every finding with a measured quantity carries it typed (value, unit, and op/limit where the bound is a
number), its display text made from the number: over every simulated scenario (tests/count_figures.py)
and in the checks doctor does not reach there (verify's, the paste's, the service after start)."""

from __future__ import annotations

import count_figures
import pytest
from conftest import FIXTURES

from p2pkit.app import paste
from p2pkit.core import config
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import ninfer as ninfer_rules
from p2pkit.rules.engines import served
from p2pkit.rules.findings import FAIL, PASS, WARN, figure, place, reading, show
from p2pkit.sim import scenarios
from p2pkit.stages.driver import checks as driver_checks
from p2pkit.stages.link import checks as link
from p2pkit.stages.preflight import checks as preflight
from p2pkit.stages.service import fit

GIB = 1 << 30
P = config.load(None)


@pytest.mark.parametrize("scenario", list(scenarios.SCENARIOS))
def test_no_quantity_is_left_in_the_text_alone(scenario, tmp_path):
    left = count_figures.untyped(count_figures.findings(scenario, tmp_path))
    assert [(c["id"], c["measured"]) for c in left] == []


def test_the_counter_sees_a_number_in_text():
    assert count_figures.has_number("8.0 GiB") and count_figures.has_number("x8") and count_figures.has_number("13")
    assert not count_figures.has_number("580.95.05") and not count_figures.has_number("0000:01:00.0")
    untyped = {"id": "preflight.cgroup", "measured": "memory.max = 8.0 GiB", "value": None}
    assert count_figures.untyped([untyped]) == [untyped]
    assert count_figures.untyped([{**untyped, "value": 8.0}]) == []


def test_units_shown():
    assert (show(256, "MiB"), show(100, "%"), show(9000, "bytes"), show(8.0, "GiB")) == \
        ("256 MiB", "100%", "9000 bytes", "8.0 GiB")


def test_a_reading_carries_its_number_and_the_status_it_is_given():
    r = reading("x.cap", "no cap", WARN, 8.0, "GiB", "no memory cap", "fix", "P12", text="memory.max = {}")
    assert (r.status, r.value, r.unit, r.op, r.limit) == (WARN, 8.0, "GiB", "", None)
    assert r.measured == "memory.max = 8.0 GiB" and r.hint == "fix" and r.pitfall == "P12"
    none = reading("x.cap", "no cap", PASS, None, "GiB", "no memory cap", "fix", missing="no memory cap")
    assert (none.measured, none.value, none.hint) == ("no memory cap", None, "")


def test_a_figure_places_its_number_in_a_sentence():
    c = figure("x.bar1", "BAR1", 256, ">=", 143771, "MiB", "fix", text="BAR1 {}", expected_context="(FB)")
    assert c.measured == "BAR1 256 MiB" and c.expected == ">= 143771 MiB (FB)" and c.status == FAIL
    assert figure("x", "t", None, ">=", 1, "count", text="BAR1 {}").measured == "not measured"


def test_the_tightest_memory_cap_is_the_figure():
    cg = {"cgroup": {"v2_path": "/a", "v1_memory_path": None, "memory_caps": [
        {"file": "/sys/fs/cgroup/a/memory.max", "limit_bytes": 64 * GIB},
        {"file": "/sys/fs/cgroup/memory.max", "limit_bytes": 8 * GIB}]}}
    c = preflight._cgroup(cg, P)
    assert (c.status, c.value, c.unit, c.pitfall) == (WARN, 8.0, "GiB", "P12")
    assert c.measured == "/sys/fs/cgroup/memory.max = 8.0 GiB, /sys/fs/cgroup/a/memory.max = 64.0 GiB"
    free = preflight._cgroup({"cgroup": {"v2_path": "/", "v1_memory_path": None, "memory_caps": []}}, P)
    assert (free.status, free.value, free.measured) == (PASS, None, "no memory cap")


def test_headroom_after_start_is_the_least_free_gpu():
    c = fit.headroom({"gpus": [{"index": 0, "free": 3 * GIB}, {"index": 1, "free": GIB}]}, P)[0]
    assert (c.status, c.value, c.unit, c.op, c.limit) == (WARN, 1.0, "GiB", ">=", P.serve.vram_headroom_gib)
    assert fit.headroom({"gpus": [{"index": 0, "free": None}]}, P)[0].status == PASS  # no reading, as before


def test_counts_and_sizes_of_verify_and_paste_checks():
    h = {"installed": ["libnvidia-compute-615", "nvidia-firmware-580-580.95.05"],
         "held": ["nvidia-firmware-580-580.95.05"]}
    c = driver_checks.holds(h)
    assert (c.status, c.value, c.op, c.limit) == (FAIL, 1, "==", 0) and "libnvidia-compute-615" in c.measured
    n = {"nccl_allreduce": {"env": {}, "tail": ["init"], "timed_out": True, "timeout_s": 60}}
    hung = link.nccl_allreduce(n, P)[0]
    assert (hung.status, hung.value, hung.unit, hung.pitfall) == (FAIL, 60, "s", "P28") and "NCCL hung" in hung.measured
    bar = paste.smi_q((FIXTURES / "h200-vm/smi_q.txt").read_text(), P)[0]  # nvidia-smi -q on the H200 (README)
    assert (bar.status, bar.value, bar.unit, bar.op, bar.limit) == (PASS, 262144, "MiB", ">=", 143771)


def test_drafting_carries_its_draft_tokens():
    from p2pkit.parse import engine_api as pe

    # NInfer's own request log (tests/fixtures/ninfer/README)
    events = pe.ninfer_done(pe.jsonl((FIXTURES / "ninfer/request_log.jsonl").read_text()))
    c = ninfer_rules.ninfer_spec_running({"request_log": "requests.jsonl", "log_events": events}, "dflash2")
    assert (c.status, c.value, c.unit) == (PASS, 35, "count") and "drafted 35, accepted 18" in c.measured


def test_the_first_completion_carries_its_tokens():

    fc = {"status": 200, "usage": {"completion_tokens": 24}, "client_seconds": 0.5, "alive_after": True}
    c = served.openai_first(fc, {"log_tail": []}, "vLLM")
    assert (c.status, c.value, c.measured) == (PASS, 24, "24 tokens (usage), 0.5 s at the client")
    bad = served.openai_first({**fc, "status": 500, "error": "{}"}, {"log_tail": []}, "vLLM")
    assert (bad.status, bad.value) == (FAIL, None) and bad.measured.startswith("HTTP 500: {};")


def test_field_figures():
    f = {"nvml": {"gpus": [{"bus_id": "00000000:41:00.0", "util_gpu_pct": 100, "processes": []},
                           {"bus_id": "00000000:01:00.0", "util_gpu_pct": 95, "processes": []}]},
         "kernel_log": {"wpr2": [], "bar_no_space": [], "resize_fatal": [], "io_page_fault": []}}
    w = link.wedged(f, P)[0]
    assert (w.status, w.value, w.unit, w.pitfall) == (FAIL, 100, "%", "P35")
    assert w.measured == "00000000:41:00.0 100% busy, no process; 00000000:01:00.0 95% busy, no process"


def test_text_read_from_the_host_keeps_its_braces():
    """The number goes at the first {} of the text; a log line's own braces are its own (str.format would
    have read them as fields and raised)."""
    line = '[  115.08] NVRM: GPU1 {"event": "WPR2"} already up {}'
    f = {"nvml": {"gpus": [{"bus_id": "00000000:41:00.0", "util_gpu_pct": 100, "processes": []}]},
         "kernel_log": {"wpr2": [line], "bar_no_space": [], "resize_fatal": [], "io_page_fault": []}}
    w = link.wedged(f, P)[0]
    assert w.measured == f"00000000:41:00.0 100% busy, no process; {line}" and w.value == 100
    assert place("a {} b {}", "1") == "a 1 b {}"


def test_the_engine_flag_counts():
    c = {x.id: x for x in engine_cmd.validate(config.load("dual-spark-vllm"))}
    assert (c["service.spec_slots"].value, c["service.spec_slots"].status) == (13, WARN)
    assert (c["service.nnodes"].value, c["service.nnodes"].limit, c["service.nnodes"].status) == (2, 2, PASS)
