"""Condition guards (issue 30 item 4): a test for each condition inside a check that
`bench/check_guard.py --conditions` found no test noticing when it was removed (replaced by True or
by False). Each calls the check by a stable name (doctor's judge, the check id, the engine's own
counters' check) so that it survives checks moving between modules; docs/guards.md lists what is
left and why."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace

from p2pkit.rules.engines import llamacpp as llamacpp_rules
from p2pkit.rules.engines import ninfer as ninfer_rules
from p2pkit.rules.engines import vllm as vllm_rules
from tests.conftest import FIXTURES


def finding(doc: dict, id_: str) -> dict:
    """A check of a doctor document by its id, whichever group (stage) judges it."""
    found = [c for g in doc["groups"] for c in g["checks"] if c["id"] == id_]
    assert len(found) == 1, (id_, [c["id"] for g in doc["groups"] for c in g["checks"]])
    return found[0]


def doctor(cli, root) -> dict:
    r = cli("--root", str(root), "--json", "doctor")
    return json.loads(r.out)


# ------------------------------------------------------------------------------------------- P34

def test_p34_an_initramfs_older_than_the_installed_patched_module_fails(cli, sim):
    """The simulated host with the patched module up (its initramfs rebuilt after the install): the
    sources check passes. The installed nvidia.ko made newer than the initramfs (a reinstall without
    update-initramfs): the initramfs still holds the module before it, a fail naming both. With no
    installed module there is no age to compare; an initramfs that holds no nvidia.ko at all cannot
    load an old one: its age does not matter."""
    from p2pkit.sim.lifecycle import STOCK_KO
    from p2pkit.sim.standins import write_initramfs, write_modules_dep

    root = sim("p2p-up")
    kver = (root / "proc/sys/kernel/osrelease").read_text().strip()
    image = root / f"boot/initrd.img-{kver}"
    ko = root / f"lib/modules/{kver}/kernel/drivers/video/nvidia.ko"
    # what the p2p-module stage leaves (the simulator's module file, depmod, update-initramfs)
    ko.parent.mkdir(parents=True, exist_ok=True)
    ko.write_text(STOCK_KO.format(kernel=kver).replace("patched=0", "patched=1"))
    write_modules_dep(root, kver)
    write_initramfs(root, kver)
    before = image.stat().st_mtime - 3600
    os.utime(ko, (before, before))
    assert f"lib/modules/{kver}/kernel/drivers/video/nvidia.ko" in image.read_text()
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "pass", c
    later = image.stat().st_mtime + 3600
    os.utime(ko, (later, later))
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "fail" and c["pitfall"] == "P34", c
    assert f"/boot/initrd.img-{kver} is older than the installed patched module" in c["measured"]
    assert "update-initramfs -u" in c["hint"]
    # no installed module to compare with (removed by hand): no age to judge, and no crash
    ko.unlink()
    c = finding(doctor(cli, root), "field.module_sources")
    assert "older" not in c["measured"], c
    # the same age, and no nvidia.ko in the image: nothing old can load from it
    ko.write_text(STOCK_KO.format(kernel=kver).replace("patched=0", "patched=1"))
    os.utime(ko, (later, later))
    stamp = image.stat().st_mtime
    image.write_text("".join(x + "\n" for x in image.read_text().splitlines() if "nvidia" not in x))
    os.utime(image, (stamp, stamp))
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "pass", c


# ------------------------------------------------------------------------------- driver (P01, P02)

def _by_id(checks) -> dict:
    return {c.id: c for c in checks}


def test_driver_pin_allowed_other_versions_and_595_warns():
    """driver.pin: the pin passes; another version passes only when allowed; 595 (P01) stays a warning
    even when allowed, a fail when not. The installer checksum's measured text is the sha or (empty)."""
    from p2pkit.core import config
    from p2pkit.stages.driver import checks as driver

    p = config.load(None)

    def pin(version: str, allow: bool):
        q = replace(p, driver=replace(p.driver, version=version, allow_other_version=allow))
        return _by_id(driver.precheck(q))["driver.pin"]

    assert pin(p.driver.version, False).status == "pass"
    assert pin("580.95.05", False).status == "fail"
    assert pin("580.95.05", True).status == "pass"
    w = pin("595.71.05", True)
    assert w.status == "warn" and w.pitfall == "P01" and "allowed by driver.allow_other_version" in w.hint
    assert pin("595.71.05", False).status == "fail"
    assert _by_id(driver.precheck(p))["driver.installer_sha256"].measured == "(empty)"
    sha = "ab" * 32
    c = _by_id(driver.precheck(replace(p, driver=replace(p.driver, installer_sha256=sha))))["driver.installer_sha256"]
    assert c.status == "pass" and c.measured == sha


