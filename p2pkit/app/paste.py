"""Pasted outputs judged (`p2pkit doctor --from-paste`): each known kind gives findings with the
pitfall it shows and its fix; a paste too short to tell gives "could not determine", never a pass."""

from __future__ import annotations

import re

from p2pkit.core.config import Profile
from p2pkit.parse import field as pf
from p2pkit.parse import p2p_paste as p2
from p2pkit.parse import paste as pp
from p2pkit.rules.findings import FAIL, PASS, SKIP, WARN, Check, figure
from p2pkit.stages.engine.cmake import NO_CUDA_COMPILER, NO_DEFAULT_ARCH
from p2pkit.stages.rebar.checks import FIX as REBAR_FIX
from p2pkit.stages.topology.checks import acs_redirect

GIB = 1 << 30
P31_FIX = (REBAR_FIX + ". When the kernel cannot fit the window (\"BAR 1 ... can't assign; no space\"), enable Above "
           "4G Decoding and Resizable BAR and disable CSM in the BIOS, then reboot")
MODULE_IN_USE_FIX = ("the installer could not replace the loaded module, so the old one stays (and install.sh carries "
                     "on after rmmod fails): stop what holds the GPU (the display manager, nvidia-persistenced, "
                     "CUDA programs), unload in order nvidia_drm nvidia_modeset nvidia_uvm nvidia (or boot to "
                     "multi-user.target without a display on the GPUs), then install again; `p2pkit up --from "
                     "p2p-module` does this and proves the loaded srcversion is the built one")


def could_not(id_: str, title: str, why: str, expected, pitfall: str) -> Check:
    return Check(id_, title, SKIP, f"could not determine: {why}", expected, "paste the whole output", pitfall)


def check(kind: str, text: str, p: Profile) -> list[Check]:
    return {"lspci": lspci, "nvidia-installer": installer, "cmake": cmake, "nvidia-smi-q": smi_q,
            "simpleP2P": simple_p2p, "p2pBandwidthLatencyTest": p2p_bandwidth, "nccl-log": nccl_log,
            "kernel-log": kernel_log}[kind](text, p)


def lspci(text: str, p: Profile) -> list[Check]:
    """P31 (and rebar) from `lspci -v`/`-vv`: each NVIDIA GPU's BAR1 and the prefetchable window of
    the bridge above it (the one whose secondary bus is the GPU's) hold the whole VRAM; P29 where the
    paste shows ACS control (`sudo lspci -vvv`, or its ACSCtl lines alone)."""
    acs = _acs(text, p)
    if acs and not pp.lspci(text):
        return acs  # `lspci -vvv | grep ACSCtl`: no device lines, nothing to say of BAR1
    return _bars(text, p) + acs


def _acs(text: str, p: Profile) -> list[Check]:
    """P29 judged by the topology stage's own rule over the ports the paste shows: ACSCtl flags, or
    "Capabilities: <access denied>" (lspci run without root) as a port that could not be read."""
    ports = []
    for x in pf.lspci_acs(text):
        bdf = x["bdf"] or f"(line {len(ports) + 1}, no device in the paste)"
        if x["denied"] and x["flags"] is None:
            ports.append({"bdf": bdf, "error": "lspci ran without root (Capabilities: <access denied>)",
                          "by_hand": "sudo lspci -vvv | grep -E '^[0-9a-f]|ACSCtl'"})
        elif x["flags"] is not None:
            ports.append({"bdf": bdf, "flags": x["flags"]})
    return acs_redirect({"acs": {"ports": ports}}, p) if ports else []


