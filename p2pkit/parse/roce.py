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