def test_driver_check_reads_each_fact_or_says_it_could_not():
    """driver's stage check on the facts it reads: the host's architecture (judged, could not be read,
    absent, unknown to p2pkit), the userspace driver and its GSP firmware, the apt guards, the holds."""
    from p2pkit.core import config
    from p2pkit.stages.driver import checks as driver

    p = config.load(None)
    want = p.driver.version
    good = {"arch": "x86_64", "userspace_driver": {"versions": [want], "gsp_firmware": {want: ["gsp_ga10x.bin",
                                                                                                 "gsp_tu10x.bin"]}},
            "driver_guards": {"nouveau_blacklisted": True, "apt_pin": True},
            "package_holds": {"installed": ["adduser", "nvidia-dkms-615", "libnvidia-compute-615"],
                              "held": ["nvidia-dkms-615", "libnvidia-compute-615"]}}
    c = _by_id(driver.check(good, p))
    assert c["driver.installer_arch"].status == "pass"
    assert c["driver.gsp_firmware"].measured == "gsp_ga10x.bin, gsp_tu10x.bin"
    assert c["driver.guards"].status == "pass" and c["driver.guards"].hint == ""
    assert c["driver.guards"].measured == "nouveau_blacklisted: yes, apt_pin: yes"
    holds = c["driver.holds"]
    assert (holds.status, holds.value, holds.measured) == ("pass", 0, "0 of 2 without an apt hold")
    # an unheld package that is not NVIDIA's is not p2pkit's to hold
    unheld = {**good["package_holds"], "held": ["nvidia-dkms-615"]}
    h = _by_id(driver.check({**good, "package_holds": unheld}, p))["driver.holds"]
    assert h.status == "fail" and h.measured == "1 of 2 without an apt hold (libnvidia-compute-615)"
    assert "driver.installer_arch" not in _by_id(driver.check({k: v for k, v in good.items() if k != "arch"}, p))
    assert "driver.holds" not in _by_id(driver.check({k: v for k, v in good.items() if k != "package_holds"}, p))
    err = _by_id(driver.check({**good, "arch": {"error": "uname: not found"}}, p))["driver.installer_arch"]
    assert err.status == "fail" and err.measured == "could not determine: uname: not found"
    other = _by_id(driver.check({**good, "arch": "riscv64"}, p))["driver.installer_arch"]
    assert other.status == "fail" and other.expected == "an installer for riscv64"
    c = _by_id(driver.check({**good, "userspace_driver": {"error": "no nvidia-smi"},
                             "driver_guards": {"error": "cannot read /etc/apt"}}, p))
    assert c["driver.userspace_version"].measured == "could not determine: no nvidia-smi"
    assert "driver.gsp_firmware" not in c and "driver.guards" not in c
    c = _by_id(driver.check({**good, "driver_guards": {"error": "cannot read /etc/apt"}}, p))
    assert c["driver.guards"].status == "fail" and c["driver.guards"].measured.startswith("could not determine")
    c = _by_id(driver.check({**good, "driver_guards": {"nouveau_blacklisted": True, "apt_pin": False},
                             "userspace_driver": {"versions": [want], "gsp_firmware": {}}}, p))
    assert c["driver.guards"].status == "fail" and "p2pkit restore" in c["driver.guards"].hint
    assert c["driver.guards"].measured == "nouveau_blacklisted: yes, apt_pin: no"
    assert c["driver.gsp_firmware"].status == "fail" and c["driver.gsp_firmware"].measured.startswith("none in")


# ------------------------------------------------------------------------------------------- P19

def _fc_llamacpp(name: str) -> dict:
    """The first completion's facts from a recorded llama-server run (tests/fixtures/llamacpp)."""
    from tests.test_llamacpp import _first_completion

    rec = json.loads((FIXTURES / f"llamacpp/{name}.json").read_text())
    return _first_completion(rec)


def _llamacpp(fc: dict | None, spec: bool = True) -> dict:
    from p2pkit.core import config

    p = config.load("dual-5090-llamacpp", ["serve.flags.spec-type=draft-simple"] if spec else [])
    if not spec:
        p = replace(p, serve=replace(p.serve, flags={k: v for k, v in p.serve.flags.items()
                                                     if k not in ("spec-type", "model-draft", "spec-draft-n-max",
                                                                  "spec-draft-n-min")}))
    s = {"health": {"ok": True}, "log_tail": ["(recorded)"]} | ({"first_completion": fc} if fc is not None else {})
    return _by_id(llamacpp_rules.check_llamacpp_requests(s, p))