def _bars(text: str, p: Profile) -> list[Check]:
    vram = p.gpus.vram_gib * GIB
    devs = pp.lspci(text)
    gpus = [d for d in devs if d["gpu"]]
    want = f">= {p.gpus.vram_gib} GiB (VRAM, profile {p.name})"
    if not gpus:
        return [could_not("paste.bar1", "BAR1 of each NVIDIA GPU covers VRAM", "no NVIDIA VGA or 3D controller in "
                          "the paste", want, "P31")]
    out = []
    for g in gpus:
        size, where = pp.bar1_size(g)
        title = f"BAR1 of {g['bdf']} covers VRAM"
        if size is None:
            out.append(could_not(f"paste.bar1.{g['bdf']}", title, where, want, "P31"))
            continue
        unit, scale = _unit(size)
        out.append(figure(f"paste.bar1.{g['bdf']}", title, size / scale, ">=", vram / scale, unit, P31_FIX, "P31",
                          context=where, expected_context=f"(VRAM, profile {p.name})"))
        bus = g["bdf"].split(":")[-2].lower()
        for b in (d for d in devs if d["secondary_bus"] == bus and d["bridge_prefetch"] is not None):
            unit, scale = _unit(b["bridge_prefetch"])
            out.append(figure(f"paste.bridge_window.{b['bdf']}", f"bridge {b['bdf']} above {g['bdf']} has room for "
                              "BAR1", b["bridge_prefetch"] / scale, ">=", vram / scale, unit, P31_FIX, "P31",
                              text="prefetchable window {}", expected_context=f"(VRAM, profile {p.name})"))
    return out


def installer(text: str, p: Profile) -> list[Check]:
    """P34 from the installer's log or install.sh's rmmod lines: a module in use was not replaced."""
    r = pp.installer(text)
    held = r["loaded"] + [m["module"] + (f" (used by {', '.join(m['by'])})" if m["by"] else "")
                          for m in r["rmmod_in_use"]]
    title = "the new kernel module replaced the loaded one"
    if held:
        return [Check("paste.module_in_use", title, FAIL, "in use, not replaced: " + "; ".join(held)
                      + ("; installation failed" if r["failed"] else ""), "no module in use during the install",
                      MODULE_IN_USE_FIX, "P34")]
    if r["failed"]:
        return [Check("paste.module_in_use", title, FAIL, "installation failed, for a reason the paste does not "
                      "show", "installed", "paste /var/log/nvidia-installer.log whole", "P34")]
    return [Check("paste.module_in_use", title, PASS, "no module in use, no failure", "no module in use")]


def cmake(text: str, p: Profile) -> list[Check]:
    """P05 from CMake's configure output: no CUDA compiler, no default CUDA architecture."""
    r = pp.cmake(text)
    out = []
    if r["no_cuda_compiler"]:
        out.append(Check("paste.cuda_compiler", "CMake finds the CUDA compiler", FAIL,
                         "No CMAKE_CUDA_COMPILER could be found", "nvcc of CUDA >= " + p.engine.cuda_min,
                         NO_CUDA_COMPILER, "P05"))
    if r["unsupported_arch"]:
        archs = ", ".join(repr(a) for a in r["unsupported_arch"])
        out.append(Check("paste.cuda_arch", "nvcc builds the architectures CMake asks for", FAIL,
                         f"nvcc fatal: Unsupported gpu architecture {archs}", "an architecture in `nvcc "
                         "--list-gpu-arch`", f"this CUDA toolkit does not build {archs} (too old for it, or too new): "
                         "set CMAKE_CUDA_ARCHITECTURES to the GPUs' own architecture from `nvcc --list-gpu-arch` "
                         "(RTX 5090: 120a; p2pkit passes engine.cuda_architectures, here "
                         f"{p.engine.cuda_architectures}), or install a toolkit that lists it; an empty 'compute_' is "
                         "an architecture variable left empty",
                         "P05"))
    if r["no_default_arch"]:
        out.append(Check("paste.cuda_arch", "CMake compiles for the GPU's architecture", FAIL,
                         "Failed to detect a default CUDA architecture", f"CMAKE_CUDA_ARCHITECTURES="
                         f"{p.engine.cuda_architectures}", NO_DEFAULT_ARCH, "P05"))
    if out:
        return out
    if r["errors"]:
        return [Check("paste.cmake", "CMake configures", FAIL, "; ".join(r["errors"][:3]), "no CMake Error",
                      "read the lines after each CMake Error; `p2pkit up --from engine` keeps the whole log")]
    return [could_not("paste.cmake", "CMake configures", "no CMake Error and no end of configuration in the paste",
                      "-- Configuring done", "P05")] if "Configuring done" not in text else \
        [Check("paste.cmake", "CMake configures", PASS, "Configuring done", "no CMake Error")]


