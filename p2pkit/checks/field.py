"""The field pitfalls (P28-P39, shared/PITFALLS.md "From the field"), judged from what a host shows:
pure functions from facts and profile to findings. A fact that could not be read is a finding
"could not check, because ..." naming what to run by hand, never a pass."""

from __future__ import annotations

from p2pkit import engine_env as ee
from p2pkit.checks import FAIL, PASS, SKIP, WARN, Check, failed, figure, judge, place, reading, show
from p2pkit.config import Profile
from p2pkit.parse import field as pf

MIN_ROCE_MTU = 4200  # NVIDIA's guideline for RoCE (active MTU 4096); firmware updates drop it to 1500


def could_not(id: str, title: str, fact, expected, pitfall: str) -> Check:
    why = fact.get("error", "not read") if isinstance(fact, dict) else str(fact)
    by_hand = fact.get("by_hand", "") if isinstance(fact, dict) else ""
    return Check(id, title, WARN, f"could not check, because {why}", expected,
                 f"run by hand: {by_hand}" if by_hand else "rerun as root", pitfall)


def unreadable(fact) -> bool:
    return fact is None or failed(fact) or (isinstance(fact, dict) and "error" in fact)


def pair(p: Profile) -> bool:
    return p.gpus.count >= 2


def static_bar1(f: dict, p: Profile) -> list[Check]:
    """P28: the driver's live RegistryDwords hold what the fork needs (RMForceStaticBar1=1)."""
    if not pair(p) or not p.p2p_module.patched or not p.p2p_module.registry_dwords:
        return []
    id_, title = "field.static_bar1", "driver uses the static full-VRAM BAR1 mapping"
    want = pf.registry_dwords(p.p2p_module.registry_dwords)
    d = f.get("driver_params")
    expected = f"RegistryDwords holds {p.p2p_module.registry_dwords}"
    if unreadable(d):
        return [could_not(id_, title, d, expected, "P28")]
    if not d.get("loaded"):
        return [Check(id_, title, SKIP, "no nvidia module loaded", expected, "", "P28")]
    live = d["registry_dwords"]
    missing = [f"{k}={v}" for k, v in want.items() if live.get(k, "").lower() != v.lower()]
    return [judge(id_, title, not missing, f"RegistryDwords: \"{d['params'].get('RegistryDwords', '')}\"", expected,
                  "topo -p2p may say OK while NCCL hangs in ncclCommInitRank: p2pkit writes "
                  "/etc/modprobe.d/p2pkit-nvidia.conf (options nvidia NVreg_RegistryDwords=\""
                  f"{p.p2p_module.registry_dwords}\") and rebuilds the initramfs: `p2pkit up --from p2p-module "
                  "--force`, then reboot; check with `grep -i registrydwords /proc/driver/nvidia/params` (the sysfs "
                  "parameter reads empty even when live)", pitfall="P28")]


def acs_redirect(f: dict, p: Profile) -> list[Check]:
    """P29: no ACS request/completion redirect on a bridge above the GPUs."""
    if not pair(p):
        return []
    a = f.get("acs")
    id_, title, want = "field.acs", "no ACS redirect on the bridges above the GPUs", "ReqRedir- CmpltRedir-"
    if unreadable(a):
        return [could_not(id_, title, a, want, "P29")]
    out = []
    bad = [f"{x['bdf']} {' '.join(n + '+' for n in pf.redirects(x['flags']))}" for x in a["ports"]
           if pf.redirects(x.get("flags"))]
    unread = [x for x in a["ports"] if "error" in x]
    if unread:
        out.append(could_not(id_ + ".unread", "ACS control readable on every bridge", unread[0], want, "P29"))
    checked = [x["bdf"] for x in a["ports"] if "error" not in x]
    if not checked:
        return out or [could_not(id_, title, {"error": "no bridge above the GPUs was found in sysfs",
                                              "by_hand": "sudo lspci -vvv | grep -E '^[0-9a-f]|ACSCtl'"}, want, "P29")]
    out.append(judge(id_, title, not bad, "; ".join(bad) or f"no redirect on {', '.join(checked) or 'no bridge'}",
                     want, "ACS redirect sends P2P traffic up to the root complex (NCCL deadlocks or P2P bandwidth "
                     "collapses): turn ACS off in the BIOS (AMD CBS > NBIO > ACS, or PCIe ACS Control), or boot "
                     "with pci=noacs; at runtime `setpci -s <bridge> ECAP_ACS+6.w=0000` for each bridge listed",
                     pitfall="P29"))
    return out