def test_p19_llamacpp_needs_the_responses_and_the_metrics_draft_counts_and_a_first_completion():
    """The recorded server with drafting on passes; the same run with the response's draft_n gone (or
    /metrics' draft counter not grown) fails: each of the two counts must show drafting. A first
    completion that generated nothing fails it and the spec check; no /health 200, no request: nothing
    to judge; without a speculative type, no spec check."""
    fc = _fc_llamacpp("spec_on")
    c = _llamacpp(fc)
    assert c["service.first_completion"].status == "pass" and c["service.spec_running"].status == "pass"
    no_draft_n = {**fc, "timings": {k: v for k, v in fc["timings"].items() if not k.startswith("draft_n")}}
    r = _llamacpp(no_draft_n)["service.spec_running"]
    assert r.status == "fail" and "response draft_n 0" in r.measured
    flat = {**fc, "metrics_delta": {**fc["metrics_delta"], "spec_decode_num_draft_tokens_total": 0}}
    r = _llamacpp(flat)["service.spec_running"]
    assert r.status == "fail" and "spec_decode_num_draft_tokens_total +0" in r.measured
    nothing = {**fc, "timings": {**fc["timings"], "predicted_n": 0}}
    c = _llamacpp(nothing)
    assert c["service.first_completion"].status == "fail" and c["service.spec_running"].status == "fail"
    assert _llamacpp(None) == {}
    assert list(_llamacpp(fc, spec=False)) == ["service.first_completion"]


def _vllm(fc: dict) -> dict:
    from p2pkit.core import config

    p = config.load("dual-spark-vllm", ['serve.flags.speculative-config={"method":"mtp","num_speculative_tokens":3}'])
    s = {"health": {"ok": True}, "first_completion": {"status": 200, "usage": {"completion_tokens": 16},
                                                      "alive_after": True, **fc}, "log_tail": []}
    return _by_id(vllm_rules.check_vllm_requests(s, p))


def test_p19_vllm_needs_metrics_and_both_draft_counters():
    """vLLM's /metrics not answering is its own finding (the counters cannot be read, not 'no spec
    counters'); drafts and draft tokens must both have grown; no acceptance text without drafts."""
    r = _vllm({"metrics_status": 404, "metrics_delta": {}})["service.spec_running"]
    assert r.status == "fail" and r.measured == "/metrics answered 404" and "engine's own port" in r.hint
    grown = {"spec_decode_num_drafts_total": 4, "spec_decode_num_draft_tokens_total": 12,
             "spec_decode_num_accepted_tokens_total": 7}
    r = _vllm({"metrics_status": 200, "metrics_delta": grown, "accepted_per_pos_delta": {"0": 3, "1": 2, "2": 2}})
    r = r["service.spec_running"]
    assert r.status == "pass" and r.measured.endswith("acceptance per position 0.75, 0.50, 0.50")
    for key in ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total"):
        r = _vllm({"metrics_status": 200, "metrics_delta": {**grown, key: 0}})["service.spec_running"]
        assert r.status == "fail", key
    r = _vllm({"metrics_status": 200, "metrics_delta": {**grown, "spec_decode_num_drafts_total": 0},
               "accepted_per_pos_delta": {"0": 0}})["service.spec_running"]
    assert "acceptance" not in r.measured


def _ninfer(fc: dict) -> dict:
    from p2pkit.core import config

    p = config.load("dual-5090-ninfer", ["serve.flags.spec=dflash2"])
    s = {"health": {"ok": True}, "first_completion": {"status": 200, "usage": {"completion_tokens": 24},
                                                      "alive_after": True, **fc}, "log_tail": []}
    return _by_id(ninfer_rules.check_ninfer_requests(s, p))


def test_p19_ninfer_reads_the_request_done_line_of_its_own_log():
    """NInfer's recorded request log passes with its acceptance per position; no log kept is its own
    finding; only a request_done line counts; a backend of none, or zero drafted, fails."""
    from tests.test_spec_running import _log_events

    events = _log_events((FIXTURES / "ninfer/request_log.jsonl").read_text())
    (done,) = events
    r = _ninfer({"request_log": "requests.jsonl", "log_events": events})["service.spec_running"]
    assert r.status == "pass"
    assert r.measured == ("backend dflash2, rounds 5, drafted 35, accepted 18; acceptance per position "
                          "1.00, 1.00, 0.80, 0.60, 0.20, 0.00, 0.00")
    r = _ninfer({"request_log": None, "log_events": events})["service.spec_running"]
    assert r.status == "fail" and r.measured == "the engine keeps no request log"
    r = _ninfer({"request_log": "requests.jsonl", "log_events": [{**done, "event": "request_start"}]})
    assert r["service.spec_running"].measured.startswith("no request_done line")
    sp = done["speculative"]
    for bad in ({"backend": "none"}, {"drafted_tokens": 0}):
        ev = [{**done, "speculative": {**sp, **bad}}]
        assert _ninfer({"request_log": "r", "log_events": ev})["service.spec_running"].status == "fail", bad
    # a line without rounds (an older log): the per-position counts cannot be turned into rates
    ev = [{**done, "speculative": {k: v for k, v in sp.items() if k != "rounds"}}]
    r = _ninfer({"request_log": "r", "log_events": ev})["service.spec_running"]
    assert r.status == "pass" and "acceptance" not in r.measured and "rounds None" in r.measured


