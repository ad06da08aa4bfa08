"""Pitfalls judged over the real formats (issue 18): each test fails when its detection is removed."""

from p2pkit.core.ansible import COLLECTION
from p2pkit.parse import build as pb
from p2pkit.stages.engine import checks as ec
from p2pkit.stages.engine import cmake
from p2pkit.stages.engine import vllm as vllm_stage
from tests.conftest import FIXTURES

CM = FIXTURES / "cmake"


def cm(name):
    return (CM / name).read_text()


def test_first_build_meets_p07_from_the_log_alone():
    crit = pb.ninfer_criteria(cm("first_configure.txt").replace("13.0.88", "13.1.80") + cm("first_build.txt"))
    assert all(crit.values()), crit
    assert crit["found libavformat"] == "60.16.100 (build log)" and crit["linked apps/ninfer-serve"] == \
        "linked in this build"


def test_real_reconfigure_and_noop_build_print_neither_found_nor_link_lines():
    log = cm("reconfigure.txt") + cm("noop_build.txt")
    crit = pb.ninfer_criteria(log)  # the log alone, as p2pkit judged it before: a rebuild "fails"
    assert crit["found CUDAToolkit 13.1 or newer"] is None and crit["found libavformat"] is None
    assert crit["linked apps/ninfer-serve"] is None and pb.ninja_no_work(cm("noop_build.txt"))


def test_rebuild_proven_from_cmake_cache_and_ninja():
    cache = pb.cmake_cache(cm("CMakeCache.txt"))
    assert cache["FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit"].endswith("[v13.0.88()]")
    log = cm("reconfigure.txt") + cm("noop_build.txt")
    crit = pb.ninfer_criteria(log, cache, up_to_date=True)
    # the recorded toolkit is 13.0: found, and judged too old from the cache as from a log line
    assert crit["found CUDAToolkit 13.1 or newer"] is None
    assert crit["found libavformat"] == "60.16.100 (CMakeCache.txt)"
    assert crit["linked apps/ninfer-serve"] == "up to date (ninja -n: no work to do)"
    newer = {**cache, "FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit": "[/usr/local/cuda/include][v13.1.80()]"}
    assert pb.ninfer_criteria(log, newer, up_to_date=True)["found CUDAToolkit 13.1 or newer"] == \
        "13.1 (CMakeCache.txt)"
    assert pb.ninfer_criteria(log, newer, up_to_date=False)["linked apps/ninfer-serve"] is None


def test_cmake_cache_module_found_among_several():
    cache = {"FFMPEG_FOUND": "1", "FFMPEG_libavformat_VERSION": "61.1.100", "FFMPEG_VERSION": ""}
    assert pb.ninfer_criteria("", cache)["found libavformat"] == "61.1.100 (CMakeCache.txt)"
    assert pb.ninfer_criteria("", {**cache, "FFMPEG_FOUND": "0"})["found libavformat"] is None


def test_build_log_check_names_p07_and_the_rebuild():
    b = {"source": {"head": "abc1234"}, "cuda": {"version": "13.1"}, "pkg_config": {}, "log": "/l",
         "configure_rc": 0, "build_rc": 0, "binary": {"runs": True}, "libraries": [{"name": "x", "path": "/x"}],
         "criteria": pb.ninfer_criteria(cm("reconfigure.txt") + cm("noop_build.txt"))}
    from p2pkit.core import config

    c = {x.id: x for x in ec.check({"engine_build": b}, config.load(None))}
    assert c["engine.build_log"].status == "fail" and c["engine.build_log"].pitfall == "P07"
    assert "--from engine --force" in c["engine.build_log"].hint


# ------------------------------------------------------------------------------------------- P02