def smi_q(text: str, p: Profile) -> list[Check]:
    """P31 (and rebar) from `nvidia-smi -q`: BAR1 Memory Usage Total holds FB Memory Usage Total."""
    gpus = pp.smi(text)
    if not gpus:
        return [could_not("paste.bar1", "BAR1 of each GPU covers VRAM", "no GPU section in the paste", "BAR1 >= FB",
                          "P31")]
    out = []
    for g in gpus:
        id_, title = f"paste.bar1.{g['bus_id']}", f"BAR1 of {g['bus_id']} covers VRAM"
        if g["bar1_total_mib"] is None or g["fb_total_mib"] is None:
            out.append(could_not(id_, title, "no BAR1 or FB Memory Usage Total in the paste", "BAR1 >= FB", "P31"))
            continue
        out.append(figure(id_, title, g["bar1_total_mib"], ">=", g["fb_total_mib"], "MiB", P31_FIX, "P31",
                          text="BAR1 {}", expected_context="(FB Memory Usage Total)"))
    return out


def _unit(n: int) -> tuple[str, int]:
    """The unit a size is shown in: GiB from one GiB up, MiB below (a 256 MiB BAR1)."""
    return ("GiB", GIB) if n >= GIB else ("MiB", 1 << 20)


# ---------------------------------------------------------------- what people paste when P2P is broken (issue 38)

P34_FIX = ("the GPUs refuse peer access: on consumer GPUs the stock driver never grants it; load the P2P-patched "
           "module (`p2pkit up --from p2p-module`, which proves the loaded srcversion is the built one) and run "
           "`p2pkit doctor` on the box: BAR1 (P31), ACS redirect (P29) and a display on a GPU (P33) refuse it too")
P32_FIX = ("P2P copies report success and the data arrive wrong: boot with the IOMMU in passthrough (iommu=pt, "
           "amd_iommu=on / intel_iommu=on), or off; `p2pkit up --from p2p-module` writes it and `p2pkit verify link` "
           "reads a pattern back across the pair")
P29_FIX = ("P2P on gives no more bandwidth than copies through the host: the traffic goes up to the root complex "
           "(ACS request/completion redirect on the bridges, P29, or a translating IOMMU, P32); `sudo lspci -vvv` "
           "pasted here judges ACS, `p2pkit verify link` measures the pair")
P28_FIX = ("a collective that never finishes on a box whose topology says P2P is OK: the driver must map the whole "
           "VRAM through a static BAR1 (the patched module's RMForceStaticBar1=1, P28), and driver 595 cannot build "
           "the mailbox at all (P01); after such a hang the GPUs can stay wedged until a reboot (P35). `p2pkit "
           "verify link` runs NCCL's all-reduce across the pair with a timeout")
P37_FIX = ("NCCL before 2.29.3 loses proxy-op slots on aarch64 (NCCL 2.29.3's notes: \"Fixed CAS usage in case of "
           "weak failure which was causing a hang on ARM\"; NVIDIA/nccl#2213, marin-community/marin#7344): once a "
           "rank's pool runs dry it spins in ncclLocalOpAppend and the collective hangs (or faults) with no NCCL "
           "error. Run the engine with NCCL >= 2.29.3 (the pip wheel and the system library are different builds: the "
           "service stage reads the one the engine process has mapped, /proc/PID/maps, against engine.nccl_min)")
P35_FIX = ("the driver cannot boot GSP on a GPU that a crash or hung collective left running (\"unexpected WPR2 "
           "already up\"): reboot (a cold one where a warm reboot does not clear it) before the next stage; `p2pkit "
           "verify link` reads the kernel log and the GPUs' utilization for it")
P38_FIX = ("NCCL reached the other node but its RDMA traffic failed (error 12 is the transport's retry timeout; "
           "ibv_modify_qp failing is an address the port cannot reach): the RoCE GID index differs per node and drifts "
           "(a pinned NCCL_IB_GID_INDEX names the wrong one on one node), or the MTU fell back to 1500. p2pkit's link "
           "stage resolves the RoCE v2 IPv4 GID index per node at each start and checks the MTU (`show_gids` shows it "
           "by hand)")
