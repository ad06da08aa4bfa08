"""The dual-spark-vllm pair (seed 004): two simulated DGX Spark nodes from one Ansible inventory,
the worker's own values from its host vars, the worker started only after the head is up (P27),
RoCE devices resolved on each node (P24), NCCL proven on NET/IB (P23), flashinfer pinned (P25)."""

import json
import re

import pytest

from p2pkit.core import config
from p2pkit.parse.roce import rate_gbps
from p2pkit.stages.service import checks as service_checks
from p2pkit.stages.service.act import nccl_transports
from tests.test_inventory import controller

pytestmark = pytest.mark.slow


# What a healthy pair brought up with the built-in dual-spark-vllm profile warns, on real nodes as here:
SPARK_WARNINGS = {
    # a fresh node translates the GPU's DMA until the p2p-module stage puts iommu.passthrough=1 on its
    # command line: preflight says so before anything changed
    "preflight.iommu": "the kernel's default before p2pkit's change",
    # the fabric's subnet is the site's own: the built-in profile cannot name it, so the unit's IP filter
    # stays open until network.fabric_cidr is set
    "service.ip_filter": "network.fabric_cidr is the site's to set",
    # seed 004 serves 13 sequences for aggregate throughput, with MTP: P20 says what that costs per stream
    "service.spec_slots": "the profile's own choice (max-num-seqs = 13), named by P20",
}


def master_port(root) -> int:
    return config.load(str(root / ".p2pkit-sim/profile.toml")).serve.flags["master-port"]