# ----------------------------------------------------- P22 and the vLLM node flags (service.precheck)

def _spark(**flags):
    """The built-in dual-Spark vLLM profile with these serve flags changed (None removes one)."""
    from p2pkit.core import config

    p = config.load("dual-spark-vllm")
    f = {k: v for k, v in {**p.serve.flags, **flags}.items() if v is not None}
    return replace(p, serve=replace(p.serve, flags=f))


def _precheck(p) -> dict:
    from p2pkit.stages import registry

    (service,) = [st for st in registry() if st.name == "service"]
    return _by_id(service.precheck(p))


def test_p22_eager_is_judged_where_mtp_runs_at_tp2_and_says_which():
    """service.eager: eager with MTP at TP2 passes (measured 'eager', no hint), CUDA graphs fail with
    the fix; one GPU on one node, or no speculative config, has no such check."""
    from p2pkit.core import config

    ok = _precheck(_spark())["service.eager"]
    assert (ok.status, ok.measured, ok.hint) == ("pass", "eager", "")
    bad = _precheck(_spark(**{"enforce-eager": None}))["service.eager"]
    assert bad.status == "fail" and bad.measured == "CUDA graphs" and "enforce-eager = true" in bad.hint
    one = _spark(**{"enforce-eager": None, "nnodes": None, "node-rank": None, "tensor-parallel-size": 1})
    one = replace(one, profile=replace(one.profile, nodes=1))
    assert config.load("dual-spark-vllm").gpus.count == 1 and "service.eager" not in _precheck(one)
    assert "service.eager" not in _precheck(_spark(**{"speculative-config": None, "enforce-eager": None}))


def test_vllm_node_flags_tp_rank_rendezvous_headless_and_ip_filter():
    """The dual-Spark head: tensor parallel over both nodes, --nnodes 2, rank 0 in range, the
    rendezvous address and port, the head serving the API, the IP filter; each broken in turn."""
    c = _precheck(_spark(**{"master-addr": "10.10.0.1"}))
    for id_ in ("service.tp", "service.nnodes", "service.node_rank", "service.rendezvous", "service.headless"):
        assert c[id_].status == "pass", c[id_]
    assert c["service.rendezvous"].measured == "10.10.0.1:29511"
    assert c["service.headless"].measured == "serves the API" and c["service.headless"].expected == "serves the API"
    assert c["service.ip_filter"].status == "warn" and c["service.ip_filter"].measured == "no IP filter"
    assert "network.fabric_cidr" in c["service.ip_filter"].hint
    assert _precheck(_spark(**{"tensor-parallel-size": 1}))["service.tp"].status == "fail"
    assert _precheck(_spark(nnodes=3))["service.nnodes"].status == "fail"
    for rank in (None, 2, -1, "x"):
        assert _precheck(_spark(**{"node-rank": rank, "nnodes": 2}))["service.node_rank"].status == \
            ("pass" if rank is None else "fail"), rank  # an omitted rank is vLLM's default 0
    r = _precheck(_spark())["service.rendezvous"]
    assert r.status == "fail" and r.measured == "(no master-addr):29511"
    r = _precheck(_spark(**{"master-addr": "10.10.0.1", "master-port": None}))["service.rendezvous"]
    assert r.status == "fail" and r.measured == "10.10.0.1:(no master-port)"
    w = _precheck(_spark(**{"master-addr": "10.10.0.1", "node-rank": 1}))["service.headless"]
    assert w.status == "fail" and (w.measured, w.expected) == ("serves the API", "headless")
    w = _precheck(_spark(**{"master-addr": "10.10.0.1", "node-rank": 1, "headless": True}))["service.headless"]
    assert w.status == "pass" and w.measured == "headless"
    h = _precheck(_spark(**{"master-addr": "10.10.0.1", "headless": True}))["service.headless"]
    assert h.status == "fail" and h.expected == "serves the API"
    p = _spark()
    fenced = replace(p, network=replace(p.network, fabric_cidr="10.10.0.0/24"))
    f = _precheck(fenced)["service.ip_filter"]
    assert (f.status, f.measured, f.hint) == ("pass", "10.10.0.0/24", "")
    one = replace(_spark(**{"nnodes": None, "node-rank": None, "tensor-parallel-size": 1}),
                  profile=replace(p.profile, nodes=1))
    assert "service.nnodes" not in _precheck(one) and "service.ip_filter" not in _precheck(one)


