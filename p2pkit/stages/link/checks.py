"""link: trained to the profile's gen/width under real load; bandwidth as ratios to the link's
ceiling; P2P access, latency, integrity; replays not rising; clocks not locked (P03, P04, P17)."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.parse.pci import GEN_TO_GTS
from p2pkit.parse.roce import resolve
from p2pkit.rules.findings import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    could_not,
    failed,
    figure,
    judge,
    reading,
    reads,
    show,
    unknown,
    unreadable,
)
from p2pkit.rules.hints import TWO_GPUS


def ceiling_gbps(gen: int, width: int) -> float:
    """Raw one-way PCIe bandwidth in GB/s (1e9): GT/s x encoding x lanes / 8. Gen5 x8 = 31.5."""
    enc = 0.8 if gen <= 2 else 128 / 130
    return GEN_TO_GTS[gen] * enc * width / 8


LOCKED_FIX = ("someone locked the clocks (nvidia-smi -lgc / -ac): a locked clock does not fill the link and skews "
              "every later benchmark; reset with `sudo nvidia-smi -rgc` and `sudo nvidia-smi -rac`")


def locked_clocks(nv: dict | None) -> list[Check]:
    """P04 without load (doctor too): NVML's clock event reasons name the applications clocks setting
    (nvmlClocksEventReasonApplicationsClocksSetting, also set by locked clocks) on a GPU."""
    if nv is None:
        return []
    if failed(nv) or "gpus" not in nv:
        return [unknown("link.clocks_locked", "no GPU has locked clocks", nv, "none locked", needed=False,
                        pitfall="P04")]
    out = []
    for g in nv["gpus"]:
        i, lc = g.get("index"), g.get("locked_clocks")
        title = f"GPU{i} clocks not locked (nvidia-smi -lgc / -ac)"
        if not isinstance(lc, dict) or "applications_clocks_setting" not in lc:
            out.append(unknown(f"link.clocks_locked.gpu{i}", title, lc if isinstance(lc, dict) else
                               {"error": "NVML gave no clock event reasons"}, "free", needed=False, pitfall="P04"))
            continue
        on = lc["applications_clocks_setting"]
        out.append(judge(f"link.clocks_locked.gpu{i}", title, not on,
                         f"applications clocks setting limits the clocks (reasons {g.get('clock_event_reasons')})"
                         if on else f"free (reasons {g.get('clock_event_reasons')})", "free", LOCKED_FIX,
                         pitfall="P04"))
    return out


@reads("nvml", "roce", given=("link_load", "nccl_allreduce"))
def check(f: dict, p: Profile) -> list[Check]:
    locked = locked_clocks(f.get("nvml"))
    if "link_load" not in f:
        return [Check("link.load", "real load on every GPU", SKIP, "not measured here: doctor puts no load on "
                      "the GPUs", "a run of `p2pkit verify link`", "run `p2pkit verify link` to measure", "P03"),
                *locked]
    r = f.get("link_load")
    if failed(r) or r is None:
        return [unknown("link.load", "real load on every GPU", r or {"error": "no result"}, "a completed run"),
                *locked]
    lk = p.link
    out: list[Check] = list(locked)
    tgt = (p.pcie.min_gen, p.pcie.min_width)
    for g in r["gpus"]:
        i = g["index"]
        best = g["max_seen"]
        if best["gen"] is None:  # NVML answered NOT_SUPPORTED: nothing to judge a link by
            out.append(Check(f"link.trained.gpu{i}", f"GPU{i} link trains under load",
                             SKIP if p.gpus.count < 2 else FAIL, "NVML reports no PCIe link for this GPU",
                             f">= Gen{tgt[0]} x{tgt[1]}", "" if p.gpus.count < 2 else "P2P over BAR1 needs a PCIe "
                             "link NVML can read: check the driver (see p2p-module)", "P03"))
            continue
        idle = f"idle Gen{g['idle']['gen']} x{g['idle']['width']}"
        t = g.get("trained_after_s")
        out.append(figure(f"link.trained.gpu{i}", f"GPU{i} link trains under load", t, "<=", lk.train_within_s, "s",
                          "the link never reached the profile's speed under real load (idle Gen1 is normal ASPM and "
                          "never judged): reseat the card, check the slot's wiring and the BIOS PCIe speed "
                          "(Auto/Gen5), and riser cables", pitfall="P03",
                          context=(f"to Gen{best['gen']} x{best['width']}; {idle}" if t is not None else
                                   f"best Gen{best['gen']} x{best['width']} in {r['load_seconds']:.1f} s of load; "
                                   f"{idle}"),
                          expected_context=f"to Gen{tgt[0]} x{tgt[1]} or better", missing="never trained"))
        # a counter NVML did not give before or after the load is no rise of 0: a warning, not read
        read = g["replay_before"] is not None and g["replay_after"] is not None
        rise = g["replay_after"] - g["replay_before"] if read else None
        out.append(figure(f"link.replays.gpu{i}", f"GPU{i} PCIe replay counter steady", rise, "<=",
                          lk.max_replay_increase, "count",
                          "replays under load mean a marginal link: reseat, drop a riser, or force one Gen lower "
                          "in BIOS and compare" if read else "NVML gave no PCIe replay counter (nvidia-smi -q, "
                          "'Replays Number'): judge the link by its training and bandwidth, or update the driver",
                          severity=FAIL if read else WARN, missing="not read",
                          context=f"replays under load: {g['replay_before']} -> {g['replay_after']}"))
        out.append(judge(f"link.clocks.gpu{i}", f"GPU{i} clocks not locked", not g["app_clocks_reason_under_load"],
                         "applications/locked clocks limit active" if g["app_clocks_reason_under_load"] else "free",
                         "free", LOCKED_FIX, pitfall="P04",
                         severity="warn"))
        gen, width = best["gen"], best["width"]
        if gen:
            ceil = ceiling_gbps(gen, width)
            for key, name in (("h2d_gbps", "host-to-device"), ("d2h_gbps", "device-to-host")):
                v = g["host"][key]
                out.append(figure(f"link.{key[:3]}.gpu{i}", f"GPU{i} pinned {name} bandwidth", round(v / ceil, 4),
                                  ">=", lk.h2d_min_ratio, "ratio",
                                  "the link trains but does not carry: check for a switch, a riser, or a slot shared "
                                  "with another device (see topology)",
                                  context=f"{v:.1f} GB/s of Gen{gen} x{width}'s {ceil:.1f} GB/s"))
    n = r["device_count"]
    if p.gpus.count < 2:  # one GPU per host: the GPUs of the nodes meet over the fabric, not over PCIe
        return out + fabric(f, p)
    out.append(figure("link.p2p_pair", "two GPUs for P2P", n, ">=", 2, "count", TWO_GPUS.format(n=n), pitfall="P17"))
    ceil_by = {g["index"]: ceiling_gbps(g["max_seen"]["gen"], g["max_seen"]["width"]) for g in r["gpus"]
               if g["max_seen"]["gen"]}
    for x in r["pairs"]:
        a, b = x["from"], x["to"]
        tag = f"gpu{a}-gpu{b}"
        out.append(judge(f"link.p2p_access.{tag}", f"peer access GPU{a} -> GPU{b}", x["peer_access"],
                         x["peer_access"], True, "torch cannot enable peer access: see topology (P2P status) and "
                         "p2p-module (the patched module must be loaded)", pitfall="P17"))
        ceil = min(ceil_by.get(a, 0), ceil_by.get(b, 0)) or ceiling_gbps(p.pcie.min_gen, p.pcie.min_width)
        bw = x["unidir_gbps"]
        out.append(figure(f"link.p2p_bw.{tag}", f"P2P bandwidth GPU{a} -> GPU{b}", round(bw / ceil, 4), ">=",
                          lk.p2p_min_ratio, "ratio",
                          "P2P is slow: a translating IOMMU, a switch, or copies falling back to host staging; "
                          "compare with NCCL_P2P_DISABLE=1 to isolate P2P's effect", pitfall="P17",
                          context=f"{bw:.1f} GB/s of {ceil:.1f} GB/s; host-staged {x['staged_gbps']:.1f}, "
                                  f"x{bw / max(x['staged_gbps'], 1e-9):.1f}; both ways {x['bidir_gbps']:.1f}"))
        out.append(figure(f"link.p2p_latency.{tag}", f"P2P small-copy latency GPU{a} -> GPU{b}", x["latency_us"],
                          "<=", lk.p2p_max_latency_us, "us",
                          "latency is the clearest sign of P2P: ~0.4 us with the patch against ~14 us without; "
                          "check the patched module is loaded"))
        it = x["integrity"]
        differ = it["mismatches"] if it["equal"] else max(it["mismatches"], 1)  # unequal is never 0
        out.append(figure(f"link.p2p_integrity.{tag}", f"P2P copy integrity GPU{a} -> GPU{b}", differ, "==", 0,
                          "count", "a broken P2P path: zero-filled data is the IOMMU translating "
                          "(IO_PAGE_FAULT in dmesg): set iommu=pt (p2p-module stage) and reboot", "P17",
                          context=f"int32 of {it['elements']} differ; {it['zeros']} zero"))
    return out + nccl_allreduce(f, p)


def nccl_allreduce(f: dict, p: Profile) -> list[Check]:
    """P28/P30: NCCL itself, in the engine's environment, all-reduces across the pair over P2P, exactly,
    within the timeout: "topo says OK, NCCL hangs or takes SHM" fails here, not at the first request."""
    from p2pkit.parse.field import transport_kind
    from p2pkit.rules.engine_env import p2p_blockers

    id_, title, want = "link.nccl_allreduce", "NCCL all-reduce across the pair, engine's environment", "via P2P, exact"
    n = f.get("nccl_allreduce")
    if n is None:
        return [Check(id_, title, SKIP, "not measured here: doctor runs no NCCL", want, "run `p2pkit verify link`",
                      "P28")]
    if failed(n):
        return [unknown(id_, title, n, want, pitfall="P28")]
    env = ", ".join(f"{k}={v}" for k, v in n["env"].items()) or "no NCCL variables"
    last = (n["tail"] or ["no output"])[-1]
    if n["timed_out"]:
        return [reading(id_, title, FAIL, n["timeout_s"], "s", want,
                        "topo -p2p says OK but no bytes move: the driver is not using the static full-VRAM BAR1 "
                        "mapping (check `grep -i registrydwords /proc/driver/nvidia/params` for RMForceStaticBar1=1, "
                        "p2pkit's modprobe.d file and initramfs; reboot), or ACS redirects P2P (see `p2pkit doctor`, "
                        "P29); reboot before the next run: the hung GPUs stay busy (P35)", "P28",
                        text=f"no result within {{}}: NCCL hung (last line: {last}; {env})")]
    res = n.get("result") or {}
    if "error" in res or not res:
        return [Check(id_, title, FAIL, f"exit {n['exit']}: {res.get('error') or last}", want,
                      "the all-reduce did not complete: read the error; `p2pkit doctor` names field pitfalls "
                      "(P28-P39)", "P28")]
    kinds = {transport_kind(t) for t in n["transports"]}
    via = ", ".join(n["transports"]) or "no channel line"
    if kinds != {"p2p"}:
        told = p2p_blockers(n["env"], None)
        return [Check(id_, title, FAIL, f"via {via} ({env})", want,
                      "NCCL did not take P2P: " + (
                          f"the engine's environment says {', '.join(told)}: remove it from [serve.env] (P17)" if told
                          else "NCCL's default P2P level stops short of this pair's relation on this CPU (P30): the "
                          "service must set NCCL_P2P_LEVEL at or above it, and a lower one in [serve.env] wins "
                          "(P17); if the topology stage's P2P status is not OK, fix that first"),
                      "P17" if told else "P30")]
    wrong = res.get("wrong", [])
    if any(wrong):
        # the figure: the most wrong floats on any GPU (each GPU's count stays in the text)
        return [reading(id_, title, FAIL, max(wrong), "count", want,
                        "P2P moved wrong data with no error: a translating IOMMU (set iommu=pt), see P32", "P32",
                        text=f"via {via}: {{}} of {res['elements']} floats wrong on a GPU (per GPU: {wrong})")]
    return [reading(id_, title, PASS, res.get("seconds"), "s", want, pitfall="P28",
                    text=f"via {via}: {res['elements']} floats exact on both GPUs, NCCL {res.get('nccl_version')}, "
                    f"{{}} ({env})", missing=f"via {via}: {res['elements']} floats exact on both GPUs, NCCL "
                    f"{res.get('nccl_version')} ({env})")]


def fabric(f: dict, p: Profile) -> list[Check]:
    """Each RoCE port NCCL will use (resolved now, P24) runs at the profile's rate or better."""
    if not p.network.require_roce:
        return []

    found = f.get("roce")
    if failed(found) or found is None:
        return [unknown("link.fabric", "RoCE ports for NCCL", found or {"error": "not read"}, "ACTIVE ports",
                        pitfall="P24")]
    hcas = resolve(found, p.network.fabric_netdevs)
    if not hcas:
        return [Check("link.fabric", "RoCE ports for NCCL", FAIL, "no ACTIVE Ethernet port on "
                      + (", ".join(p.network.fabric_netdevs) or "any netdev"), "at least one",
                      "see topology.roce: bring the fabric port up (cable, switch, `ip link set <netdev> up`)", "P24")]
    out = []
    by = {f"{x['device']}:{x['port']}": x for x in found}
    want = p.network.min_rate_gbps
    for h in hcas:
        x = by[h]
        rate = x.get("rate_gbps")
        out.append(figure(f"link.fabric_rate.{h}", f"{h} ({','.join(x['netdevs'])}) port rate", rate, ">=", want,
                          "Gb/s", "the port trained below the fabric's rate: check the cable (DAC/AOC rated for the "
                          "speed), the switch port's speed setting, and `ethtool <netdev>`",
                          context=x.get("rate") or "the kernel reports no rate", missing="unknown"))
    return out


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)