def relation(f: dict) -> str | None:
    t = f.get("smi_topo_m")
    if unreadable(t):
        return None
    return t.get("pair") or t["matrix"].get("GPU0", {}).get("GPU1")


def service_env(f: dict, p: Profile) -> tuple[dict[str, str], str]:
    """The engine's environment as installed (/etc/p2pkit/engine.env), else what p2pkit would render."""
    installed = f.get("engine_env_file")
    if isinstance(installed, dict) and installed.get("env") is not None:
        return installed["env"], installed["path"]
    vendor = (f.get("iommu") or {}).get("cpu_vendor", "")
    rel = relation(f)
    return ee.engine_env(p, ee.p2p_level(rel, vendor, p.gpus.count) if rel else None), "the rendered environment"


def nccl_p2p_level(f: dict, p: Profile) -> list[Check]:
    """P30 and P17: NCCL's own rule lets it take P2P across this pair in the engine's environment."""
    if not pair(p):
        return []
    rel = relation(f)
    io = f.get("iommu") or {}
    vendor = io.get("cpu_vendor", "unknown")
    id_, title = "field.nccl_p2p_level", "NCCL's P2P level reaches across the pair"
    if rel is None:
        return [could_not(id_, title, f.get("smi_topo_m") or {"error": "no GPU pair in `nvidia-smi topo -m`",
                                                              "by_hand": "nvidia-smi topo -m"},
                          "NCCL_P2P_LEVEL at or above the pair's relation", "P30")]
    env, where = service_env(f, p)
    need = pf.nccl_level_needed(rel, vendor, p.gpus.count) if rel in pf.SMI_TO_NCCL else None
    default = pf.nccl_default_level(vendor, p.gpus.count)
    level = env.get("NCCL_P2P_LEVEL")
    ok = need is None or (level is not None and level.upper() in pf.P2P_LEVELS and pf.nccl_level_allows(level, rel))
    out = [judge(id_, title, ok, f"{vendor} CPU, GPUs {rel} apart; NCCL default {default}; "
                 f"NCCL_P2P_LEVEL={level or '(unset)'} in {where}", f"NCCL_P2P_LEVEL>={need}" if need else
                 f"default {default} covers {rel}",
                 f"NCCL's default P2P level stops at {default} on this CPU, so it takes SHM across {rel} although P2P "
                 f"works: the service must set NCCL_P2P_LEVEL={need} (`p2pkit up --from service --force` renders it)",
                 pitfall="P30")]
    blockers = ee.p2p_blockers(env, rel)
    out.append(judge("field.engine_nccl_p2p", "the engine's own NCCL may take P2P", not blockers,
                     "; ".join(blockers) or f"nothing in {where} turns NCCL's P2P off", "no NCCL_P2P_DISABLE, level "
                     f">= {pf.SMI_TO_NCCL.get(rel, rel)}", "P2P is proven on the hardware but the engine's NCCL is "
                     "told not to use it: remove it from [serve.env] (keep NCCL_P2P_DISABLE=1 only for an A/B run)",
                     pitfall="P17"))
    if p.engine.recipe == "llamacpp":
        out.append(judge("field.ggml_cuda_p2p", "llama.cpp enables peer access (GGML_CUDA_P2P)",
                         env.get("GGML_CUDA_P2P", "") not in ("", "0"), env.get("GGML_CUDA_P2P", "(unset)"), "set",
                         "llama.cpp enables peer access outside NCCL only when GGML_CUDA_P2P is set "
                         "(ggml-cuda.cu): `p2pkit up --from service --force` writes it", pitfall="P17"))
    return out