def test_dpkg_query_status_abbrev_read_as_the_driver_playbook_reads_it():
    from p2pkit.parse import system as ps

    # `dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n'` on Debian 12 (two spaces: the third
    # column of the abbreviation is blank); 'hi' is a held package (dpkg-query(1)), 'rc' removed
    text = "ii  adduser\nhi  nvidia-firmware-580-580.95.05\nrc  nvidia-dkms-570\nun  nvidia-kernel-common\n"
    assert ps.dpkg_installed(text) == ["adduser", "nvidia-firmware-580-580.95.05"]
    # the held ones, as `apt-mark showhold` lists them from the same database (tests/test_playbooks.py
    # reads the real apt-mark on the simulated host: the same one package); 'rc' kept its hold too
    assert ps.dpkg_held(text) == ["nvidia-firmware-580-580.95.05"]
    assert ps.dpkg_held(text + "hc  nvidia-dkms-580\n") == ["nvidia-firmware-580-580.95.05", "nvidia-dkms-580"]
    held = "Package: nvidia-firmware-580\nStatus: hold ok installed\n\nPackage: nvidia-dkms-580\nStatus: install ok " \
           "half-configured\n"
    assert ps.dpkg_nvidia_problems(held) == [("nvidia-dkms-580", "install ok half-configured")]


def test_an_unheld_nvidia_package_is_p02_with_restore_as_the_fix():
    from p2pkit.stages.driver import checks as driver

    h = {"installed": ["adduser", "libnvidia-compute-615", "nvidia-firmware-580-580.95.05"],
         "held": ["nvidia-firmware-580-580.95.05"]}
    c = driver.holds(h)
    assert c.status == "fail" and c.pitfall == "P02" and "libnvidia-compute-615" in c.measured
    assert "p2pkit restore" in c.hint
    assert driver.holds({**h, "held": h["installed"]}).status == "pass"
    assert driver.holds({"error": "apt-mark: not found"}).status == "fail"


def test_guarded_packages_are_the_driver_playbooks():
    import yaml

    from p2pkit.stages.driver import checks as driver
    from tests.conftest import REPO

    d = yaml.safe_load((REPO / COLLECTION / "roles/p2pkit_driver/defaults/main.yml").read_text())
    assert tuple(d["p2pkit_driver_guarded_packages"]) == driver.GUARDED_PACKAGES


def test_restore_guards_read_from_the_files_systemctl_and_the_stage_write(tmp_path):
    from p2pkit.host import Host, system
    from p2pkit.stages.p2p_module import checks as p2p_module

    root = tmp_path
    units = root / "etc/systemd/system"
    (units / "timers.target.wants").mkdir(parents=True)
    (units / "p2pkit-restore.service").write_text("ExecStart=/usr/bin/p2pkit restore\n")
    (units / "p2pkit-restore.timer").write_text("[Timer]\n")
    # what `systemctl --root enable` writes: an absolute link, meaning the host's /, not this machine's
    (units / "timers.target.wants/p2pkit-restore.timer").symlink_to("/etc/systemd/system/p2pkit-restore.timer")
    hook = root / "etc/kernel/postinst.d/zz-p2pkit"
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\np2pkit restore --kernel \"$1\"\n")
    hook.chmod(0o755)
    apt = root / "etc/apt/apt.conf.d/99p2pkit-restore"
    apt.parent.mkdir(parents=True)
    apt.write_text('DPkg::Post-Invoke { "systemctl start --no-block p2pkit-restore.service"; };\n')
    h = Host(root=root)
    assert all(system.restore_guards(h).values())
    assert p2p_module.safeguards(system.restore_guards(h)).status == "pass"
    hook.chmod(0o644)  # a hook that is not executable never runs
    (units / "p2pkit-restore.timer").unlink()
    (units / "p2pkit-restore.timer").symlink_to("/dev/null")  # masked
    g = system.restore_guards(h)
    assert not g["kernel postinst hook"] and not g["restore timer enabled"] and g["apt hook"]
    c = p2p_module.safeguards(g)
    assert c.status == "fail" and c.pitfall == "P02" and "p2pkit restore" in c.hint
    assert c.measured == "missing: restore timer enabled, kernel postinst hook"


# ------------------------------------------------------------------------------------ P16 (path)

