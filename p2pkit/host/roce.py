"""RoCE ports from sysfs (P24): device names change across reboots and differ between identical
hosts, so the HCAs for NCCL are resolved each time, never hard-coded."""

from __future__ import annotations

import re

from p2pkit.host import Host

IB = "/sys/class/infiniband"


def ports(host: Host) -> list[dict]:
    """Every port: device, port number, state ("ACTIVE"), link layer ("Ethernet"), rate, netdevs."""
    out = []
    for dev in host.listdir(IB):
        netdevs = host.listdir(f"{IB}/{dev}/device/net")
        for port in host.listdir(f"{IB}/{dev}/ports"):
            base = f"{IB}/{dev}/ports/{port}"
            state = host.read(f"{base}/state").strip() if host.exists(f"{base}/state") else "unknown"
            layer = host.read(f"{base}/link_layer").strip() if host.exists(f"{base}/link_layer") else "unknown"
            rate = host.read(f"{base}/rate").strip() if host.exists(f"{base}/rate") else ""
            out.append({"device": dev, "port": int(port) if port.isdigit() else port,
                        "state": state.split(":", 1)[-1].strip(), "link_layer": layer, "netdevs": netdevs,
                        "rate": rate, "rate_gbps": rate_gbps(rate)})
    return out


def resolve(found: list[dict], fabric_netdevs: list[str]) -> list[str]:
    """`dev:port` of every ACTIVE Ethernet port on one of the fabric netdevs (NCCL_IB_HCA's format)."""
    return sorted(f"{p['device']}:{p['port']}" for p in found
                  if p["state"] == "ACTIVE" and p["link_layer"] == "Ethernet"
                  and (not fabric_netdevs or set(p["netdevs"]) & set(fabric_netdevs)))


def rate_gbps(text: str) -> float | None:
    """The kernel's port rate ("200 Gb/sec (4X HDR)", "25 Gb/sec (1X EDR)") in Gb/s."""
    m = re.match(r"^\s*([\d.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None
