"""Checks that no other fast test guarded (bench/check_guard.py found them): each judged over the
facts recorded on a real H200 (tests/fixtures/h200-device/facts.json), once as recorded and once
with the one fact changed that the check is about, so forcing the check to pass fails a test."""

import copy
import json
from dataclasses import replace

from p2pkit.core import config
from p2pkit.stages.model import checks as model
from p2pkit.stages.p2p_module import checks as p2p_module
from p2pkit.stages.preflight import checks as preflight
from p2pkit.stages.topology import checks as topology
from tests.conftest import FIXTURES

FACTS = json.loads((FIXTURES / "h200-device/facts.json").read_text())["facts"]
P = config.load(None)


def by_id(checks):
    return {c.id: c for c in checks}


def with_(**kw):
    f = copy.deepcopy(FACTS)
    f.update(kw)
    return f


def test_preflight_kernel_root_disk_gpu_model_on_the_recorded_host():
    c = by_id(preflight.check(FACTS, P))
    assert c["preflight.kernel"].status == "pass" and c["preflight.root"].status == "pass"
    # recorded: 64 GiB free under /var/lib, one H200 (0x2335) where the profile wants RTX 5090s (0x2b85)
    disk = c["preflight.disk"]
    assert disk.status == "fail" and "64.0 GiB" in disk.measured and "/var/lib" in disk.measured
    assert c["preflight.gpu_model"].status == "fail" and "0x2335" in c["preflight.gpu_model"].measured
    c = by_id(preflight.check(with_(kernel="5.15.0-91-generic", is_root=False,
                                    disk={"path": "/var/lib", "free_bytes": 900 << 30}), P))
    assert c["preflight.kernel"].status == "fail" and c["preflight.root"].status == "fail"
    assert c["preflight.disk"].status == "pass"


def test_preflight_iommu_and_half_installed_packages():
    c = by_id(preflight.check(FACTS, P))
    assert c["preflight.iommu"].status == "pass" and c["preflight.nvidia_packages"].status == "pass"
    io = {**FACTS["iommu"], "intent": "translating", "detail": "intel_iommu=on without iommu=pt"}
    bad = by_id(preflight.check(with_(iommu=io, dpkg_nvidia=[{"package": "nvidia-dkms-580",
                                                               "status": "install ok half-configured"}]), P))
    assert bad["preflight.iommu"].status == "warn" and "IO_PAGE_FAULT" in bad["preflight.iommu"].hint
    assert bad["preflight.nvidia_packages"].status == "fail"
    assert "nvidia-dkms-580 (install ok half-configured)" in bad["preflight.nvidia_packages"].measured


def test_topology_iommu_per_gpu_and_nvml_p2p():
    g = {**FACTS["pci_gpus"][0], "iommu_group": "passthrough"}
    assert topology._iommu(g).status == "pass"
    bad = topology._iommu({**g, "iommu_group": "translating"})
    assert bad.status == "fail" and bad.id == f"topology.iommu.{g['bdf']}"
    nv = {**FACTS["nvml"], "p2p": [{"from": 0, "to": 1, "read": "OK", "write": "OK"},
                                   {"from": 1, "to": 0, "read": "OK", "write": "OK"}]}
    assert topology._nvml_p2p({"nvml": nv}).status == "pass"
    cns = {**nv, "p2p": [{"from": 0, "to": 1, "read": "CNS", "write": "CNS"}, nv["p2p"][1]]}
    c = topology._nvml_p2p({"nvml": cns})
    assert c.status == "fail" and c.pitfall == "P17" and "0->1 read CNS" in c.measured
    assert topology._nvml_p2p({"nvml": FACTS["nvml"]}).status == "fail"  # one H200: no pair to read