def test_nccl_install_path_compared_by_path_not_by_string():
    from dataclasses import replace

    from p2pkit.core import config

    p = config.load("dual-5090-llamacpp")
    p = replace(p, engine=replace(p.engine, nccl_root="/opt/nccl"))

    def check(path):
        libs = [{"name": "libnccl.so.2", "path": path}]
        b = {"source": {"head": "x"}, "cuda": {"version": "13.1"}, "pkg_config": {}, "log": "/l", "configure_rc": 0,
             "build_rc": 0, "binary": {"runs": True}, "libraries": libs, "nccl_links": {"llama-server": libs}}
        return {c.id: c for c in ec.check({"engine_build": b}, p)}["engine.nccl.llama-server"]

    assert check("/opt/nccl/lib/libnccl.so.2").status == "pass"
    bad = check("/opt/nccl-2.18.3/lib/libnccl.so.2")  # a string prefix of /opt/nccl, another directory
    assert bad.status == "fail" and bad.pitfall == "P16"
    assert check("/opt/nccl/../nccl-2.18.3/lib/libnccl.so.2").status == "fail"
    assert cmake.under("/opt/nccl/lib/libnccl.so.2", "/opt/nccl/") and not cmake.under("/opt/nccl2/x", "/opt/nccl")


# ------------------------------------------------------------------------------------------- P27

def test_p27_refusal_carries_its_id_in_junit_and_prometheus():
    from p2pkit.app import reports

    refusal = {"id": "service.act", "title": "service: act", "status": "fail", "pitfall": "P27",
               "measured": "the head's rendezvous port 10.0.0.1:29500 did not answer within 1800 s",
               "expected": "the playbook to succeed", "hint": "start the head node first"}
    results = [{"stage": "service", "status": "fail", "checks": [refusal]}]
    xml = reports.junit(results, simulated=False).decode()
    assert 'message="[P27] measured' in xml and "pitfall P27" in xml
    from prometheus_client import generate_latest

    prom = generate_latest(reports.prometheus(results, {}, simulated=False, profile="dual-spark-vllm")).decode()
    line = next(x for x in prom.splitlines() if x.startswith("p2pkit_check_failed{"))
    assert 'check="service.act"' in line and 'pitfall="P27"' in line and line.endswith(" 1.0")


def test_worker_whose_head_is_down_is_p27_in_doctor():
    import socket

    from p2pkit.core import config
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host
    from p2pkit.stages.service import checks as service

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = config.load("dual-spark-vllm", ["serve.flags.node-rank=1", "serve.flags.headless=true",
                                        "serve.flags.master-addr=127.0.0.1", f"serve.flags.master-port={port}"])
    h = facts.collect(Host(), ["head_rendezvous"], p)["head_rendezvous"]
    assert h["role"] == "worker" and h["up"] is False
    c = service.head_up(h)[0]
    assert c.status == "fail" and c.pitfall == "P27"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", port))
        srv.listen()
        assert service.head_up(facts.collect(Host(), ["head_rendezvous"], p)["head_rendezvous"])[0].status == "pass"
    assert service.head_up({"role": "head"}) == []


# ------------------------------------------------------------------------------------------- P21

def spark(**engine):
    from dataclasses import replace

    from p2pkit.core import config

    p = config.load("dual-spark-vllm")
    return replace(p, engine=replace(p.engine, **engine))


def tree(**kw):
    lists = pb.cmake_arch_lists((FIXTURES / "vllm/CMakeLists-main-excerpt.txt").read_text())
    return {"path": "/opt/vllm-src", "head": "a" * 40, "branch": "release/qwen38next", "branches_with_head": [],
            "arch_lists": lists, "sm121_e2m1": True, **kw}


def test_vllm_arch_lists_read_from_the_real_cmakelists():
    lists = pb.cmake_arch_lists((FIXTURES / "vllm/CMakeLists-main-excerpt.txt").read_text())
    assert lists["CUDA_SUPPORTED_ARCHS"][0][-1] == "12.0" and lists["CUDA_SUPPORTED_ARCHS"][1][-1] == "12.1"
    assert lists["SCALED_MM_ARCHS"] == [["9.0a"], ["12.0f"], ["12.0a", "12.1a"]]
    assert pb.names_arch(["12.0a", "12.1a"], "12.1") and not pb.names_arch(["12.0f"], "12.1")
    assert not pb.names_arch(["12.10"], "12.1")