def test_vllm_sequences_with_mtp_and_the_ngram_table_mmap():
    """service.spec_slots: one sequence passes with no hint, more warn; service.ple_mmap only where
    the n-gram table directory is set."""
    c = _precheck(_spark(**{"max-num-seqs": 1}))["service.spec_slots"]
    assert (c.status, c.hint) == ("pass", "")
    c = _precheck(_spark())["service.spec_slots"]
    assert c.status == "warn" and "45.9" in c.hint
    assert "service.spec_slots" not in _precheck(_spark(**{"speculative-config": None, "enforce-eager": None}))
    p = _spark()
    assert _precheck(p)["service.ple_mmap"].status == "pass"
    bare = replace(p, serve=replace(p.serve, env={k: v for k, v in p.serve.env.items() if k != "VLLM_PLE_MMAP_DIR"}))
    assert "service.ple_mmap" not in _precheck(bare)


# ------------------------------------------------------------------------------------------ rebar

H200 = json.loads((FIXTURES / "h200-device/facts.json").read_text())["facts"]
GIB = 1 << 30


def _rebar(**facts) -> dict:
    """The rebar stage's check over the recorded H200's facts with these changed."""
    from p2pkit.core import config
    from p2pkit.stages import registry

    (st,) = [s for s in registry() if s.name == "rebar"]
    f = copy.deepcopy(H200) | facts
    return _by_id(st.check(f, config.load(None)))


def test_rebar_floor_from_nvml_or_the_profile_and_what_the_card_offers():
    """The recorded H200: BAR1 256 GiB against NVML's 140.4 GiB of VRAM, NVML's bar1Total agreeing.
    Without NVML (or without its memory total) the floor is the profile's VRAM and the NVML
    comparison is a skip; a small BAR1 names the largest size the card offers above the floor."""
    bdf = H200["pci_gpus"][0]["bdf"]
    c = _rebar()
    assert c[f"rebar.bar1.{bdf}"].expected == ">= 140.4 GiB (VRAM from NVML)"
    assert c[f"rebar.nvml.{bdf}"].status == "pass"
    c = _rebar(nvml={"error": "NVML Shared Library Not Found"})
    assert c[f"rebar.bar1.{bdf}"].expected == ">= 32.0 GiB (VRAM from the profile)"
    assert c[f"rebar.nvml.{bdf}"].status == "skip"
    assert c[f"rebar.nvml.{bdf}"].measured == "could not determine: NVML Shared Library Not Found"
    nv = copy.deepcopy(H200["nvml"])
    nv["gpus"][0]["memory_total"] = None
    nv["gpus"][0]["bar1_total"] = None
    c = _rebar(nvml=nv)
    # NVML lists the GPU but not its memory: the floor is the profile's VRAM, and says so
    assert c[f"rebar.bar1.{bdf}"].expected == ">= 32.0 GiB (VRAM from the profile)"
    assert c[f"rebar.nvml.{bdf}"].status == "fail" and c[f"rebar.nvml.{bdf}"].measured == "not read: None"
    small = copy.deepcopy(H200["pci_gpus"])
    small[0]["aperture"] = {**small[0]["aperture"], "size": 256 << 20,
                            "resizable_to": [256 << 20, 64 * GIB, 128 * GIB, 256 * GIB]}
    b = _rebar(pci_gpus=small)[f"rebar.bar1.{bdf}"]
    assert b.status == "fail" and b.hint.endswith("; this card offers 256 GiB (resource2_resize)")
    small[0]["aperture"]["resizable_to"] = [256 << 20, 64 * GIB, 128 * GIB]  # none reaches 140.4 GiB
    b = _rebar(pci_gpus=small)[f"rebar.bar1.{bdf}"]
    assert b.status == "fail" and "this card offers" not in b.hint