def test_spark_pair_from_one_inventory(cli, sim, tmp_path):
    head, worker = sim("spark-head", "head"), sim("spark-worker", "worker")
    worker_sets = ["serve.flags.node-rank=1", "serve.flags.headless=true",
                   f"serve.flags.master-port={master_port(head)}"]
    # P27 first: the worker alone, its head not up, waits serve.head_wait_s and is then not started
    r = cli("--json", "--root", str(worker), *[a for x in worker_sets for a in ("--set", x)],
            "--set", "serve.head_wait_s=2", "up", "--reboot")
    assert r.code == 1, r.err
    c = json.loads((worker / "var/lib/p2pkit/service.json").read_text())["checks"][-1]
    assert c["id"] == "service.act" and f"127.0.0.1:{master_port(head)} did not answer within 2 s" in c["measured"]
    assert "P27" in c["hint"] and c["pitfall"] == "P27"  # the refusal carries its id (JUnit, Prometheus too)
    assert not (worker / "etc/systemd/system/p2pkit-engine.service").exists()  # nothing installed, nothing ran
    r = cli("--json", "--root", str(worker), *[a for x in worker_sets for a in ("--set", x)], "doctor")
    head_up = {c["id"]: c for g in r.json()["groups"] for c in g["checks"]}["service.head_up"]
    assert head_up["status"] == "fail" and head_up["pitfall"] == "P27" and "service.head_up" in r.json()["failed"]
    # then both nodes from one inventory, the worker's own values from its host vars
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"""all:
  hosts:
    spark-1: {{ansible_connection: local, p2pkit_root: {head}}}
    spark-2:
      ansible_connection: local
      p2pkit_root: {worker}
      p2pkit_set:
        serve.flags.node-rank: 1
        serve.flags.headless: true
        serve.flags.master-port: {master_port(head)}
        serve.head_wait_s: 1800
""")  # head_wait_s: the refused run above recorded 2 s as this host's state (overrides persist)
    r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--reboot")
    assert r.code == 0, r.out + r.err
    hosts = r.json()["hosts"]
    for h in ("spark-1", "spark-2"):
        st = hosts[h]["stages"]
        assert st.pop("rebar") == "n/a", hosts[h]  # one GPU per node: no BAR1 P2P
        assert set(st.values()) == {"done"}, hosts[h]
    # P27: the worker started after the head's rendezvous port was open, and waited for it
    log = (head / "var/log/p2pkit/p2pkit-engine.service.log").read_text()
    opened = float(re.search(r"rendezvous at \S+ open at ([\d.]+)", log).group(1))
    acted = json.loads((worker / "var/lib/p2pkit/service.json").read_text())["acted"]
    assert acted["head"]["ok"] and acted["head"]["up_at"] >= opened and acted["started_at"] > opened
    # P24: each node resolved its own RDMA device for the same cabled port, at its unit's start
    env = {n: (root / "run/p2pkit-engine/nccl.env").read_text() for n, root in (("head", head), ("worker", worker))}
    assert "NCCL_IB_HCA=rocep1s0f0:1" in env["head"] and "NCCL_IB_HCA=rocep1s0f1:1" in env["worker"]
    unit = (worker / "etc/systemd/system/p2pkit-engine.service").read_text()
    assert "net hca --env-file /run/p2pkit-engine/nccl.env" in unit and "--set serve.flags.node-rank=1" in unit
    assert "--headless" in unit and "--port" not in unit  # a headless worker serves no API
    engine_env = (head / "etc/p2pkit/engine.env").read_text()  # the profile's [serve.env] (P26), NCCL's debug (P23)
    assert re.search(r'^VLLM_PLE_MMAP_DIR="?/var/lib/vllm/ple-table"?$', engine_env, re.M)  # the env writer quotes
    assert re.search(r'^NCCL_DEBUG="?INFO"?$', engine_env, re.M)
    model = {c["id"]: c for c in json.loads((head / "var/lib/p2pkit/model.json").read_text())["checks"]}
    assert model["model.nvme./var/lib/vllm/ple-table"]["status"] == "pass"
    # P23 on both nodes; the head's /health only after the worker joined; the worker joined by NCCL
    for root, extra in ((head, "service.health"), (worker, "service.joined")):
        checks = {c["id"]: c for c in json.loads((root / "var/lib/p2pkit/service.json").read_text())["checks"]}
        assert checks["service.nccl_transport"]["status"] == "pass" and checks[extra]["status"] == "pass"
    # the kernel modules are NVIDIA's own (no P2P patch) and the fabric ran at its rate
    link = {c["id"]: c for c in json.loads((worker / "var/lib/p2pkit/link.json").read_text())["checks"]}
    assert link["link.fabric_rate.rocep1s0f1:1"]["status"] == "pass" and "link.p2p_pair" not in link
    # status from the same inventory: the host vars apply again, so nothing reads as stale
    r = cli(*controller(tmp_path), "--json", "status", "--inventory", str(inv))
    assert r.code == 0 and r.json()["hosts"]["spark-2"]["stages"]["service"] == "done", r.out
    # healthy nodes warn only where a real healthy pair does (issue 41): SPARK_WARNINGS, each with why;
    # every fact reads (the engine's mapped NCCL too: the running vLLM's venv NCCL, P37)
    for root in (head, worker):
        warned = {c["id"] for f in sorted((root / "var/lib/p2pkit").glob("*.json"))
                  for c in json.loads(f.read_text()).get("checks", []) if c.get("status") == "warn"}
        assert warned == set(SPARK_WARNINGS), (root.name, warned)
        doc = cli("--root", str(root), "--json", "doctor").json()
        warned = {c["id"] for g in doc["groups"] for c in g["checks"] if c["status"] == "warn"}
        assert warned <= set(SPARK_WARNINGS) - {"preflight.iommu"}, (root.name, warned)  # iommu=pt is on now
        floor = {c["id"]: c for g in doc["groups"] for c in g["checks"]}["field.nccl_floor.engine"]
        assert floor["status"] == "pass" and "2.29.3" in floor["measured"], floor
        s = cli("--root", str(root), "status")
        assert s.code == 0 and "WARN" not in s.out + s.err and "warning" not in s.err, s.out + s.err
        rep = cli("--root", str(root), "--json", "report", str(tmp_path / f"{root.name}.tar.gz")).json()
        import tarfile

        with tarfile.open(tmp_path / f"{root.name}.tar.gz") as tar:
            inside = json.loads(tar.extractfile("p2pkit-report/report.json").read())
        # a command that did not answer in time on a loaded test machine is that machine's, not the node's
        unread = {k: v for k, v in inside["facts_not_read"].items() if "did not answer within" not in v}
        assert rep["left_out"] == [] and unread == {} and "engine_nccl" not in inside["facts_not_read"], unread
    bench_on_the_head(cli, head)