ERROR_PITFALL = {"cudaErrorMapBufferObjectFailed": ("P31", P31_FIX), "cudaErrorPeerAccessUnsupported": ("P34", P34_FIX)}


def _judged_cuda_errors(errors: list[dict], id_: str) -> list[Check]:
    """CUDA's own error names, each with its pitfall where it has one."""
    out = []
    for e in errors:
        pid, fix = ERROR_PITFALL.get(e["name"], ("", "read the CUDA error's name and the call that failed"))
        out.append(Check(f"{id_}.{e['name']}", f"{e.get('call') or 'a CUDA call'} succeeds", FAIL,
                         f"{e['name']} (code {e['code']}) at {e['where']}", "no CUDA error", fix, pid))
    return out


def simple_p2p(text: str, p: Profile) -> list[Check]:
    """The CUDA samples' simpleP2P: peer access between each pair (P34), CUDA's error names (cudaErrorMapBuffer-
    ObjectFailed: BAR1, P31), and its copies read back: a verification error is P2P that reports success while
    the data arrive wrong (zeros or NaN: P32); a paste that shows none of that, nor its end, is not a pass."""
    r = p2.simple_p2p(text)
    out = _judged_cuda_errors(r["cuda_errors"], "paste.simplep2p")
    refused = [x for x in r["peers"] if not x["ok"]]
    if refused or r["waived"]:
        pairs = ", ".join(f"GPU{x['from']} -> GPU{x['to']}" for x in refused) or "no pair has peer access"
        out.append(Check("paste.p2p_access", "the GPUs have peer access to each other", FAIL,
                         f"peer access No: {pairs}" + ("; simpleP2P waived its test" if r["waived"] else ""),
                         "Yes for every pair", P34_FIX, "P34"))
    if r["verification_errors"]:
        v = r["verification_errors"]
        vals = sorted({x["val"] for x in v})
        out.append(Check("paste.p2p_integrity", "what crossed over P2P reads back as written", FAIL,
                         f"{len(v)} verification error(s) in the paste, read back as {', '.join(vals)} (element "
                         f"{v[0]['element']}: {v[0]['val']} where {v[0]['ref']} was written)",
                         "no verification error (Test passed)", P32_FIX, "P32"))
    if out:
        return out
    if r["passed"] and r["peers"]:
        bw = "; ".join(f"GPU{b['from']} -> GPU{b['to']} {b['gbps']:g} GB/s" for b in r["bandwidth"])
        return [Check("paste.simplep2p", "simpleP2P's copies cross and read back", PASS,
                      "Test passed, peer access Yes for every pair" + (f"; {bw}" if bw else ""), "Test passed")]
    seen = f"peer access Yes for {len(r['peers'])} pair(s)" if r["peers"] else "no peer-access line"
    return [could_not("paste.simplep2p", "simpleP2P's copies cross and read back", f"{seen}, and the paste ends "
                      "before simpleP2P says Test passed or Test failed", "Test passed", "P32")]


