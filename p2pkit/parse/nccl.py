"""NCCL_DEBUG=INFO connection lines: which transport NCCL picked for each channel.

The forms, read from NCCL's own source (github.com/NVIDIA/nccl, src/transport/{p2p,shm,net,coll_net}.cc
at each release tag):

- P2P: "via P2P/direct pointer[/read]" (same process), "via P2P/IPC[/read][/CE]" (legacy CUDA IPC),
  "via P2P/CUMEM[/read][/CE]" (cuMem API, 2.18.1 on), "via P2P/MNNVL..." (multi-node NVLink,
  2.20.3 on: "P2P/%s" with "MNNVL" or "CUMEM"), "via P2P/indirect/R[D]" (through another GPU, 2.8 on),
  "via P2P/common device" (2.7 and before).
- SHM: "via direct shared memory" (2.12 and before), "via SHM/direct/direct" or "SHM/CE/direct"
  (2.13 to 2.30.4, send/receive), "via SHM/direct" (2.30.7). SHM lines never carry "/N" after the
  channel number.
- NET: "[send] via NET/<net>/<dev>[(proxy)][/GDRDMA][(PCI)][/Shared]", where <net> is the network's
  name: "IB", "Socket", or a plugin's ("IBext_v8" from nccl-rdma-sharp-plugins, "AWS Libfabric"
  from aws-ofi-nccl: a name with a space). The channel reads "Channel NN/C" from 2.12 on, "Channel
  NN" before; P2P lines got "/C" in 2.14.
- COLLNET: "CollNet NN/C : R [send] via COLLNET/<net>/<dev>" ("Coll NN" in 2.7 and 2.8).
- Up to 2.5 every line began "Ring NN :" instead of "Channel NN :".
"""

from __future__ import annotations

import re

CONNECTION = re.compile(
    r"(?:^|\s)(?:Channel|Ring|CollNet|Coll) \d+(?:/\d+)? : .*? via "
    r"(?:NET/(?P<net>.+?)/\d+|COLLNET/(?P<coll>.+?)/\d+"
    r"|P2P/(?P<p2p>direct pointer|common device|indirect|IPC|CUMEM|MNNVL)|(?P<shm>SHM/\w+|direct shared memory))")


def transport(line: str) -> str | None:
    """One line's transport, named the same way for every release: "P2P/CUMEM", "SHM",
    "NET/IB", "NET/IBext_v8", "NET/Socket", "NET/AWS Libfabric", "COLLNET/<net>"; None when
    the line is not a connection line."""
    m = CONNECTION.search(line)
    if not m:
        return None
    if m["net"]:
        return f"NET/{m['net']}"
    if m["coll"]:
        return f"COLLNET/{m['coll']}"
    if m["p2p"]:
        return f"P2P/{m['p2p']}"
    return "SHM"


def transports(lines: list[str]) -> list[str]:
    """Every transport the lines name, sorted, each once."""
    return sorted({t for ln in lines if (t := transport(ln))})


def is_rdma(t: str) -> bool:
    """NCCL's verbs transport, built in (NET/IB) or an external IB plugin (NET/IBext_v8)."""
    return t.startswith("NET/IB")


def is_socket(t: str) -> bool:
    """The TCP fallback."""
    return t == "NET/Socket"


PAIR = re.compile(r"(?:Channel|Ring|CollNet|Coll) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[\w+\])? -> "
                  r"(?P<dst>\d+)(?:\[\w+\])?")
VERSION_LINE = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
SET_BY_ENV = re.compile(r"NCCL INFO (NCCL_\w+) set by environment to (.+?)\.?\s*$")


def connections(lines: list[str]) -> list[dict]:
    """Every connection line: its channel, the ranks it joins (None where the form names none) and the
    transport, in log order."""
    out = []
    for ln in lines:
        t = transport(ln)
        if t is None:
            continue
        m = PAIR.search(ln)
        out.append({"channel": int(m["ch"]) if m else None, "from": int(m["src"]) if m else None,
                    "to": int(m["dst"]) if m else None, "transport": t})
    return out


def is_net(t: str) -> bool:
    """Across nodes: NCCL's network transports (NET/..., COLLNET/...)."""
    return t.startswith(("NET/", "COLLNET/"))


def init_summary(lines: list[str]) -> dict:
    """What NCCL_DEBUG=INFO says of the communicators one engine start formed: the NCCL version, the
    settings it took from the environment ("NCCL_P2P_LEVEL set by environment to SYS."), each
    connection, and the transports by where they run (between GPUs of this node, across nodes)."""
    conns = connections(lines)
    version = next((m.group(1) for ln in lines if (m := VERSION_LINE.search(ln))), None)
    env = {m.group(1): m.group(2) for ln in lines if (m := SET_BY_ENV.search(ln))}
    local = [c for c in conns if not is_net(c["transport"])]
    return {"version": version, "env": env, "connections": len(conns),
            "local": sorted({c["transport"] for c in local}),
            "local_not_p2p": [f"{c['from']}->{c['to']} channel {c['channel']} via {c['transport']}" for c in local
                              if not c["transport"].startswith("P2P/")],
            "across": sorted({c["transport"] for c in conns if is_net(c["transport"])})}
