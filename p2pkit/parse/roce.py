"""RoCE ports as the kernel reports them: which ports NCCL may use, and their rate. Pure functions."""

from __future__ import annotations

import re


def resolve(found: list[dict], fabric_netdevs: list[str]) -> list[str]:
    """`dev:port` of every ACTIVE Ethernet port on one of the fabric netdevs (NCCL_IB_HCA's format)."""
    return sorted(f"{p['device']}:{p['port']}" for p in found
                  if p["state"] == "ACTIVE" and p["link_layer"] == "Ethernet"
                  and (not fabric_netdevs or set(p["netdevs"]) & set(fabric_netdevs)))


def rate_gbps(text: str) -> float | None:
    """The kernel's port rate ("200 Gb/sec (4X HDR)", "25 Gb/sec (1X EDR)") in Gb/s."""
    m = re.match(r"^\s*([\d.]+)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def ipv4_interfaces(text: str) -> list[dict]:
    """`ip -j -4 addr show` (iproute2's JSON; tests/fixtures/net/ip-4-addr-netns.json is a real one): each interface's
    name, whether it is up (the UP flag and no NO-CARRIER), and its IPv4 addresses as "A.B.C.D/N"."""
    import json

    out = []
    for link in json.loads(text or "[]"):
        flags = link.get("flags") or []
        addrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info") or []
                 if a.get("family") == "inet" and a.get("local")]
        out.append({"ifname": link.get("ifname"), "up": "UP" in flags and "NO-CARRIER" not in flags, "addrs": addrs})
    return out


def rail(interfaces: list[dict], cidr: str) -> dict | None:
    """The rail interface of a node: the first interface that is up with an address inside the fabric's subnet
    (network.fabric_cidr), and that address; None when there is none."""
    import ipaddress

    net = ipaddress.ip_network(cidr, strict=False)
    for i in interfaces:
        for a in i["addrs"]:
            if i["up"] and ipaddress.ip_interface(a).ip in net:
                return {"ifname": i["ifname"], "address": a.split("/")[0]}
    return None