def test_rebar_without_gpus_or_a_bar_table_says_what_it_could_not_read():
    bdf = H200["pci_gpus"][0]["bdf"]
    c = _rebar(pci_gpus={"error": "/sys/bus/pci/devices unreadable"})["rebar.gpus"]
    assert c.status == "fail" and c.measured == "could not determine: /sys/bus/pci/devices unreadable"
    c = _rebar(pci_gpus=[])["rebar.gpus"]
    assert c.status == "fail" and (c.value, c.measured) == (0, "0")
    gone = copy.deepcopy(H200["pci_gpus"])
    gone[0]["aperture"] = None
    c = _rebar(pci_gpus=gone)
    assert c[f"rebar.bar1.{bdf}"].measured == ("could not determine: no 64-bit prefetchable memory BAR in the "
                                               "resource table")
    assert f"rebar.nvml.{bdf}" not in c
    gone[0]["errors"] = ["could not determine the BAR table of x: bad line", "second"]
    c = _rebar(pci_gpus=gone)[f"rebar.bar1.{bdf}"]
    assert c.status == "fail" and c.measured == ("could not determine: could not determine the BAR table of x: "
                                                 "bad line; second")


# ----------------------------------------------------------------- field checks through doctor's judge

FIELD_RUN = json.loads((FIXTURES / "h200-device/field-run/facts.json").read_text())
FIELD_RUN = FIELD_RUN.get("facts", FIELD_RUN)


def judged(profile=None, **facts) -> dict:
    """doctor's judge over the H200's recorded field-run facts with these changed: its checks by id."""
    from p2pkit.app import doctor
    from p2pkit.core import config

    doc = doctor.judge(copy.deepcopy(FIELD_RUN) | facts, profile or config.load(None), simulated=False)
    return {c["id"]: c for g in doc["groups"] for c in g["checks"]}


def _gpus(*groups: str) -> list[dict]:
    """The recorded GPU twice (the pair the profile wants), with these IOMMU groups."""
    one = FIELD_RUN["pci_gpus"][0]
    return [{**copy.deepcopy(one), "bdf": f"0000:0{i + 1}:00.0", "iommu_group": g} for i, g in enumerate(groups)]


def test_p32_a_translating_domain_or_an_io_page_fault_fails_only_for_a_pair():
    from p2pkit.core import config

    c = judged()["field.iommu_domain"]
    assert c["status"] == "pass" and c["measured"] == "passthrough (identity) or no IOMMU group on every GPU"
    c = judged(pci_gpus=_gpus("identity", "translating"))["field.iommu_domain"]
    assert c["status"] == "fail" and c["measured"] == "0000:02:00.0 (translating)" and c["pitfall"] == "P32"
    assert "iommu=pt" in c["hint"]
    log = {**FIELD_RUN["kernel_log"], "io_page_fault": ["(fault 1)", "(fault 2)", "(fault 3)"]}
    c = judged(kernel_log=log)["field.iommu_domain"]
    assert c["status"] == "fail" and c["measured"] == "(fault 1); (fault 2)"
    c = judged(kernel_log={"error": "dmesg: read kernel buffer failed: Operation not permitted"})
    assert c["field.iommu_domain"]["status"] == "pass"  # the kernel log is judged as could-not elsewhere
    # the GPUs unreadable (a failed fact is a dict {"error": ...}): nothing to name, no crash
    assert judged(pci_gpus={"error": "sysfs unreadable"})["field.iommu_domain"]["status"] == "pass"
    one = config.load(None, ["gpus.count=1"])
    assert "field.iommu_domain" not in judged(one, pci_gpus=_gpus("translating"))


def test_p33_a_connected_display_on_a_gpu_of_the_pair_warns():
    from p2pkit.core import config

    gpus = _gpus("identity", "identity")
    conn = [{"connector": "DP-1", "card": "card1", "status": "connected", "bdf": "0000:01:00.0"},
            {"connector": "HDMI-A-1", "card": "card1", "status": "disconnected", "bdf": "0000:01:00.0"},
            {"connector": "DP-2", "card": "card0", "status": "connected", "bdf": "0000:00:02.0"}]  # an iGPU
    c = judged(pci_gpus=gpus, drm={"connectors": conn})["field.display"]
    assert c["status"] == "warn" and c["measured"] == "card1-DP-1 on 0000:01:00.0" and c["pitfall"] == "P33"
    c = judged(pci_gpus=gpus, drm={"connectors": conn[1:]})["field.display"]
    assert c["status"] == "pass" and c["measured"] == "no connected display on the GPUs"
    c = judged(pci_gpus={"error": "sysfs unreadable"}, drm={"connectors": conn})["field.display"]
    assert c["status"] == "pass"  # no GPU read: no display on one can be named
    c = judged(drm={"error": "/sys/class/drm unreadable"})["field.display"]
    assert c["measured"].startswith("could not check") and c["pitfall"] == "P33"
    assert "field.display" not in judged(config.load(None, ["gpus.count=1"]), drm={"connectors": conn})