def test_model_and_module_prechecks_refuse_an_unpinned_profile():
    assert by_id(model.precheck(P))["model.paths"].status == "pass"
    bare = replace(P, model=replace(P.model, output="", convert_recipe=""))
    c = by_id(model.precheck(bare))
    assert c["model.paths"].status == "fail" and c["model.convert_recipe"].status == "fail"
    assert p2p_module.precheck(P)[0].status == "fail"  # the built-in profile pins no fork commit
    pinned = replace(P, p2p_module=replace(P.p2p_module, commit="a" * 40))
    assert p2p_module.precheck(pinned)[0].status == "pass"


def test_module_install_and_runtime_on_the_recorded_host():
    """The H200 runs a stock 580 open module p2pkit did not build: nothing is installed, the loaded
    one is not the pin."""
    built = {"path": "/x/nvidia.ko", "srcversion": "06B987C9B8B712FF4E7FB47"}
    f = with_(built_module=built, module={**FACTS["module"], "modinfo_filename":
                                          f"/lib/modules/{FACTS['kernel']}/kernel/drivers/video/nvidia.ko",
                                          "modinfo_srcversion": built["srcversion"]})
    c = by_id(p2p_module.install_checks(f, P))
    assert c["p2p.modinfo_file"].status == "pass" and c["p2p.installed_srcversion"].status == "pass"
    dkms = copy.deepcopy(f)
    dkms["module"].update(modinfo_filename=f"/lib/modules/{FACTS['kernel']}/updates/dkms/nvidia.ko",
                          modinfo_srcversion="0000")
    c = by_id(p2p_module.install_checks(dkms, P))
    assert c["p2p.modinfo_file"].status == "fail" and c["p2p.modinfo_file"].pitfall == "P02"
    assert c["p2p.installed_srcversion"].status == "fail"
    r = by_id(p2p_module.runtime_checks(f, P))
    assert r["p2p.loaded_version"].status == "fail" and "580.159.04" in r["p2p.loaded_version"].measured
    assert r["p2p.loaded_srcversion"].status == "pass" and r["p2p.nvml"].status == "pass"
    assert r["p2p.iommu"].status == "fail"  # the recorded command line has no iommu=pt
    ok = copy.deepcopy(f)
    ok["nvidia_version"].update(version=P.driver.version)
    ok["iommu"].update(intent="passthrough")
    r = by_id(p2p_module.runtime_checks(ok, P))
    assert r["p2p.loaded_version"].status == "pass" and r["p2p.iommu"].status == "pass"
    whole = by_id(p2p_module.check(f, P))  # the stage's check: precheck, install and runtime together
    assert whole["p2p.commit"].status == "fail" and whole["p2p.loaded_version"].status == "fail"


def test_driver_pin_checksum_userspace_firmware_and_guards():
    from p2pkit.stages.driver import checks as driver

    c = by_id(driver.precheck(P))
    assert c["driver.pin"].status == "pass" and c["driver.installer_sha256"].status == "fail"  # built-in: unpinned
    old = by_id(driver.precheck(replace(P, driver=replace(P.driver, version="595.71.05", installer_sha256="a" * 64))))
    assert old["driver.pin"].status == "fail" and old["driver.pin"].pitfall == "P01"
    assert old["driver.installer_sha256"].status == "pass"
    want = P.driver.version
    good = {"userspace_driver": {"versions": [want], "gsp_firmware": {want: ["gsp_ga10x.bin"]}},
            "driver_guards": {"nouveau_blacklisted": True, "apt_pin": True, "unattended_upgrades_blacklist": True}}
    c = by_id(driver.check(good, P))
    assert [c[k].status for k in ("driver.userspace_version", "driver.gsp_firmware", "driver.guards")] == ["pass"] * 3
    # the recorded H200: a stock 580 userspace driver, no firmware of the pin, none of the guards
    c = by_id(driver.check(FACTS, P))
    assert c["driver.userspace_version"].status == "fail" and "580.159.04" in c["driver.userspace_version"].measured
    assert c["driver.gsp_firmware"].status == "fail" and c["driver.guards"].status == "fail"