def bar_assignment(f: dict, p: Profile) -> list[Check]:
    """P31: no BAR that could not be assigned, no failed resize at probe."""
    k = f.get("kernel_log")
    id_, title = "field.bar_assign", "kernel assigned every GPU BAR (no failed resize)"
    want = "no \"can't assign; no space\" / \"Fatal Error while attempting to resize PCIe BARs\""
    if unreadable(k):
        return [could_not(id_, title, k, want, "P31")]
    lines = k["bar_no_space"] + k["resize_fatal"]
    small = small_windows(f.get("pci_gpus"), p.gpus.vram_gib << 30)
    # the figure: the smallest BAR1 or bridge window short of VRAM (a kernel line alone carries no number)
    least = min(small, key=lambda x: x[1]) if small else None
    text = "; ".join([place(w, "{}" if (w, n) == least else show(n >> 20, "MiB")) for w, n in small] + lines[:3])
    return [reading(id_, title, FAIL if lines or small else PASS, least[1] >> 20 if least else None, "MiB",
                    want + f"; BAR1 and bridge window >= {p.gpus.vram_gib} GiB",
                    "the firmware left too little address space for BAR1 (it boots at 256 MiB and the resize fails; "
                  "a failed resize at probe leaves the GPU unbound): enable Above 4G Decoding and Resizable BAR "
                    "in the BIOS, disable CSM, then reboot", "P31",
                    text=text,
                    missing="; ".join(lines[:3]) or "no such kernel line, BAR1 and the bridge windows cover VRAM")]


def small_windows(gpus, vram: int) -> list[tuple[str, int]]:
    """P31 from sysfs: each GPU BAR1 or upstream bridge prefetchable window smaller than VRAM, as (what,
    with {} where its size goes; the size in bytes)."""
    out = []
    for g in gpus if isinstance(gpus, list) else []:
        if not isinstance(g, dict):
            continue
        if g.get("aperture") and g["aperture"]["size"] < vram:
            out.append((f"{g['bdf']} BAR1 {{}}", g["aperture"]["size"]))
        w = g.get("bridge_window") or {}
        if isinstance(w.get("prefetch_size"), int) and w["prefetch_size"] < vram:
            out.append((f"bridge {w['bdf']} above {g['bdf']}: prefetchable window {{}}", w["prefetch_size"]))
    return out


def iommu_translating(f: dict, p: Profile) -> list[Check]:
    """P32: no GPU behind a translating IOMMU domain; no IO page faults."""
    if not pair(p):
        return []
    gpus = [g for g in (f.get("pci_gpus") or []) if isinstance(g, dict)]
    trans = [f"{g['bdf']} ({g.get('iommu_group')})" for g in gpus if g.get("iommu_group") == "translating"]
    k = f.get("kernel_log")
    faults = [] if unreadable(k) else k["io_page_fault"]
    return [judge("field.iommu_domain", "GPUs not behind a translating IOMMU", not trans and not faults,
                  "; ".join(trans + faults[:2]) or "passthrough (identity) or no IOMMU group on every GPU",
                  "identity (passthrough) or none",
                  "with a translating IOMMU P2P copies return zeros or NaN with no error: set iommu=pt (the "
                  "p2p-module stage does) and reboot; one Intel Z890 board needed intel_iommu=off; the link stage's "
                  "integrity pattern proves the result both ways", pitfall="P32")]


def displays(f: dict, p: Profile) -> list[Check]:
    """P33: no display connected to a GPU of the pair (it turns that GPU's static BAR1 off)."""
    if not pair(p):
        return []
    d = f.get("drm")
    if unreadable(d):
        return [could_not("field.display", "no display on the P2P GPUs", d, "headless", "P33")]
    bdfs = {g["bdf"] for g in (f.get("pci_gpus") or []) if isinstance(g, dict)}
    on = [f"{c['card']}-{c['connector']} on {c['bdf']}" for c in d["connectors"]
          if c["status"] == "connected" and c["bdf"] in bdfs]
    return [judge("field.display", "no display on the P2P GPUs", not on, "; ".join(on) or "no connected display "
                  "on the GPUs", "headless", "a display (or Xorg) on one GPU turns its static BAR1 off: P2P fails for "
                  "pairs with it and the engine's output is garbled: run headless (iGPU or a third card for the "
                  "screen), or use the fork branch that keeps static BAR1 with a display", pitfall="P33",
                  severity=WARN)]