def test_p34_module_sources_from_facts_updates_initramfs_copies_and_holders():
    """field.module_sources over the recorded facts (no initramfs in that VM: could-not for it, the
    rest judged), then with a DKMS copy under updates/, an initramfs that holds the stock module or
    the patched one, and a loaded module that is not the built one while other modules hold it."""
    from p2pkit.core import config

    kver = FIELD_RUN["module_sources"]["kernel"]
    c = judged()
    assert c["field.module_sources"]["status"] == "pass"
    assert c["field.module_sources"]["measured"] == "no copy under updates/"
    assert c["field.module_sources.initramfs"]["measured"].startswith("could not check")
    ms = FIELD_RUN["module_sources"]
    dkms = f"/lib/modules/{kver}/updates/dkms/nvidia.ko"
    c = judged(module_sources={**ms, "updates": [dkms]})["field.module_sources"]
    assert c["status"] == "fail" and c["measured"] == f"{dkms} (DKMS wins over kernel/drivers/video)"
    image = {"path": f"/boot/initrd.img-{kver}", "mtime": 2.0}
    ok = {**ms, "installed_mtime": 1.0, "initramfs": {**image, "nvidia": [
        f"usr/lib/modules/{kver}/kernel/drivers/video/nvidia.ko"]}}
    c = judged(module_sources=ok)
    assert c["field.module_sources"]["status"] == "pass" and "field.module_sources.initramfs" not in c
    # what lsinitramfs listed, not what p2pkit expected (issue 49 item 5)
    assert c["field.module_sources"]["measured"] == (f"no copy under updates/, /boot/initrd.img-{kver} holds "
                                                     f"usr/lib/modules/{kver}/kernel/drivers/video/nvidia.ko")
    stock = {**ok, "initramfs": {**image, "nvidia": [f"usr/lib/modules/{kver}/updates/dkms/nvidia.ko"]}}
    c = judged(module_sources=stock)["field.module_sources"]
    assert c["status"] == "fail"
    assert c["measured"] == f"initramfs /boot/initrd.img-{kver}: usr/lib/modules/{kver}/updates/dkms/nvidia.ko"
    built = {"path": "/x/nvidia.ko", "srcversion": "AAAA"}
    held = {**ok, "holders": ["nvidia_uvm", "nvidia_modeset"]}
    c = judged(module_sources=held, built_module=built)["field.module_sources"]
    assert c["status"] == "fail" and c["measured"] == (
        f"loaded srcversion {FIELD_RUN['module']['loaded_srcversion']} is not the built AAAA; nvidia_uvm, "
        "nvidia_modeset hold nvidia (rmmod nvidia fails until they are unloaded)")
    assert judged(module_sources=ok, built_module=built)["field.module_sources"]["status"] == "pass"  # none hold
    same = {**built, "srcversion": FIELD_RUN["module"]["loaded_srcversion"]}
    assert judged(module_sources=held, built_module=same)["field.module_sources"]["status"] == "pass"
    assert judged(module_sources=held, built_module={**built, "srcversion": None})[
        "field.module_sources"]["status"] == "pass"  # nothing built to compare with
    assert judged(module_sources=held, built_module=built, module={"error": "no module loaded"})[
        "field.module_sources"]["status"] == "pass"
    c = judged(module_sources={"error": "/proc/sys/kernel/osrelease unreadable"})["field.module_sources"]
    assert c["measured"].startswith("could not check") and c["pitfall"] == "P34"
    stockp = config.load(None)
    stockp = replace(stockp, p2p_module=replace(stockp.p2p_module, patched=False))
    assert "field.module_sources" not in judged(stockp, module_sources={**ms, "updates": [dkms]})
    assert "field.module_sources" not in judged(config.load(None, ["gpus.count=1"]), module_sources=stock)


def _params(registry: str) -> dict:
    """The recorded H200's live driver parameters with RegistryDwords set as the params file says it."""
    from p2pkit.parse import field as pf

    d = copy.deepcopy(FIELD_RUN["driver_params"])
    d["params"]["RegistryDwords"] = registry
    d["registry_dwords"] = pf.registry_dwords(registry)
    return d


def test_p28_static_bar1_judged_for_a_patched_pair_with_dwords_only():
    from p2pkit.core import config

    c = judged()["field.static_bar1"]
    assert c["status"] == "fail" and c["measured"] == 'RegistryDwords: ""' and c["pitfall"] == "P28"
    assert judged(driver_params=_params("RMForceStaticBar1=1"))["field.static_bar1"]["status"] == "pass"
    gone = {k: v for k, v in FIELD_RUN.items() if k != "driver_params"}  # a fact never collected
    from p2pkit.app import doctor

    doc = doctor.judge(copy.deepcopy(gone), config.load(None), simulated=False)
    c = finding(doc, "field.static_bar1")
    assert (c["status"], c["measured"], c["hint"]) == ("warn", "could not check, because None", "rerun as root")
    c = judged(driver_params={**FIELD_RUN["driver_params"], "loaded": False})["field.static_bar1"]
    assert (c["status"], c["measured"]) == ("skip", "no nvidia module loaded")
    p = config.load(None)
    for q in (config.load(None, ["gpus.count=1"]), replace(p, p2p_module=replace(p.p2p_module, patched=False)),
              replace(p, p2p_module=replace(p.p2p_module, registry_dwords=""))):
        assert "field.static_bar1" not in judged(q)