MIN_ROCE_MTU = 4200  # NVIDIA's guideline for RoCE (active MTU 4096); firmware updates drop it to 1500


@reads("nvml", "kernel_log")
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


@reads("roce_gids")
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


# each bandwidth the load worker derives from timed copies: (figure, its samples, bytes per copy x)
SAMPLED = (("h2d_gbps", "h2d_ms", 1), ("d2h_gbps", "d2h_ms", 1))
SAMPLED_PAIR = (("unidir_gbps", "unidir_ms", 1), ("bidir_gbps", "bidir_ms", 2), ("staged_gbps", "staged_ms", 1))


def _from_samples(figure_: object, ms: object, nbytes: object) -> str | None:
    """Why a recorded bandwidth is not what its own samples give (the worker's median_gbps: bytes over the
    median copy time), or None. Samples that are no positive times are no samples."""
    if not isinstance(ms, list) or not ms or not all(isinstance(x, int | float) and 0 < x < float("inf") for x in ms):
        return f"no timed samples ({str(ms)[:40]})"
    if not isinstance(nbytes, int) or nbytes <= 0 or not isinstance(figure_, int | float):
        return f"no figure or size ({figure_!r}, {nbytes!r} bytes)"
    import statistics  # here: statistics imports fractions and decimal, and doctor never re-proves (issue 38 item 9)

    want = nbytes / (statistics.median(ms) / 1000) / 1e9
    if abs(figure_ - want) > 1e-9 * max(abs(want), 1.0):
        return f"{figure_:.3f} GB/s where its {len(ms)} samples give {want:.3f}"
    return None