def test_engine_prechecks_and_configure_failures_named():
    from p2pkit.stages.engine import checks as engine
    from p2pkit.stages.engine import cmake as engine_cmake

    c = by_id(engine.precheck(P))
    assert c["engine.commit"].status == "fail" and c["engine.cuda_arch"].status == "pass"
    arch = by_id(engine.precheck(replace(P, engine=replace(P.engine, cuda_architectures="90", commit="a" * 40,
                                                           repo="https://x/y.git"))))
    assert arch["engine.cuda_arch"].status == "fail" and arch["engine.commit"].status == "pass"
    llama = config.load("dual-5090-llamacpp")
    assert by_id(engine.precheck(llama))["engine.nccl_root"].status == "pass"
    bare = replace(llama, engine=replace(llama.engine, nccl_root=""))
    nr = by_id(engine.precheck(bare))["engine.nccl_root"]
    assert nr.status == "fail" and nr.pitfall == "P16"
    err = "CMake Error at CMakeLists.txt:5 (message): NInfer supports only CMAKE_CUDA_ARCHITECTURES=120a"
    c = by_id(engine_cmake._configure({"configure_rc": 1, "first_error": err, "log": "/l"}))
    assert c["engine.configure"].status == "fail" and c["engine.configure"].pitfall == "P05"
    c = by_id(engine_cmake._configure({"configure_rc": 0, "build_rc": 1, "build_tail": "ninja: build stopped",
                                       "log": "/l"}))
    assert c["engine.configure"].status == "pass" and c["engine.build"].status == "fail"


def test_preflight_os_secure_boot_and_capped_cgroup_on_the_recorded_host():
    c = by_id(preflight.check(FACTS, P))
    assert c["preflight.os"].status == "pass" and c["preflight.secure_boot"].status == "pass"
    # recorded: the VM's sandbox caps memory at 128 GiB (memory.max of its cgroup)
    assert c["preflight.cgroup"].status == "warn" and "128.0 GiB" in c["preflight.cgroup"].measured
    debian = {**FACTS["os"], "ID": "debian", "VERSION_ID": "12"}
    c = by_id(preflight.check(with_(os=debian, secure_boot="on", cgroup={**FACTS["cgroup"], "memory_caps": []}), P))
    assert c["preflight.os"].status == "fail" and c["preflight.secure_boot"].status == "fail"
    assert c["preflight.cgroup"].status == "pass"


def h200_load(**pair):
    """The one-GPU link run recorded on the H200 (verify_link_one_gpu.json: Gen5 x16 after 0.04 s,
    54.6/55.1 GB/s, no replays), as two GPUs with the reference box's P2P figures."""
    gpu = {"max_seen": {"gen": 5, "width": 16}, "idle": {"gen": 5, "width": 16}, "trained_after_s": 0.04,
           "replay_before": 0, "replay_after": 0, "app_clocks_reason_under_load": False,
           "host": {"h2d_gbps": 54.6, "d2h_gbps": 55.1}}
    x = {"from": 0, "to": 1, "peer_access": True, "unidir_gbps": 55.0, "staged_gbps": 20.0, "bidir_gbps": 100.0,
         "latency_us": 0.4, "integrity": {"equal": True, "mismatches": 0, "elements": 1 << 20, "zeros": 0}, **pair}
    return {"link_load": {"gpus": [{**gpu, "index": 0}, {**gpu, "index": 1}], "device_count": 2, "pairs": [x],
                          "load_seconds": 5.0}}