def p2p_bandwidth(text: str, p: Profile) -> list[Check]:
    """The CUDA samples' p2pBandwidthLatencyTest: its Cuda failure line ('mapping of buffer object failed': BAR1,
    P31), peer access (P34), and each pair's unidirectional bandwidth with P2P on against P2P off: on must be
    clearly faster (P2P that goes up to the root complex is not: P29, P32)."""
    r = p2.p2p_bandwidth(text)
    out = []
    for f in r["failures"]:
        what = f["what"]
        pid, fix = ("P31", P31_FIX) if "mapping of buffer object failed" in what else \
            ("P34", P34_FIX) if "peer access is not supported" in what else ("", "read the lines before it")
        out.append(Check("paste.p2pbw_failure", "p2pBandwidthLatencyTest runs to its end", FAIL,
                         f"Cuda failure at {f.get('where') or '?'}: '{what}'", "no Cuda failure", fix, pid))
    cannot = sorted((i, j) for (i, j), ok in r["can"].items() if not ok)
    if cannot:
        out.append(Check("paste.p2p_access", "the GPUs have peer access to each other", FAIL,
                         "CANNOT Access Peer: " + ", ".join(f"{i} -> {j}" for i, j in cannot), "CAN for every pair",
                         P34_FIX, "P34"))
    m = r["matrices"]
    off = next((v for k, v in m.items() if "Unidirectional P2P=Disabled Bandwidth" in k), None)
    on = next((v for k, v in m.items() if "Unidirectional P2P=Enabled Bandwidth" in k), None)
    if off and on:
        slow, fine = [], []
        for i, row in on.items():
            for j, gbps in enumerate(row):
                if i == j or i not in off or j >= len(off[i]) or r["can"].get((i, j)) is False:
                    continue
                (slow if gbps <= 1.2 * off[i][j] else fine).append(f"{i} -> {j}: {gbps:g} GB/s on, {off[i][j]:g} off")
        if slow:
            out.append(Check("paste.p2p_bandwidth", "P2P on is faster than copies through the host", FAIL,
                             "; ".join(slow[:4]), "P2P on well above P2P off (over 1.2x)", P29_FIX, "P29"))
        elif fine:
            out.append(Check("paste.p2p_bandwidth", "P2P on is faster than copies through the host", PASS,
                             "; ".join(fine[:4]), "P2P on well above P2P off (over 1.2x)"))
    if out:
        return out
    return [could_not("paste.p2p_bandwidth", "P2P on is faster than copies through the host", "the paste holds no "
                      "unidirectional matrix with P2P on and off, and no Cuda failure", "both matrices", "P29")]


def nccl_log(text: str, p: Profile) -> list[Check]:
    """An NCCL or PyTorch log or crash, judged from what it carries: CUDA's peer-access refusal (217, P34) and
    BAR1's "mapping of buffer object failed" (P31), a collective the watchdog timed out or a watchdog stuck (a hang:
    P28, or P37 where NCCL's aarch64 proxy-op leak shows), no kernel image for the GPU (P39), NET/IB failures (P38),
    an illegal memory access, the transports NCCL chose (SHM between the GPUs of a P2P box: P30; TCP sockets:
    P23), kernel lines pasted with it (P31, P35, P32) and, when it prints one (NCCL's or vLLM's line), NCCL's
    version against the profile's floor; without the version line that one finding is "could not determine" and
    the rest is judged all the same."""
    r = p2.crash_log(text)
    out = _torch_cpu(r)
    if out and "NCCL" not in text:
        return out  # a CPU-only torch never reached NCCL: no NCCL finding to make
    out += [*_nccl_version(r, p), *_cuda_errors(r, p), *_hangs(r), *_transport(r)]
    out += _kernel(pf.kernel_log(text))  # kernel lines pasted with the crash (dmesg after the hang)
    judged = [c for c in out if c.id != "paste.nccl_version"]
    if not judged:
        said = (r["nccl_errors"] + r["nccl_codes"] + [f"NCCL WARN {w}" for w in r["warnings"]])
        out.append(could_not("paste.nccl_log", "the log shows why the run failed", "no peer-access refusal, BAR1 "
                             "mapping failure, watchdog timeout, RDMA failure or illegal access in the paste" +
                             (f" (it says: {'; '.join(said[:3])})" if said else ""),
                             "the whole log from NCCL's first line (NCCL_DEBUG=INFO)", "P28"))
    return out


def _torch_cpu(r: dict) -> list[Check]:
    """A CPU-only torch (its own error): the first finding of a crash log."""
    if not r["torch_no_cuda"]:
        return []
    return [Check("paste.torch_cuda", "PyTorch is a CUDA build", FAIL, "Torch not compiled with CUDA enabled",
                  "a CUDA build of torch", "this torch is the CPU-only build (pip's default on some indexes): "
                  "install a CUDA build for the driver's CUDA (`pip install torch --index-url "
                  "https://download.pytorch.org/whl/cu128`; `python -c 'import torch; "
                  "print(torch.version.cuda)'` prints its CUDA, None for a CPU build), then run again")]