def _host_figures(g: dict, bad: list[str]) -> int:
    """A GPU's host copies against their samples: how many were held, each one that is not added to `bad`."""
    host = g.get("host") if isinstance(g.get("host"), dict) else {}
    n = 0
    for key, ms, k in SAMPLED if host else ():
        n += 1
        if why := _from_samples(host.get(key), host.get(ms), (host.get("bytes") or 0) * k):
            bad.append(f"GPU{g.get('index')} {key}: {why}")
    return n


def _pair_figures(x: dict, size: int, bad: list[str]) -> int:
    """A pair's P2P copies against their samples and its integrity count against its own pattern: how many were
    held, each one that is not added to `bad`."""
    tag = f"GPU{x.get('from')}->GPU{x.get('to')}"
    n = 0
    for key, ms, k in SAMPLED_PAIR:
        if key == "unidir_gbps" or ms in x:  # bidir and staged samples recorded since this check
            n += 1
            if why := _from_samples(x.get(key), x.get(ms), (x.get("bytes") or size) * k):
                bad.append(f"{tag} {key}: {why}")
    i = x.get("integrity")
    if isinstance(i, dict) and "elements" in i:
        n += 1
        el, mis, zeros = i.get("elements"), i.get("mismatches"), i.get("zeros", 0)
        if not (isinstance(el, int) and isinstance(mis, int) and isinstance(zeros, int)
                and 0 <= mis <= el and 0 <= zeros <= el and i.get("equal") == (mis == 0)):
            bad.append(f"{tag} integrity: equal={i.get('equal')}, {mis} of {el} differ, {zeros} zero")
    return n


def reproved(recorded: dict, now: object, p: Profile) -> list[Check]:
    """The link artifact's figures within the bounds their own samples allow (status cannot put the load on
    again; `verify link` does): each bandwidth is the median of the timed copies recorded beside it, and each
    integrity count is one its own pattern allows. A figure edited by hand after the load is caught."""
    id_, title = "link.figures_from_samples", "each recorded figure is what its own samples give"
    load = recorded.get("link_load")
    if not isinstance(load, dict):
        return []  # nothing measured here (a host the load never ran on): the checks already judged that
    bad, n = [], 0
    for g in load.get("gpus") or []:
        n += _host_figures(g, bad)
    size = p.link.sample_mib << 20  # what the worker copied; recorded as `bytes` since
    for x in load.get("pairs") or []:
        n += _pair_figures(x, size, bad)
    return [Check(id_, title, FAIL if bad else PASS, "; ".join(bad) or f"{n} figures agree with their samples",
                  "every figure what its samples give", "the link artifact was changed after the load measured it: "
                  "run `p2pkit up --from link` to measure again" if bad else "")]