def test_link_under_load_judged_from_the_recorded_figures():
    from p2pkit.stages.link import checks as link

    c = by_id(link.check(h200_load(), P))  # (the NCCL all-reduce is not in this record: skipped, P28)
    assert all(x.status in ("pass", "skip") for x in c.values()), [x for x in c.values() if x.status != "pass"]
    assert c["link.p2p_bw.gpu0-gpu1"].status == c["link.trained.gpu0"].status == "pass"
    bad = by_id(link.check(h200_load(unidir_gbps=3.0, latency_us=14.0, peer_access=False,
                                      integrity={"equal": False, "mismatches": 10, "elements": 100, "zeros": 10}), P))
    for k in ("link.p2p_bw.gpu0-gpu1", "link.p2p_latency.gpu0-gpu1", "link.p2p_access.gpu0-gpu1",
              "link.p2p_integrity.gpu0-gpu1"):
        assert bad[k].status == "fail", k
    slow = h200_load()
    g = slow["link_load"]["gpus"][0]
    g.update(trained_after_s=None, replay_after=50, app_clocks_reason_under_load=True, host={"h2d_gbps": 5.0,
                                                                                            "d2h_gbps": 5.0})
    c = by_id(link.check(slow, P))
    assert c["link.trained.gpu0"].status == "fail" and c["link.replays.gpu0"].status == "fail"
    assert c["link.clocks.gpu0"].status == "warn" and c["link.h2d.gpu0"].status == "fail"
    one = h200_load()
    one["link_load"]["device_count"] = 1
    assert by_id(link.check(one, P))["link.p2p_pair"].status == "fail"


def test_fabric_rate_of_the_resolved_roce_port():
    from p2pkit.stages.link import checks as link

    sp = config.load("dual-spark-vllm")
    port = {"device": "rocep1s0f0", "port": 1, "state": "ACTIVE", "link_layer": "Ethernet",
            "netdevs": ["enp1s0f0np0"], "rate": "200 Gb/sec (2X NDR)", "rate_gbps": 200.0}
    assert by_id(link.fabric({"roce": [port]}, sp))["link.fabric_rate.rocep1s0f0:1"].status == "pass"
    slow = {**port, "rate": "100 Gb/sec (2X HDR)", "rate_gbps": 100.0}
    assert by_id(link.fabric({"roce": [slow]}, sp))["link.fabric_rate.rocep1s0f0:1"].status == "fail"
    down = by_id(link.fabric({"roce": [{**port, "state": "DOWN"}]}, sp))["link.fabric"]
    assert down.status == "fail" and down.pitfall == "P24"


def test_model_source_completeness():
    from p2pkit.stages.model import checks as mc

    whole = {"path": "/srv/m", "config": True, "shards": {"a.safetensors": {"present": True, "size": 10}},
             "total_bytes": 10}
    assert mc._source(whole).status == "pass"
    for broken in ({**whole, "config": False}, {**whole, "shards": {"a.safetensors": {"present": False}}},
                   {**whole, "shards": {"a.safetensors": {"present": True, "truncated": True}}}):
        assert mc._source(broken).status == "fail"


def test_model_build_record_judged():
    from p2pkit.stages.model import checks as mc

    src = {"path": "/srv/m", "config": True, "shards": {"a.safetensors": {"present": True, "size": 10}},
           "total_bytes": 10}
    b = {"source": src, "convert_rc": 0, "verify": {"container_version": 3, "components": list(P.model.components),
                                                    "formats": ["nvfp4"]},
         "engine": {"reads": [2, 3], "dflash2_tp2": True}, "sha256": "a" * 64}
    c = by_id(mc.check({"model_build": b}, P))
    assert all(x.status == "pass" for x in c.values()), [x for x in c.values() if x.status != "pass"]
    bad = {**b, "convert_rc": 1, "convert_tail": ["ImportError: attempted relative import"]}
    c = by_id(mc.check({"model_build": bad}, P))
    assert c["model.convert"].status == "fail" and c["model.convert"].pitfall == "P08"
    old = {**b, "verify": {**b["verify"], "container_version": 2, "components": ["text"]}, "engine": {"reads": [3]}}
    c = by_id(mc.check({"model_build": old}, P))
    assert c["model.container"].status == "fail" and c["model.components"].status == "fail"