def _nccl_version(r: dict, p: Profile) -> list[Check]:
    """NCCL's version (its line or vLLM's) against the profile's floor; none printed: could not determine."""
    if r["version"] is None:
        return [could_not("paste.nccl_version", "NCCL is at or above the profile's floor", "the log carries no "
                          "NCCL version line (NCCL_DEBUG=VERSION or INFO prints it)",
                          f">= {p.engine.nccl_min or 'the profile floor'}", "P16")]
    if not p.engine.nccl_min:
        return []
    v = tuple(int(x) for x in re.findall(r"\d+", r["version"])[:3])
    floor = tuple(int(x) for x in p.engine.nccl_min.split("."))
    return [Check("paste.nccl_version", "NCCL is at or above the profile's floor", PASS if v >= floor else FAIL,
                  r["version"], f">= {p.engine.nccl_min}", "link the profile's NCCL (engine.nccl_root), not "
                  "the system's", "P16")]


def _cuda_errors(r: dict, p: Profile) -> list[Check]:
    """CUDA's own refusals: peer access (217, P34), no kernel image for the GPU (P39), BAR1's mapping (P31)."""
    out = []
    if r["peer_unsupported"]:
        out.append(Check("paste.p2p_access", "the GPUs have peer access to each other", FAIL,
                         "'peer access is not supported between these two devices' (CUDA error 217)", "peer access",
                         P34_FIX, "P34"))
    if r["no_kernel_image"]:
        out.append(Check("paste.kernel_image", "the engine's kernels are built for the GPU", FAIL,
                         "no kernel image is available for execution on the device (cudaErrorNoKernelImageForDevice)",
                         f"kernels for {p.engine.cuda_architectures} (profile {p.name})",
                         "the engine or a library it loads holds no code for this GPU's architecture (vLLM built with "
                         "CUDA 13 dropped sm_121, vllm#36835): rebuild with the GPU's architecture in "
                         "TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES; `cuobjdump --list-elf` of the library lists "
                         "what it holds, and the engine stage checks it", "P39"))
    if r["map_failed"]:
        out.append(Check("paste.bar1_mapping", "the peer's memory maps through BAR1", FAIL,
                         "'mapping of buffer object failed'", "mapped", P31_FIX, "P31"))
    return out


def _hangs(r: dict) -> list[Check]:
    """A collective that hung (the watchdog's timeout or its stuck heartbeat: P28, or P37 where NCCL's aarch64
    proxy-op leak shows), NET/IB failures (P38), NCCL too old for the GPU's shared memory (P16), an illegal access."""
    out = []
    # the proxy-op pool of NCCL < 2.29.3 on aarch64 (P37): its own frame, or an aarch64 host on an NCCL below the fix
    old_arm = r["aarch64"] and r["version"] is not None and pf.version_tuple(r["version"]) < (2, 29, 3)
    p37 = "ncclLocalOpAppend in the paste" if r["local_op_append"] else "NCCL " + r["version"] + " on aarch64" \
        if old_arm else ""
    hang_pid, hang_fix = ("P37", P37_FIX) if p37 else ("P28", P28_FIX)
    for t in r["timeouts"][:1]:
        n = len(r["timeouts"])
        out.append(Check("paste.collective_hang", "every collective finishes", FAIL,
                         f"{t['op']} (sequence number {t['seq']}) ran {t['ran_ms']} ms against a {t['timeout_ms']} ms "
                         f"timeout" + (f" ({n} such lines)" if n > 1 else "") + (f"; {p37}" if p37 else ""),
                         "no watchdog timeout", hang_fix, hang_pid))
    if r["watchdog_stuck_s"] and not r["timeouts"]:
        out.append(Check("paste.collective_hang", "every collective finishes", FAIL,
                         f"ProcessGroupNCCL's watchdog got stuck for {max(r['watchdog_stuck_s'])} s (a CUDA or NCCL "
                         "call that never returned)" + (f"; {p37}" if p37 else ""), "no watchdog timeout", hang_fix,
                         hang_pid))
    if r["local_op_append"] and not any(c.id == "paste.collective_hang" for c in out):
        out.append(Check("paste.nccl_proxy_ops", "NCCL's proxy keeps free op slots", FAIL, "ncclLocalOpAppend in the "
                         "paste (a rank that ran out of proxy-op slots)", "NCCL >= 2.29.3 on aarch64", P37_FIX, "P37"))
    if r["ib_failures"]:
        out.append(Check("paste.roce", "NCCL's RDMA connection between the nodes works", FAIL,
                         "; ".join(sorted(set(r["ib_failures"]))[:2]), "no NET/IB failure", P38_FIX, "P38"))
    for m in r["shared_mem"][:1]:
        out.append(Check("paste.nccl_shared_mem", "NCCL's kernels fit the GPU's shared memory", FAIL,
                         f"ncclMaxSharedMem {m['need']} exceeds device/fn maxSharedMem {m['has']}", "NCCL that knows "
                         "this GPU", "this NCCL is too old for the GPU (2.25.1 on a 5090, NVIDIA/nccl#1637): link NCCL "
                         ">= 2.26.2 (the profile's engine.nccl_root), not the system's", "P16"))
    if r["illegal_address"]:
        out.append(Check("paste.illegal_address", "no illegal memory access", FAIL,
                         "an illegal memory access was encountered", "none",
                         P28_FIX + "; a translating IOMMU (P32) corrupts P2P traffic too", "P28"))
    return out