def module_sources(f: dict, p: Profile) -> list[Check]:
    """P34: only the patched module can load: no updates/ copy, the initramfs holds it and is newer."""
    if not pair(p) or not p.p2p_module.patched:
        return []
    m = f.get("module_sources")
    id_, title = "field.module_sources", "no other nvidia.ko can load (updates/, initramfs)"
    want = "only kernel/drivers/video/nvidia.ko; an initramfs rebuilt after it"
    if unreadable(m):
        return [could_not(id_, title, m, want, "P34")]
    problems = [f"{u} (DKMS wins over kernel/drivers/video)" for u in m["updates"]]
    ir = m.get("initramfs")
    out = []
    if unreadable(ir):
        out.append(could_not(id_ + ".initramfs", "initramfs holds the patched module", ir, want, "P34"))
    else:
        other = [x for x in ir["nvidia"] if "/kernel/drivers/video/" not in f"/{x}"]
        problems += [f"initramfs {ir['path']}: {x}" for x in other]
        if ir["nvidia"] and m.get("installed_mtime") and ir["mtime"] < m["installed_mtime"]:
            problems.append(f"{ir['path']} is older than the installed patched module: it still holds the one "
                            "before it")
    mod = f.get("module") or {}
    built = (f.get("built_module") or {}).get("srcversion")
    if built and mod.get("loaded_srcversion") and mod["loaded_srcversion"] != built and m.get("holders"):
        problems.append(f"loaded srcversion {mod['loaded_srcversion']} is not the built {built}; "
                        f"{', '.join(m['holders'])} hold nvidia (rmmod nvidia fails until they are "
                        "unloaded)")
    fine = "no copy under updates/" + ("" if unreadable(ir) else ", the initramfs holds the patched module")
    out.append(judge(id_, title, not problems, "; ".join(problems) or fine, want, "remove the stock copies (p2pkit "
                     "backs them up), rebuild the initramfs "
                     "(`update-initramfs -u -k $(uname -r)`), unload in order nvidia_drm nvidia_modeset nvidia_uvm "
                     "nvidia, or rerun `p2pkit up --from p2p-module --force` and reboot", pitfall="P34"))
    return out


def wedged(f: dict, p: Profile) -> list[Check]:
    """P35: no GPU busy with no process (NVML's utilization and compute processes, what `nvidia-smi -q`
    prints as Utilization/GPU and Processes), no "WPR2 already up" in the kernel log."""
    id_, title = "field.gpu_wedged", "no GPU left wedged by a hung collective"
    n, k = f.get("nvml"), f.get("kernel_log")
    busy = [] if unreadable(n) else [g for g in n["gpus"] if isinstance(g.get("util_gpu_pct"), int)
                                     and g["util_gpu_pct"] >= 90 and g.get("processes") == []]
    lines = [] if unreadable(k) else k["wpr2"]
    if unreadable(k) and unreadable(n):
        return [could_not(id_, title, k, "idle GPUs, no WPR2 line", "P35")]
    # the figure: the busiest GPU that runs no process (a kernel line alone carries no number)
    top = max(busy, key=lambda g: g["util_gpu_pct"]) if busy else None
    text = "; ".join([f"{g['bus_id']} {'{}' if g is top else show(g['util_gpu_pct'], '%')} busy, no process"
                      for g in busy] + lines[:2])
    out = [reading(id_, title, FAIL if busy or lines else PASS, top["util_gpu_pct"] if top else None, "%",
                   "idle GPUs, no WPR2 line", "a hung NCCL collective leaves the GPU spinning until a reset: reboot "
                   "before the next stage (the driver cannot boot GSP on it again: \"WPR2 already up\")", "P35",
                   text=text, missing="; ".join(lines[:2]) or "no busy GPU without a process, no WPR2 line")]
    if unreadable(k):
        out.append(could_not(id_ + ".kernel_log", "kernel log readable", k, "readable", "P35"))
    return out