def test_service_proofs_judged_and_an_oom_start_named_with_its_cause():
    from p2pkit.stages.service import checks as sc
    from p2pkit.stages.service.act import CAUSES

    p = config.load("dual-5090-llamacpp")
    line = "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 1: cudaMalloc failed: " \
           "out of memory"  # llama.cpp's own format (ggml-cuda.cu)
    s = {"role": "single", "analyze": {"verify_rc": 0, "verify_issues": [], "exposure": 1.9, "exposure_label": "OK"},
         "health": {"ok": True, "seconds": 2.0, "codes": [503, 200], "exited": False},
         "pid_cgroup": {"v2_path": "/p2pkit.slice/p2pkit-engine.service", "v1_memory_path": None, "memory_caps": []},
         "listen": {"connect": True, "addresses": [f"127.0.0.1:{p.serve.port}"]}, "log_tail": [],
         "likely_cause": None}
    c = by_id(sc.check({"service": s}, p))
    for k in ("service.unit_verify", "service.exposure", "service.health", "service.memory_cap",
              "service.listen_where"):
        assert c[k].status == "pass", k
    oom = {**s, "health": {"ok": False, "seconds": 3.0, "codes": [], "exited": True}, "log_tail": [line],
           "likely_cause": next(x for needle, x in CAUSES if needle in line),
           "pid_cgroup": {**s["pid_cgroup"], "memory_caps": [{"file": "memory.max", "limit_bytes": 8 << 30}]},
           "analyze": {**s["analyze"], "exposure": 9.6}}
    c = by_id(sc.check({"service": oom}, p))
    assert c["service.health"].status == "fail" and c["service.health"].pitfall == "P18"
    h = c["service.health"]
    assert "out of GPU memory at start" in h.hint and "cudaMalloc failed" in h.measured
    assert c["service.memory_cap"].status == "fail" and c["service.exposure"].status == "fail"
    assert by_id(sc.precheck(config.load("dual-5090-llamacpp", ["serve.flags.bogus=1"])))[
        "service.flags_known"].status == "fail"


def test_topology_p2p_matrices_from_nvidia_smi_and_link_capability():
    from p2pkit.parse import smi

    ok = {"matrix": smi.topo_matrix((FIXTURES / "constructed/topo_p2p_r_2gpu_ok.txt").read_text())}
    cns = {"matrix": smi.topo_matrix((FIXTURES / "constructed/topo_p2p_r_2gpu_cns.txt").read_text())}
    assert topology._smi({"smi_p2p_read": ok}, "read", "smi_p2p_read").status == "pass"
    c = topology._smi({"smi_p2p_read": cns}, "read", "smi_p2p_read")
    assert c.status == "fail" and c.pitfall == "P17" and "GPU0->GPU1 CNS" in c.measured and "CNS:" in c.hint
    g = FACTS["pci_gpus"][0]  # the H200: Gen5 x16 GPU and slot
    assert topology._capability(g, P).status == "pass"
    x4 = {**g, "parent_link": {**(g.get("parent_link") or {}), "max_gen": 4, "max_width": 4}}
    bad = topology._capability(x4, P)
    assert bad.status == "fail" and bad.measured == "Gen4 x4"


def test_a_vllm_first_request_without_the_python_headers_is_named_before_a_permission_denied_it_logged():
    """The real journal of vLLM under systemd on the container host (tests/fixtures/vllm/README.md): a
    PermissionError it logs and goes past at the start, then the first request's inductor compile without
    Python.h. The likely cause is the headers, not the engine's user's access."""
    from p2pkit.stages.service.act import CAUSES

    text = (FIXTURES / "vllm/first-request-without-python-headers.log").read_text()
    assert "Permission denied" in text and "Python.h: No such file or directory" in text
    cause = next(c for needle, c in CAUSES if needle in text)
    assert "python3-dev" in cause, cause