def bench_on_the_head(cli, head):
    """`p2pkit bench` on the head: the simulated vLLM's own /metrics (vLLM's names and shapes, read
    around each request) are the figures; the deltas the test reads itself agree; not the client's clock."""
    from p2pkit.host import engine_api
    from p2pkit.parse import engine_api as pe
    from p2pkit.rules import engine_cmd

    base = engine_cmd.base_url(config.load(str(head / ".p2pkit-sim/profile.toml")))
    before = engine_api.metrics(base, "vllm:")
    r = cli("--root", str(head), "--json", "bench", "--requests", "3", "--warmup", "1", "--prompt-tokens", "16",
            "--output-tokens", "24")
    assert r.code == 0, r.err[-2000:]
    d = pe.deltas(before["values"], engine_api.metrics(base, "vllm:")["values"])
    doc = r.json()
    arm, reqs = doc["arms"][0], doc["arms"][0]["requests"]
    assert doc["engine"] == "vllm" and doc["accounting"].startswith("vLLM's own") and len(reqs) == 3
    # the whole run moved the counters by the warm-up plus the three timed requests, no more
    assert d["request_decode_time_seconds_count"] == 4 and d["generation_tokens_total"] == 4 * 24
    assert d["prompt_tokens_total"] == 4 * 16 == 16 + sum(x["prompt_n"] for x in reqs)
    m = arm["metrics_delta"]  # the timed requests' own deltas
    assert m["generation_tokens_total"] == sum(x["predicted_n"] for x in reqs) == 72
    assert m["request_decode_time_seconds_sum"] * 1000 == pytest.approx(sum(x["predicted_ms"] for x in reqs), rel=1e-3)
    for x in reqs:
        assert x["usage"]["completion_tokens"] == x["predicted_n"] and x["usage"]["prompt_tokens"] == x["prompt_n"]
        assert x["decode_tps"] == pytest.approx(23 / (x["predicted_ms"] / 1000), rel=1e-3)
        assert x["draft_n"] > 0 and 0 < x["draft_accepted"] <= x["draft_n"]  # MTP k=3 (seed 004)
        assert x["client_tps"] < x["decode_tps"] / 2  # the server's own clock, never the client's (P15)
    assert arm["summary"]["metrics_decode_tps"] == pytest.approx(
        (72 - 3) / m["request_decode_time_seconds_sum"], rel=1e-3)


@pytest.mark.parametrize("scenario, stop, check, pitfall", [
    ("spark-fabric-down", "topology", "topology.roce", "P24"),
    ("spark-old-flashinfer", "engine", "engine.pin.flashinfer-python", "P25"),
    ("spark-unpatched-vllm", "engine", "engine.vllm_sm121", "P21"),
])
def test_spark_node_failures(cli, sim, scenario, stop, check, pitfall):
    root = sim(scenario)
    r = cli("--json", "--root", str(root), "up", "--reboot", "--to", stop)
    assert r.code == 1, r.err
    doc = json.loads((root / f"var/lib/p2pkit/{stop}.json").read_text())
    bad = [c for c in doc["checks"] if c["status"] == "fail"]
    assert [c["id"] for c in bad] == [check] and bad[0]["pitfall"] == pitfall


def test_nccl_transports_in_real_nccl_lines():
    from pathlib import Path

    lines = (Path(__file__).parent / "fixtures/nccl/channels.txt").read_text().splitlines()
    assert nccl_transports(lines) == ["NET/IB", "NET/IBext_v8", "NET/Socket", "P2P/IPC", "P2P/direct pointer"]
    p = config.load("dual-spark-vllm")
    assert service_checks._nccl(nccl_transports(lines[:3]), p).status == "pass"  # the plugin is RDMA too
    assert service_checks._nccl(nccl_transports(lines), p).status == "fail"  # one channel on sockets is one too many


def test_nccl_transport_read_from_the_log():
    p = config.load("dual-spark-vllm")
    ib = ["h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0"]
    sock = ["h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"]
    assert nccl_transports(ib) == ["NET/IB"] and nccl_transports(sock) == ["NET/Socket"]
    assert service_checks._nccl(nccl_transports(ib), p).status == "pass"
    c = service_checks._nccl(nccl_transports(sock), p)
    assert c.status == "fail" and c.pitfall == "P23"
    assert service_checks._nccl([], p).status == "fail"  # no NCCL_DEBUG line: cannot tell, so not a pass


def test_port_rate_parsed():
    assert rate_gbps("200 Gb/sec (4X HDR)\n") == 200.0 and rate_gbps("25 Gb/sec (1X EDR)") == 25.0
    assert rate_gbps("") is None and rate_gbps("garbage") is None


@pytest.mark.parametrize("sets, check", [
    ([], None),
    (["serve.flags.node-rank=1"], "service.headless"),  # a worker that would serve the API
    (["serve.flags.master-port=abc"], "service.rendezvous"),
    (["serve.flags.node-rank=5", "serve.flags.headless=true"], "service.node_rank"),
    (["serve.flags.tensor-parallel-size=1"], "service.tp"),
])
def test_multi_node_flags_refused_before_start(sets, check):
    from p2pkit.rules import engine_cmd

    p = config.load("dual-spark-vllm", ["serve.flags.master-addr=10.10.0.1", *sets])
    failed = [c.id for c in engine_cmd.validate(p) if c.status == "fail"]
    assert failed == ([check] if check else [])