def boot_default(f: dict, p: Profile) -> list[Check]:
    """P36: the kernel hook held the boot default at the working kernel when the build for a new one failed."""
    b = f.get("boot_hold")
    if not isinstance(b, dict) or failed(b):
        return []
    held = b.get("held")
    return [judge("field.boot_default", "boot default not held back by a failed module build", not held,
                  f"booting {held['kernel']}: the P2P module did not build for {held['new_kernel']}" if held else
                  "no hold", "no hold", f"the new kernel {held['new_kernel'] if held else ''} breaks the module build "
                  "(a kernel API removed): pin a fork commit that builds for it, then rerun the hook "
                  f"(`sudo /etc/kernel/postinst.d/zz-p2pkit {held['new_kernel'] if held else '<new>'}`: it lifts "
                  "the hold when the build succeeds) and `sudo update-grub`", pitfall="P36", severity=WARN)]


def floor_check(id_: str, title: str, found: list[tuple[str, str | None]], p: Profile) -> Check:
    pit = "P16" if p.engine.recipe == "llamacpp" else "P37"
    floor = pf.version_tuple(p.engine.nccl_min)
    low = [f"{path} {v or 'version unknown'}" for path, v in found if v is None or pf.version_tuple(v) < floor]
    measured = "; ".join(f"{path} {v or 'version unknown'}" for path, v in found)
    return judge(id_, title, bool(found) and not low, measured or "no libnccl", f">= {p.engine.nccl_min}",
                 ("NCCL 2.25.1 fails on the 5090 (ncclMaxSharedMem ... exceeds) and 2.18.3 hangs on SM120: point "
                  "engine.nccl_root at NCCL >= 2.26.2" if pit == "P16" else
                  "NCCL before 2.29.3 leaks proxy slots on aarch64 (hangs after 20-55 minutes); the pip wheel and "
                  "the system library are different builds: install NCCL >= 2.29.3 where the engine loads it "
                  "and restart it"), pitfall=pit)


def nccl_floor(f: dict, p: Profile) -> list[Check]:
    """P16/P37: the NCCL the profile points at, and the one the running engine has mapped, meet the floor."""
    if not p.engine.nccl_min:
        return []
    out = []
    pn = f.get("profile_nccl")
    if isinstance(pn, dict) and pn.get("path"):
        if unreadable(pn):
            out.append(could_not("field.nccl_floor.profile", "the profile's NCCL meets the floor", pn,
                                 f">= {p.engine.nccl_min}", "P16"))
        else:
            out.append(floor_check("field.nccl_floor.profile", "the profile's NCCL meets the floor",
                                   [(pn["path"], pn["version"])], p))
    e = f.get("engine_nccl")
    if e is None or (isinstance(e, dict) and e.get("running") is False):
        out.append(Check("field.nccl_floor.engine", "the engine's mapped NCCL meets the floor", SKIP,
                         "the engine is not running", f">= {p.engine.nccl_min}", "", "P37"))
    elif unreadable(e):
        out.append(could_not("field.nccl_floor.engine", "the engine's mapped NCCL meets the floor", e,
                             f">= {p.engine.nccl_min}", "P37"))
    else:
        found = [(x["path"], x["version"]) for x in e["libraries"]]
        c = floor_check("field.nccl_floor.engine", f"NCCL mapped by the engine (pid {e['pid']}) meets the floor",
                        found, p)
        if len({v for _, v in found}) > 1 or len(found) > 1:
            c = Check(c.id, c.title, FAIL if c.status == FAIL else WARN, c.measured + " (more than one NCCL mapped)",
                      c.expected, c.hint or "two NCCL builds in one process: keep one (LD_LIBRARY_PATH, RUNPATH)",
                      c.pitfall)
        out.append(c)
    return out