def test_vllm_tree_branch_commit_and_sm121_patch():
    p = spark(commit="a" * 40)
    c = {x.id: x for x in vllm_stage.vllm_tree_checks(tree(), p)}
    assert c["engine.vllm_source"].status == "pass" and c["engine.vllm_sm121"].status == "pass"
    # main's lists name 12.1 only in the pre-CUDA-13 branches, but the E2M1 fallback is the patch's own
    c = {x.id: x for x in vllm_stage.vllm_tree_checks(tree(sm121_e2m1=False), p)}
    assert c["engine.vllm_sm121"].status == "fail" and c["engine.vllm_sm121"].pitfall == "P21"
    assert "E2M1" in c["engine.vllm_sm121"].measured
    cuda13 = {k: v[:1] if k == "CUDA_SUPPORTED_ARCHS" else [x for x in v if "12.1a" not in x]
              for k, v in tree()["arch_lists"].items()}  # what a CUDA 13 build's lists leave
    bad = {x.id: x for x in vllm_stage.vllm_tree_checks(tree(arch_lists=cuda13), p)}["engine.vllm_sm121"]
    assert bad.status == "fail" and "CUDA_SUPPORTED_ARCHS" in bad.measured and "FP4_SM120_ARCHS" in bad.measured
    wrong = {x.id: x for x in vllm_stage.vllm_tree_checks(tree(branch="main"), p)}["engine.vllm_source"]
    assert wrong.status == "fail" and wrong.pitfall == "P21" and "main" in wrong.measured
    other = {x.id: x for x in vllm_stage.vllm_tree_checks(tree(head="b" * 40), p)}["engine.vllm_source"]
    assert other.status == "fail"
    assert [x.id for x in vllm_stage.vllm_tree_checks(tree(), spark(commit="a" * 40, cuda_architectures="120a"))] == \
        ["engine.vllm_source"]  # no GB10: no sm_121 patch asked for
    assert vllm_stage.vllm_tree_checks({"path": "/opt/vllm-src", "error": "not a git checkout"}, p)[0].status == "fail"


def test_builtin_spark_profile_cannot_prove_its_vllm_tree():
    """The seed's vLLM commit is not public: the built-in profile pins none, and the stage says the
    tree cannot be proven (a failure, not the warning it was)."""
    p = spark()
    assert p.engine.commit == "" and p.engine.branch == "release/qwen38next"
    env = {"vllm": {"version": "0.11.1.dev53896+gabc1234", "file": "/opt/vllm/x"}, "pins": {}}
    c = {x.id: x for x in vllm_stage._vllm(env, p)}["engine.vllm_tree"]
    assert c.status == "fail" and "cannot be proven" in c.measured and c.pitfall == "P21"
    assert {x.id: x for x in vllm_stage.vllm_tree_checks(tree(), p)}["engine.vllm_source"].status == "fail"


# ------------------------------------------------------------------------------------------- P20

def test_llamacpp_several_slots_with_speculative_decoding_warns():
    from p2pkit.core import config
    from p2pkit.rules import engine_cmd

    p = config.load("dual-5090-llamacpp")
    assert {c.id: c for c in engine_cmd.validate(p)}["service.spec_slots"].status == "pass"  # --parallel 1
    c = {c.id: c for c in engine_cmd.validate(config.load("dual-5090-llamacpp", ["serve.flags.parallel=4"]))}
    assert c["service.spec_slots"].status == "warn" and c["service.spec_slots"].pitfall == "P20"
    assert c["service.spec_slots"].value == 4 and "one concurrent slot" in c["service.spec_slots"].hint
    off = config.load("dual-5090-llamacpp", ["serve.flags.parallel=4"])
    from dataclasses import replace

    off = replace(off, serve=replace(off.serve, flags={k: v for k, v in off.serve.flags.items() if k != "spec-type"}))
    assert "service.spec_slots" not in {c.id for c in engine_cmd.validate(off)}  # no drafting: nothing to warn


