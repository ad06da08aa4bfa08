"""topology: each GPU straight on a CPU root port, link capability, IOMMU, P2P status both ways."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.parse import field as pf
from p2pkit.parse.roce import resolve
from p2pkit.parse.smi import relation_has_switch, relation_meaning
from p2pkit.rules.findings import FAIL, WARN, Check, could_not, failed, figure, judge, pair, reads, unknown, unreadable
from p2pkit.rules.hints import TWO_GPUS

P2P_CAUSES = {
    "CNS": "chipset not supported: the stock driver refuses GeForce P2P; the P2P-patched module is not the one "
           "loaded (run the p2p-module stage, reboot), or this chipset cannot route peer traffic",
    "GNS": "GPU not supported: this GPU/driver pair has no P2P; check the module is the patched 615.71.09 one",
    "TNS": "topology not supported: a PCIe switch or a translating IOMMU sits between the GPUs; put each GPU on "
           "a CPU root port and set iommu=pt",
    "NS": "not supported: BAR1 smaller than VRAM (see rebar: Resizable BAR and Above 4G in BIOS) or the stock "
          "module is loaded",
    "DR": "disabled by regkey: remove NVreg_RegistryDwords P2P overrides from /etc/modprobe.d and reload",
    "U": "unknown: the driver did not answer (is the module loaded? see p2p-module)",
}


@reads("pci_gpus", "nvml", "smi_p2p_read", "smi_p2p_write", "smi_topo_m", "roce")
def check(f: dict, p: Profile) -> list[Check]:
    gpus = f.get("pci_gpus")
    if failed(gpus):
        return [unknown("topology.gpus", "GPUs in sysfs", gpus, p.gpus.count)]
    if p.gpus.count < 2:  # one GPU per host (a Spark node): no PCIe P2P to judge, only the link and fabric
        out = [figure("topology.gpu_count", "the profile's GPUs in sysfs", len(gpus), "==", p.gpus.count, "count",
                      "seat the GPU the profile names, or pick the profile of this host")]
        out += [_capability(g, p) for g in gpus]
        if p.network.require_roce:
            out.append(_roce(f, p))
        return out
    out = [figure("topology.gpu_pair", "two GPUs for P2P", len(gpus), ">=", 2, "count", TWO_GPUS.format(n=len(gpus)))]
    for g in gpus:
        out += [_root_port(g, p), _capability(g, p), _iommu(g)]
    if len(gpus) >= 2:
        out += [_smi(f, "read", "smi_p2p_read"), _smi(f, "write", "smi_p2p_write"), _nvml_p2p(f),
                _topo_m(f.get("smi_topo_m"), gpus[:2])]
    if p.network.require_roce:
        out.append(_roce(f, p))
    return out


def _roce(f: dict, p: Profile) -> Check:

    found = f.get("roce")
    want = f"an ACTIVE Ethernet port on {', '.join(p.network.fabric_netdevs) or 'any netdev'}"
    if failed(found) or found is None:  # None: a facts file recorded before the fact existed
        return unknown("topology.roce", "RoCE port for NCCL", found or {"error": "not read"}, want, pitfall="P24")
    hcas = resolve(found, p.network.fabric_netdevs)
    seen = ", ".join(f"{x['device']}:{x['port']} {x['state']} {x['link_layer']} ({','.join(x['netdevs']) or '-'})"
                     for x in found) or "no RDMA device in /sys/class/infiniband"
    return judge("topology.roce", "RoCE port for NCCL", bool(hcas), f"NCCL_IB_HCA={','.join(hcas)}" if hcas
                 else seen, want, "bring the fabric port up (cable, switch, `ip link set <netdev> up`) and check "
                 "network.fabric_netdevs; device names change across reboots, so p2pkit resolves them each "
                 "time (`p2pkit net hca`) instead of hard-coding NCCL_IB_HCA", pitfall="P24")


def _root_port(g: dict, p: Profile) -> Check:
    bdf = g["bdf"]
    up = g.get("upstream", [])
    title = f"{bdf} directly on a CPU root port"
    if not up:
        return Check(f"topology.root_port.{bdf}", title, WARN, "on the root bus with no bridge above it "
                     "(a virtual machine's passthrough?)", "root port",
                     "a VM hides the real topology: judge P2P on the host itself")
    types = [u.get("port_type") for u in up]
    switch = [u["bdf"] for u in up if u.get("port_type") in ("switch upstream", "switch downstream")]
    chain = " > ".join(f"{u['bdf']} ({u.get('port_type') or 'type unknown'})" for u in up)
    if switch:
        return Check(f"topology.root_port.{bdf}", title, WARN if p.pcie.allow_switch else FAIL, chain, "root port",
                     "a PCIe switch (PLX) sits between this GPU and the CPU: it breaks ReBAR and P2P bandwidth; "
                     "move the GPU to a slot wired to the CPU (see the board manual)")
    if types[-1] is None:
        return Check(f"topology.root_port.{bdf}", title, WARN, chain, "root port",
                     "could not read the port type from config space (run as root)")
    return judge(f"topology.root_port.{bdf}", title, types[-1] == "root port" and len(up) == 1, chain, "root port",
                 "the GPU is not directly on a root port: use a CPU-attached slot")


def _capability(g: dict, p: Profile) -> Check:
    bdf = g["bdf"]
    link = g.get("link", {})
    parent = g.get("parent_link") or {}
    gens = [x for x in (link.get("max_gen"), parent.get("max_gen")) if x]
    widths = [x for x in (link.get("max_width"), parent.get("max_width")) if x]
    want = f">= Gen{p.pcie.min_gen} x{p.pcie.min_width}"
    title = f"link capability of {bdf} (GPU and slot)"
    if not gens or not widths:
        return Check(f"topology.capability.{bdf}", title, FAIL, "could not determine: no link files in sysfs", want,
                     "; ".join(g.get("errors", [])) or "check /sys/bus/pci/devices/<bdf>/max_link_*")
    gen, width = min(gens), min(widths)
    return judge(f"topology.capability.{bdf}", title, gen >= p.pcie.min_gen and width >= p.pcie.min_width,
                 f"Gen{gen} x{width}", want,
                 f"this slot trains at most Gen{gen} x{width}: move the GPU to a Gen{p.pcie.min_gen} "
                 f"x{p.pcie.min_width} CPU slot, or check the BIOS PCIe speed setting (Auto / Gen{p.pcie.min_gen})")


def _iommu(g: dict) -> Check:
    bdf = g["bdf"]
    mode = g.get("iommu_group", "unknown")
    return judge(f"topology.iommu.{bdf}", f"IOMMU does not translate for {bdf}", mode in ("passthrough", "none"),
                 mode, "passthrough or off",
                 "a translating IOMMU gives IO_PAGE_FAULT and zero-filled P2P tensors: the p2p-module stage "
                 "adds iommu=pt to the kernel command line; reboot after it")


def _smi(f: dict, mode: str, key: str) -> Check:
    fact = f.get(key)
    title = f"nvidia-smi topo -p2p {mode[0]}: OK both ways"
    if failed(fact):
        return unknown(f"topology.p2p_{mode}", title, fact, "OK")
    bad = {(r, c): v for r, row in fact["matrix"].items() for c, v in row.items() if r != c and v != "OK"}
    pairs = ", ".join(f"{r}->{c} {v}" for (r, c), v in sorted(bad.items())) or "all OK"
    hint = "; ".join(f"{v}: {P2P_CAUSES.get(v, 'unknown code')}" for v in sorted(set(bad.values())))
    return judge(f"topology.p2p_{mode}", title, not bad, pairs, "OK", hint, pitfall="P17")


def _topo_m(fact, pair: list[dict]) -> Check:
    """`nvidia-smi topo -m`'s relation of GPU0 and GPU1 against what sysfs says of the ports above
    them: PIX/PXB (they meet under PCIe bridges: a switch) must agree with a switch in sysfs;
    PHB/NODE/SYS (they meet at the CPU) with each GPU on its own root port."""
    title = "nvidia-smi topo -m agrees with the PCIe path in sysfs"
    if failed(fact) or fact is None:
        return unknown("topology.topo_m", title, fact or {"error": "not collected"}, "agreement", needed=False)
    code = fact.get("pair")
    if not code:
        return unknown("topology.topo_m", title, {"error": fact.get("pair_error", "no GPU pair")}, "agreement",
                       needed=False)
    seen = f"{code} ({relation_meaning(code)})"
    if any(not g.get("upstream") for g in pair):
        return Check("topology.topo_m", title, WARN, f"{seen}; sysfs shows no bridge above a GPU", "agreement",
                     "a VM hides the real topology: judge P2P on the host itself")
    switch = [u["bdf"] for g in pair for u in g["upstream"] if u.get("port_type") in
              ("switch upstream", "switch downstream")]
    sysfs = f"a PCIe switch ({', '.join(switch)})" if switch else "each GPU on a CPU root port"
    if code.startswith("NV"):
        return Check("topology.topo_m", title, WARN, f"{seen}; sysfs: {sysfs}", "a PCIe path",
                     "the GPUs talk over NVLink: this PCIe P2P profile does not apply to them")
    agree = relation_has_switch(code) == bool(switch)
    return judge("topology.topo_m", title, agree, f"{seen}; sysfs: {sysfs}",
                 "PIX/PXB with a switch in sysfs, PHB/NODE/SYS without",
                 "nvidia-smi and sysfs disagree about the path between the GPUs: one of them is not reading the "
                 "real hardware (a VM, a hidden switch, a stale nvidia-smi); check `lspci -tv` on the host",
                 severity=WARN)


def _nvml_p2p(f: dict) -> Check:
    nv = f.get("nvml")
    title = "NVML P2P status read/write OK both ways"
    if failed(nv):
        return unknown("topology.nvml_p2p", title, nv, "OK")
    bad = [f"{x['from']}->{x['to']} read {x['read']} write {x['write']}" for x in nv.get("p2p", [])
           if x.get("read") != "OK" or x.get("write") != "OK"]
    codes = sorted({x[k] for x in nv.get("p2p", []) for k in ("read", "write") if isinstance(x.get(k), str)
                    and x[k] != "OK"})
    return judge("topology.nvml_p2p", title, not bad and bool(nv.get("p2p")), "; ".join(bad) or "all OK", "OK",
                 "; ".join(f"{c}: {P2P_CAUSES.get(c, '')}" for c in codes), pitfall="P17")


# ---------------------------------------------------------------- field pitfalls (shared/PITFALLS.md)


@reads("acs")
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


@reads("pci_gpus", "kernel_log")
def iommu_translating(f: dict, p: Profile) -> list[Check]:
    """P32: no GPU behind a translating IOMMU domain; no IO page faults."""
    if not pair(p):
        return []
    gpus = [g for g in (f.get("pci_gpus") or []) if isinstance(g, dict)]
    trans = [f"{g['bdf']} ({g.get('iommu_group')})" for g in gpus if g.get("iommu_group") == "translating"]
    k = f.get("kernel_log")
    faults = [] if unreadable(k) else k["io_page_fault"]
    out = [judge("field.iommu_domain", "GPUs not behind a translating IOMMU", not trans and not faults,
                  "; ".join(trans + faults[:2]) or "passthrough (identity) or no IOMMU group on every GPU",
                  "identity (passthrough) or none",
                  "with a translating IOMMU P2P copies return zeros or NaN with no error: set iommu=pt (the "
                  "p2p-module stage does) and reboot; one Intel Z890 board needed intel_iommu=off; the link stage's "
                  "integrity pattern proves the result both ways", pitfall="P32")]
    if unreadable(k):  # the sysfs half is judged without the kernel log; the IO_PAGE_FAULT half could not be
        out.append(could_not("field.iommu_domain.kernel_log", "no IO_PAGE_FAULT in the kernel log", k, "none", "P32"))
    return out


@reads("drm", "pci_gpus")
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