def test_p29_acs_ports_unread_none_found_or_without_redirect():
    from p2pkit.core import config
    from p2pkit.parse import field as pf

    c = judged()["field.acs"]  # the VM: no bridge above the GPU
    assert c["measured"] == "could not check, because no bridge above the GPUs was found in sysfs"
    assert c["hint"].startswith("run by hand: sudo lspci")
    off = {"bdf": "0000:00:01.1", "ctl": 0, "flags": pf.acs_flags(0)}
    c = judged(acs={"ports": [off]})
    assert c["field.acs"]["status"] == "pass" and c["field.acs"]["measured"] == "no redirect on 0000:00:01.1"
    assert "field.acs.unread" not in c
    denied = {"bdf": "0000:00:03.1", "error": "readable by root only", "by_hand": "sudo lspci -vvv"}
    c = judged(acs={"ports": [off, denied]})
    assert c["field.acs"]["status"] == "pass" and c["field.acs.unread"]["status"] == "warn"
    assert c["field.acs.unread"]["measured"] == "could not check, because readable by root only"
    c = judged(acs={"ports": [denied]})
    assert "field.acs" not in c and c["field.acs.unread"]["hint"] == "run by hand: sudo lspci -vvv"
    c = judged(acs={"error": "lspci: not found"})["field.acs"]
    assert c["measured"] == "could not check, because lspci: not found" and c["hint"] == "rerun as root"
    assert "field.acs" not in judged(config.load(None, ["gpus.count=1"]), acs={"ports": [off]})


def test_p35_wedged_from_nvml_and_the_kernel_log_each_or_neither():
    nv = copy.deepcopy(FIELD_RUN["nvml"])
    nv["gpus"][0].update(util_gpu_pct=100, processes=[])
    bus = nv["gpus"][0]["bus_id"]
    c = judged(nvml=nv)["field.gpu_wedged"]
    assert c["status"] == "fail" and c["measured"] == f"{bus} 100% busy, no process" and c["pitfall"] == "P35"
    nv["gpus"][0]["util_gpu_pct"] = None  # not read: no claim
    assert judged(nvml=nv)["field.gpu_wedged"]["status"] == "pass"
    log = {"error": "dmesg: read kernel buffer failed: Operation not permitted"}
    c = judged(kernel_log=log)
    assert c["field.gpu_wedged"]["status"] == "pass"  # NVML still read
    assert c["field.gpu_wedged.kernel_log"]["measured"] == f"could not check, because {log['error']}"
    c = judged(kernel_log=log, nvml={"error": "NVML Shared Library Not Found"})
    assert c["field.gpu_wedged"]["measured"] == f"could not check, because {log['error']}"
    assert "field.gpu_wedged.kernel_log" not in c
    c = judged(nvml={"error": "NVML Shared Library Not Found"})
    assert c["field.gpu_wedged"]["status"] == "pass" and "field.gpu_wedged.kernel_log" not in c


def test_p36_boot_default_hold_warns_and_names_the_kernels():
    held = {"held": {"kernel": "6.8.0-88-generic", "new_kernel": "6.8.0-90-generic"}}
    c = judged(boot_hold=held)["field.boot_default"]
    assert c["status"] == "warn" and c["pitfall"] == "P36"
    # what modinfo -k NEW found, read with the hold (issue 49 item 5): here nothing
    assert c["measured"] == ("booting 6.8.0-88-generic: the P2P module did not build for 6.8.0-90-generic "
                             "(modinfo -k 6.8.0-90-generic: nothing)")
    assert "the new kernel 6.8.0-90-generic breaks" in c["hint"]
    assert "p2pkit restore --kernel 6.8.0-90-generic" in c["hint"]
    c = judged()["field.boot_default"]
    assert (c["status"], c["measured"], c["hint"]) == ("pass", "no hold", "")
    # a hold that could not be read is never a silent pass
    c = judged(boot_hold={"error": "unreadable"})["field.boot_default"]
    assert (c["status"], c["measured"]) == ("warn", "could not check, because unreadable")