def _transport(r: dict) -> list[Check]:
    """The transports NCCL chose: SHM between the GPUs of a P2P box (P30), TCP sockets between nodes (P23)."""
    out = []
    shm = [x for x in r["transports"] if x == "SHM"]
    if shm:
        out.append(Check("paste.nccl_transport", "NCCL connects the GPUs over P2P", WARN, "via SHM", "via P2P",
                         "NCCL's default P2P level stopped short of this topology: set NCCL_P2P_LEVEL (the service "
                         "stage writes it) or fix the P2P refusal", "P30"))
    if "NET/Socket" in r["transports"]:
        out.append(Check("paste.nccl_transport_net", "NCCL reaches the other node over RDMA", WARN, "NET/Socket",
                         "NET/IB", "NCCL fell back to TCP sockets (Docker, or no RDMA device): run natively and "
                         "prove NET/IB", "P23"))
    return out


def kernel_log(text: str, p: Profile) -> list[Check]:
    """A pasted kernel log (`sudo dmesg`, `journalctl -k`): a BAR the kernel could not assign or resize (P31), a GPU
    whose GSP cannot boot after a crash (P35), IOMMU faults (P32); without any of them "could not determine", since a
    paste cannot show it holds the whole boot."""
    out = _kernel(pf.kernel_log(text))
    return out or [could_not("paste.kernel_log", "the kernel log shows no BAR, GSP or IOMMU failure", "none of the "
                             "kernel lines p2pkit reads (BAR ... can't assign / no space / failed to assign, NVRM's "
                             "BAR1 is 0M, Fatal Error while attempting to resize PCIe BARs, unexpected WPR2 already "
                             "up, IO_PAGE_FAULT, DMAR [DMA Read|Write]) is in the paste",
                             "the whole `sudo dmesg` from boot", "P31")]


def _kernel(k: dict) -> list[Check]:
    """The field pitfalls' kernel lines (parse/field.py kernel_log), each as the stage that reads them on a host names
    it (rebar P31, link P35, topology P32)."""
    out = []
    if k["bar_no_space"] or k["resize_fatal"]:
        out.append(Check("paste.bar_assign", "the kernel assigned every GPU BAR (no failed resize)", FAIL,
                         "; ".join((k["resize_fatal"] + k["bar_no_space"])[:3]), "no BAR left unassigned", P31_FIX,
                         "P31"))
    if k["wpr2"]:
        out.append(Check("paste.gpu_wedged", "no GPU left wedged by a crash or hung collective", FAIL,
                         "; ".join(k["wpr2"][:2]), "no WPR2 line", P35_FIX, "P35"))
    if k["io_page_fault"]:
        out.append(Check("paste.iommu_fault", "no IOMMU fault", FAIL, "; ".join(k["io_page_fault"][:2]), "none",
                         P32_FIX, "P32"))
    return out