def test_vllm_max_num_seqs_with_mtp_warns():
    from p2pkit.core import config
    from p2pkit.rules import engine_cmd

    c = {c.id: c for c in engine_cmd.validate(config.load("dual-spark-vllm"))}["service.spec_slots"]
    assert c.status == "warn" and c.pitfall == "P20" and c.value == 13  # the seed's own setting
    one = config.load("dual-spark-vllm", ["serve.flags.max-num-seqs=1"])
    assert {c.id: c for c in engine_cmd.validate(one)}["service.spec_slots"].status == "pass"


# ------------------------------------------------------------------------------------------- P26

def test_madv_random_read_from_real_smaps():
    from p2pkit.parse import system as ps
    from p2pkit.stages.service import checks as service

    maps = ps.smaps_mappings((FIXTURES / "smaps/smaps_madv_random.txt").read_text())
    assert [m["path"] for m in maps] == ["[heap]", "/tmp/ple-table.bin", "/tmp/ple-table.bin"]
    assert sorted("rr" in m["flags"] for m in maps[1:]) == [False, True]  # one advised, one plain
    table = [{"pid": 7, **m} for m in maps if m["path"].startswith("/tmp/")]
    advised = [m for m in table if "rr" in m["flags"]]
    c = service.madv_random({"pid": 7, "directory": "/tmp", "mappings": advised})
    assert c.status == "pass" and c.pitfall == "P26"
    c = service.madv_random({"pid": 7, "directory": "/tmp", "mappings": table})  # one mapping without rr
    assert c.status == "fail" and c.pitfall == "P26" and "/tmp/ple-table.bin" in c.measured
    c = service.madv_random({"pid": 7, "directory": "/var/lib/vllm/ple-table", "mappings": []})
    assert c.status == "fail" and "VLLM_PLE_MMAP" in c.hint