def test_sim_init_of_a_spark_node_names_its_rendezvous_port(cli, tmp_path):
    """`sim init` of a Spark node says the rendezvous its profile's master-port gives (read through the vLLM
    engine module's node, not from the flags by name in the CLI)."""
    r = cli("sim", "init", str(tmp_path / "head"), "--scenario", "spark-head")
    assert r.code == 0, r.err
    port = master_port(tmp_path / "head")
    assert isinstance(port, int) and f"(rendezvous 127.0.0.1:{port} when it is the head)" in r.out + r.err


def test_head_without_workers_says_so():
    p = config.load("dual-spark-vllm", ["serve.flags.master-addr=10.10.0.1"])
    s = {"role": "head", "analyze": {"verify_rc": 0, "verify_issues": [], "exposure": 1.9, "exposure_label": "OK"},
         "health": {"ok": False, "seconds": 120.0, "codes": [503], "exited": False},
         "pid_cgroup": {"v2_path": "/p2pkit.slice/x", "v1_memory_path": None, "memory_caps": []},
         "listen": {"connect": True, "addresses": ["127.0.0.1:8086"]}, "nccl_transports": [],
         "log_tail": ["INFO rendezvous at 10.10.0.1:29511 open: waiting for 1 node(s)"], "likely_cause": None}
    c = {c.id: c for c in service_checks.check({"service": s}, p)}
    assert c["service.health"].status == "fail" and c["service.health"].pitfall == "P27"
    assert "every worker node has joined" in c["service.health"].hint
    assert c["service.nccl_transport"].status == "fail"  # no communicator yet: nothing proves RoCE


def test_link_where_nvml_reports_no_pcie_link():
    """A GPU whose NVML answers NOT_SUPPORTED for the PCIe link (the worker records None) is not a
    crash: on a one-GPU node it is a skip, and the fabric is still judged; with a GPU pair it fails."""
    from dataclasses import replace

    from p2pkit.stages.link import checks as link

    p = config.load("dual-spark-vllm")
    g = {"index": 0, "idle": {"gen": None, "width": None}, "max_seen": {"gen": None, "width": None},
         "trained_after_s": None, "replay_before": None, "replay_after": None, "app_clocks_reason_under_load": False,
         "host": {"h2d_gbps": 80.0, "d2h_gbps": 80.0}}
    f = {"link_load": {"gpus": [g], "pairs": [], "device_count": 1, "load_seconds": 3.0},
         "roce": [{"device": "rocep1s0f0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
                   "netdevs": ["enp1s0f0np0"], "rate": "100 Gb/sec (2X HDR)", "rate_gbps": 100.0}]}
    c = {c.id: c for c in link.check(f, p)}
    assert c["link.trained.gpu0"].status == "skip" and "no PCIe link" in c["link.trained.gpu0"].measured
    assert c["link.fabric_rate.rocep1s0f0:1"].status == "fail"  # 100 Gb/s on a 200 Gb/s fabric
    pair = replace(p, gpus=replace(p.gpus, count=2))
    assert {c.id: c for c in link.check(f, pair)}["link.trained.gpu0"].status == "fail"


def test_doctor_does_not_judge_a_stage_that_does_not_apply(sim):
    """On a one-GPU node doctor says rebar does not apply, as up and verify do, even when BAR1 is small."""
    from p2pkit.app import doctor
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host
    from p2pkit.stages import registry

    h = Host.at(sim("spark-head"))
    p = config.load(h.sim["profile"])
    found = facts.collect(h, sorted({n for st in registry() for n in st.facts}), p)
    for g in found["pci_gpus"]:
        g["bar1_bytes"] = 256 << 20  # what rebar would fail on, were it judged
    report = doctor.judge(found, p, simulated=True)
    rebar = next(g for g in report["groups"] if g["stage"] == "rebar")["checks"]
    assert [c["id"] for c in rebar] == ["rebar.applies"] and rebar[0]["status"] == "skip"
    assert not [f for f in report["failed"] if f.startswith("rebar.")]


def _sm121_patch(root, tmp_path) -> bytes:
    """The sm_121 patch as `git diff` writes it, made against the node's own unpatched tree (the simulated PR
    branch of scenario spark-unpatched-vllm): the two files the seed's patch changes, as the patched tree has them."""
    import shutil
    import subprocess

    from p2pkit.sim.provision import NVFP4_UTILS, VLLM_CMAKELISTS

    work = tmp_path / "patch-work"
    shutil.copytree(root / ".p2pkit-sim/git/vllm-work", work, symlinks=True)
    (work / "CMakeLists.txt").write_text(VLLM_CMAKELISTS)
    (work / "csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh").write_text(NVFP4_UTILS)
    return subprocess.run(["git", "-C", str(work), "diff"], capture_output=True, check=True).stdout


