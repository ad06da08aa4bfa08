"""RoCE ports from sysfs (P24): device names change across reboots and differ between identical
hosts, so the HCAs for NCCL are resolved each time, never hard-coded."""

from __future__ import annotations

from p2pkit.host import Host
from p2pkit.parse.roce import rate_gbps

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


def interfaces(host: Host) -> list[dict] | dict:
    """This node's interfaces and their IPv4 addresses (`ip -j -4 addr show`), or {"error": ...}."""
    from p2pkit.core.errors import P2pkitError
    from p2pkit.parse.roce import ipv4_interfaces

    try:
        r = host.runner.run(["ip", "-j", "-4", "addr", "show"], check=False, timeout=30)
    except P2pkitError as e:
        return {"error": e.message}
    if r.returncode != 0:
        return {"error": f"`ip -j -4 addr show` exited {r.returncode}: {r.stderr.strip()[:200]}"}
    try:
        return ipv4_interfaces(r.stdout)
    except (ValueError, KeyError, TypeError) as e:
        return {"error": f"`ip -j -4 addr show` printed no interface list p2pkit reads: {e}"}