def roce(f: dict, p: Profile) -> list[Check]:
    """P38: each ACTIVE fabric port has a RoCE v2 IPv4 GID (its index named per node) and a jumbo MTU."""
    if not p.network.require_roce:
        return []
    r = f.get("roce_gids")
    id_ = "field.roce"
    if unreadable(r):
        return [could_not(id_, "RoCE GID index and MTU", r, "a RoCE v2 IPv4 GID, MTU >= 4200", "P38")]
    out = []
    pinned = p.serve.env.get("NCCL_IB_GID_INDEX")
    fabric = set(p.network.fabric_netdevs)
    for port in r["ports"]:
        if port["state"] != "ACTIVE" or (fabric and not fabric & set(port["netdevs"])):
            continue
        name = f"{port['device']}:{port['port']}"
        v4 = [g for g in port["gids"] if g["type"].startswith("RoCE v2") and g["gid"].startswith("0000:0000:0000:0000"
                                                                                                 ":0000:ffff")]
        idx = [g["index"] for g in v4]
        ok = bool(v4) and (pinned is None or int(pinned) in idx)
        out.append(judge(f"{id_}.gid.{name}", f"{name} ({','.join(port['netdevs'])}) RoCE v2 IPv4 GID", ok,
                         f"RoCE v2 IPv4 GID index {','.join(map(str, idx)) or 'none'} on {','.join(port['netdevs'])}"
                         + (f"; NCCL_IB_GID_INDEX={pinned} pinned" if pinned is not None else ""),
                         "a RoCE v2 IPv4 GID; no pinned index that differs",
                         "the GID index differs per node and drifts (interface events reshuffle the table): leave "
                         "NCCL_IB_GID_INDEX unset so NCCL picks the RoCE v2 IPv4 GID per device; give the port its "
                         "IPv4 address", pitfall="P38"))
        for nd, mtu in port["mtu"].items():
            out.append(figure(f"{id_}.mtu.{nd}", f"{nd} MTU", mtu, ">=", MIN_ROCE_MTU, "bytes",
                              f"the MTU fell back to {mtu} (firmware updates do this): `ip link set {nd} mtu 9000` "
                              "on both nodes and in netplan", pitfall="P38", severity=WARN))
    return out


def kernel_archs(f: dict, p: Profile) -> list[Check]:
    """P39: the engine's kernels carry SASS for the GPU's architecture."""
    e = f.get("engine_archs")
    if e is None:
        return []
    want = "sm_" + "".join(ch for ch in p.engine.cuda_architectures.split(";")[0] if ch.isdigit())
    id_, title = "field.kernel_archs", "engine kernels built for the GPU's architecture"
    if isinstance(e, dict) and e.get("missing"):
        return [Check(id_, title, SKIP, e["missing"], want, "", "P39")]
    if unreadable(e):
        return [could_not(id_, title, e, want, "P39")]
    return [judge(id_, title, pf.arch_covers(e["archs"], want), f"{e['library']}: {', '.join(e['archs']) or 'no SASS'}",
                  f"includes {want}", f"the build dropped {want} (CUDA 13's arch matching, vllm#36835): rebuild with "
                  f"the arch list naming {want[3:]} (TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES)",
                  pitfall="P39")]


# What doctor reads for these checks (p2pkit.facts names them).
FACTS = ("driver_params", "acs", "kernel_log", "drm", "module_sources", "roce_gids", "smi_topo_m", "nvml", "iommu",
         "pci_gpus", "module", "built_module", "boot_hold", "engine_env_file", "engine_nccl", "engine_archs",
         "profile_nccl")

JUDGES = (static_bar1, acs_redirect, nccl_p2p_level, bar_assignment, iommu_translating, displays, module_sources,
          wedged, boot_default, nccl_floor, roce, kernel_archs)


def check(f: dict, p: Profile) -> list[Check]:
    return [c for j in JUDGES for c in j(f, p)]