def test_madv_random_on_a_live_process(tmp_path):
    """The probe reads a real process's smaps through the host root: MADV_RANDOM shows, plain does not."""
    import mmap

    from p2pkit.host import Host, system

    d = tmp_path / "ple-table"
    d.mkdir()
    (d / "a.bin").write_bytes(b"x" * 8192)
    with open(d / "a.bin", "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    import os

    pid = os.getpid()
    got = system.mapped_under(Host(), pid, str(d))
    assert got["mappings"] and all("rr" not in x["flags"] for x in got["mappings"])
    m.madvise(mmap.MADV_RANDOM)
    got = system.mapped_under(Host(), pid, str(d))
    assert got["mappings"] and all("rr" in x["flags"] for x in got["mappings"])
    m.close()


def test_ple_mmap_off_is_refused_before_start():
    from p2pkit.core import config
    from p2pkit.rules import engine_cmd

    on = {c.id: c for c in engine_cmd.validate(config.load("dual-spark-vllm"))}["service.ple_mmap"]
    assert on.status == "pass"
    off = {c.id: c for c in engine_cmd.validate(config.load("dual-spark-vllm", ["serve.env.VLLM_PLE_MMAP=0"]))}
    assert off["service.ple_mmap"].status == "fail" and off["service.ple_mmap"].pitfall == "P26"


# ------------------------------------------------------------------------------------------- P18

def gib(x):
    return int(x * (1 << 30))


SHAPE = {"layers": 64, "kv_heads": 4, "head_dim_k": 256, "head_dim_v": 256, "draft_layers": 1,
         "weights_bytes": gib(50), "context_length": 262144}


FREE = (gib(31.5), gib(31.5))


def fit_checks(shape=None, free=FREE, sets=(), refused=False):
    from p2pkit.core import config
    from p2pkit.stages.service import fit

    p = config.load("dual-5090-llamacpp", list(sets))
    f = {"model": shape or SHAPE, "gpus": [{"index": i, "total": gib(32), "free": x, "engine_used": 0}
                                           for i, x in enumerate(free)], "tp_quant_kv_refused": refused}
    return {c.id: c for c in fit.check(f, p)}


def test_fit_counts_weights_kv_at_the_context_and_type_and_draft_layers():
    # 64 layers x 4 KV heads x 256 x 2 (K, V) x q4_0 (18/32 B) = 73.7 KB a token (+1 draft layer)
    ok = fit_checks()["service.vram_fit.gpu0"]  # the profile: 95000 tokens, q4_0 K and V, MTP on
    assert ok.status == "pass" and "at 95000 tokens q4_0/q4_0" in ok.measured and ok.pitfall == "P18"
    bad = fit_checks(sets=["serve.flags.ctx-size=200000"])["service.vram_fit.gpu0"]
    assert bad.status == "fail" and "ctx-size to at most" in bad.hint
    n = int(bad.hint.split("at most ")[1].split(",")[0])
    assert fit_checks(sets=[f"serve.flags.ctx-size={n}"])["service.vram_fit.gpu0"].status == "pass"
    assert fit_checks(sets=[f"serve.flags.ctx-size={n + 2000}"])["service.vram_fit.gpu0"].status == "fail"
    f16 = fit_checks(sets=["serve.flags.cache-type-k=f16", "serve.flags.cache-type-v=f16"])
    assert f16["service.vram_fit.gpu0"].status == "fail"  # the same context in f16 KV does not fit
    # draft layers count: without MTP the same context leaves more room
    no_draft = fit_checks(shape={**SHAPE, "draft_layers": 0}, sets=[f"serve.flags.ctx-size={n + 1200}"])
    assert no_draft["service.vram_fit.gpu0"].status == "pass"
    # the profile's headroom is held back, and each GPU is judged on its own free memory
    assert fit_checks(sets=["serve.vram_headroom_gib=6"])["service.vram_fit.gpu0"].status == "fail"
    one = fit_checks(free=(gib(31.5), gib(24)))
    assert one["service.vram_fit.gpu0"].status == "pass" and one["service.vram_fit.gpu1"].status == "fail"


def test_fit_counts_a_separate_draft_model_and_refuses_one_it_cannot_read():
    """Issue 27: a draft model given with -md (llama-server loads it, drafting on or off) counts with its
    weights and its own f16 KV; one that cannot be read is "could not determine", never a pass."""
    draft = {"path": "/srv/models/draft.gguf", "layers": 4, "kv_heads": 4, "head_dim_k": 128, "head_dim_v": 128,
             "weights_bytes": gib(6)}
    assert fit_checks()["service.vram_fit.gpu0"].status == "pass"
    with_draft = fit_checks(shape={**SHAPE, "draft_model": draft})["service.vram_fit.gpu0"]
    assert with_draft.status == "fail" and "draft model's 3.00" in with_draft.measured  # 3 GiB a GPU at 0.5/0.5
    small = fit_checks(shape={**SHAPE, "draft_model": {**draft, "weights_bytes": gib(0.5)}})["service.vram_fit.gpu0"]
    assert small.status == "pass"
    gone = fit_checks(shape={**SHAPE, "draft_model": {"path": "/x.gguf", "error": "the draft model /x.gguf does "
                                                      "not exist"}})["service.vram_fit"]
    assert gone.status != "pass" and "does not exist" in gone.measured


def test_fit_knows_which_kv_types_the_built_llamacpp_takes_with_tensor_split():
    c = fit_checks()["service.kv_split"]
    assert c.status == "pass"  # q4_0 after PR #23792
    old = fit_checks(refused=True)["service.kv_split"]  # a tree from before PR #23792
    assert old.status == "fail" and old.pitfall == "P18" and "#23792" in old.hint
    iq4 = fit_checks(sets=["serve.flags.cache-type-k=iq4_nl", "serve.flags.cache-type-v=iq4_nl"])["service.kv_split"]
    assert iq4.status == "fail" and "#27116" in iq4.hint
    layer = fit_checks(sets=["serve.flags.split-mode=layer", "serve.flags.cache-type-k=iq4_nl"], refused=True)
    assert "service.kv_split" not in layer  # layer split takes every KV type


def test_tree_guard_and_gguf_shape_read_from_files(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    from p2pkit.core import config
    from p2pkit.host import Host, model

    src = tmp_path / "opt/p2pkit/llama.cpp/src"
    src.mkdir(parents=True)
    (src / "llama-context.cpp").write_text('LLAMA_LOG_ERROR("%s: simultaneous use of SPLIT_MODE_TENSOR and KV cache '
                                           'quantization not implemented\\n", __func__);\n')
    h = Host(root=tmp_path)
    assert model.tp_quant_kv_refused(h, "/opt/p2pkit/llama.cpp") is True
    (src / "llama-context.cpp").write_text("// after PR #23792\n")
    assert model.tp_quant_kv_refused(h, "/opt/p2pkit/llama.cpp") is False
    assert model.tp_quant_kv_refused(h, "/nowhere") is None
    p = config.load("dual-5090-llamacpp")
    out = tmp_path / p.model.output.lstrip("/")
    out.parent.mkdir(parents=True)
    w = GGUFWriter(str(out), "qwen3")
    w.add_block_count(4)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_embedding_length(512)
    w.add_context_length(4096)
    w.add_uint32("qwen3.nextn_predict_layers", 1)
    w.add_tensor("token_embd.weight", np.zeros((16, 512), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = model.model_shape(h, p)
    assert shape["layers"] == 4 and shape["kv_heads"] == 2 and shape["head_dim_k"] == 64
    assert shape["draft_layers"] == 1 and shape["weights_bytes"] == out.stat().st_size


def test_headroom_after_start_and_oom_cause():
    from p2pkit.core import config
    from p2pkit.stages.service import fit
    from p2pkit.stages.service.act import CAUSES

    p = config.load("dual-5090-llamacpp")
    c = fit.headroom({"gpus": [{"index": 0, "free": gib(3)}, {"index": 1, "free": gib(1)}]}, p)[0]
    assert c.status == "warn" and c.pitfall == "P18" and "GPU 1: 1.0 GiB free" in c.measured
    assert fit.headroom({"gpus": [{"index": 0, "free": gib(3)}]}, p)[0].status == "pass"
    # llama.cpp's own line (ggml-cuda.cu: "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s")
    line = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 1: cudaMalloc failed: " \
           "out of memory"
    cause = next(c for needle, c in CAUSES if needle in line)
    assert "(P18)" in cause


def test_service_refuses_to_start_a_model_that_does_not_fit(monkeypatch):
    from types import SimpleNamespace

    import pytest

    from p2pkit.core import config
    from p2pkit.core.errors import P2pkitError
    from p2pkit.facts import collect as facts
    from p2pkit.stages.service import act as ss

    p = config.load("dual-5090-llamacpp", ["serve.flags.ctx-size=400000"])
    f = {"model": SHAPE, "gpus": [{"index": i, "total": gib(32), "free": gib(31.5), "engine_used": 0} for i in (0, 1)],
         "tp_quant_kv_refused": False}
    monkeypatch.setattr(facts, "collect", lambda host, names, profile: {"vram_fit": f})
    with pytest.raises(P2pkitError) as e:
        ss.fit_before_start(SimpleNamespace(host=None, profile=p))
    assert e.value.pitfall == "P18" and "was not started" in e.value.message
    ss.fit_before_start(SimpleNamespace(host=None, profile=config.load("dual-5090-llamacpp")))  # fits: no error


def test_fit_that_cannot_be_read_yet_is_could_not_check_never_a_pass():
    from p2pkit.core import config
    from p2pkit.stages.service import fit

    p = config.load("dual-5090-llamacpp")
    for f in ({"model": {"error": "/srv/x.gguf does not exist yet"}, "gpus": []},
              {"model": SHAPE, "gpus": {"error": "NVML did not initialise: Driver Not Loaded"}}):
        c = {x.id: x for x in fit.check({**f, "tp_quant_kv_refused": False}, p)}["service.vram_fit"]
        assert c.status == "skip" and c.measured.startswith("could not determine") and c.pitfall == "P18"