def test_a_patch_is_checked_against_the_pinned_tree_before_anything_is_built(cli, sim, tmp_path):
    """engine.patches: a pinned patch made against another tree stops the engine stage naming it and what git
    said, with nothing built (no environment at the prefix); the same stage then takes the right patch, applies
    it and proves the tree carries it (engine.vllm_sm121, from the tree's files); a second run applies nothing."""
    import hashlib

    root = sim("spark-unpatched-vllm")
    patch = root / "opt/p2pkit/patches/vllm-sm121.patch"
    patch.parent.mkdir(parents=True)
    good = _sm121_patch(root, tmp_path)
    # made against another tree: its context is not in this one
    patch.write_bytes(good.replace(b"CMakeLists.txt", b"cmake/other.cmake"))
    pin = f'engine.patches=["{hashlib.sha256(patch.read_bytes()).hexdigest()}  /opt/p2pkit/patches/vllm-sm121.patch"]'
    r = cli("--root", str(root), "--set", pin, "up", "--reboot", "--to", "engine")
    assert r.code == 1, r.out + r.err
    assert "the patch /opt/p2pkit/patches/vllm-sm121.patch does not apply" in r.err, r.err
    assert "git apply --check:" in r.err and "nothing was built" in r.err, r.err
    assert not (root / "opt/vllm").exists()  # the prefix: nothing half-installed serving
    # the pinned sha256 no longer matches the file: refused before git is asked
    patch.write_bytes(good)
    r = cli("--root", str(root), "--set", pin, "up", "--to", "engine")
    assert r.code == 1 and "the profile pins" in r.err, r.err
    pin = f'engine.patches=["{hashlib.sha256(good).hexdigest()}  /opt/p2pkit/patches/vllm-sm121.patch"]'
    r = cli("--root", str(root), "--json", "--set", pin, "up", "--to", "engine")
    assert r.code == 0, r.err
    doc = json.loads((root / "var/lib/p2pkit/engine.json").read_text())
    assert {c["id"]: c["status"] for c in doc["checks"]}["engine.vllm_sm121"] == "pass"
    r = cli("--root", str(root), "--set", pin, "up", "--from", "engine", "--to", "engine", "--force")  # again
    assert r.code == 0, r.err
    log = (root / "var/lib/p2pkit/logs/engine.log").read_text()
    recap = re.search(r"changed=(\d+)", log.split("PLAY RECAP")[-1])
    assert recap and recap.group(1) == "0", log[-3000:]  # the patch is in the tree: git applies nothing again


def test_a_model_file_the_engines_user_cannot_read_is_named_without_waiting_for_health(cli, sim):
    """A checkpoint served as it is (format hf): a file in it that root wrote 0600 (a download through a temporary
    file leaves it so) stops vLLM's workers at every start ("No such file or directory", seen on the container
    host), and the unit's restarts kept the health wait going to its timeout. The service stage reads what the
    engine's user reaches first: it names the file and does not wait."""
    import time

    root = sim("spark-head")
    src = config.load(str(root / ".p2pkit-sim/profile.toml")).model.source
    shard = sorted((root / src.lstrip("/")).glob("*.safetensors"))[0]
    shard.chmod(0o600)
    # the engine's account as a real box has it, not root: the simulated host makes it with this machine's uid 0
    # (its engine runs as whoever runs the tests), which reads anything
    for f, line in (("etc/passwd", "p2pkit-engine:x:64000:64000::/nonexistent:/usr/sbin/nologin\n"),
                    ("etc/group", "p2pkit-engine:x:64000:\n")):
        with open(root / f, "a") as fh:
            fh.write(line)
    t0 = time.monotonic()
    r = cli("--json", "--root", str(root), "--set", "serve.health_timeout_s=600", "up", "--reboot")
    took = time.monotonic() - t0
    assert r.code == 1, r.err[-2000:]
    doc = json.loads((root / "var/lib/p2pkit/service.json").read_text())
    checks = {c["id"]: c for c in doc["checks"]}
    reach, health = checks["service.user_access"], checks["service.health"]
    where = f"{src}/{shard.name}"
    assert reach["status"] == "fail" and f"{where} (-rw-------" in reach["measured"], reach
    assert health["status"] == "fail", health
    assert "not waited for: the engine's user p2pkit-engine cannot load what it reads" in health["measured"], health
    assert "service.user_access" in health["hint"], health
    assert took < 600, took  # not the health timeout: the wait was never started
