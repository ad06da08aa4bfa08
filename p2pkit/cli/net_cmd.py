"""`p2pkit net hca`: the RoCE HCAs for NCCL, resolved from sysfs now (P24); `p2pkit net rail`: the node's rail
interface and address on the fabric's subnet, resolved from the node now (the engine's rendezvous, Gloo's
and NCCL's bootstrap sockets: P24's rule, never hard-coded)."""

from __future__ import annotations

from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import Exit

app = typer.Typer(help="The network between hosts (RoCE for NCCL).", no_args_is_help=True)


@app.command()
def hca(env_file: Annotated[str | None, typer.Option(
        "--env-file", help="also write NCCL_IB_HCA and the socket interfaces to this file (a path on the host), "
                           "for the engine unit's EnvironmentFile")] = None) -> None:
    """Print NCCL_IB_HCA=... for the ACTIVE Ethernet ports on the profile's fabric netdevs. The engine
    unit's ExecStartPre writes it to an environment file, so every start uses the names of this boot."""
    from p2pkit.host.roce import ports
    from p2pkit.parse.roce import resolve

    h = common.host()
    p = common.profile(h)
    found = ports(h)
    hcas = resolve(found, p.network.fabric_netdevs)
    out = common.output()
    out.simulated = h.simulated
    if hcas and env_file:
        from p2pkit.core.artifacts import atomic_write

        first = next(x for x in found if f"{x['device']}:{x['port']}" == hcas[0])
        netdev = next(n for n in first["netdevs"] if not p.network.fabric_netdevs or n in p.network.fabric_netdevs)
        text = (f"# written by `p2pkit net hca` at this start{' (SIMULATED)' if h.simulated else ''}\n"
                f"NCCL_IB_HCA={','.join(hcas)}\nNCCL_SOCKET_IFNAME={netdev}\nGLOO_SOCKET_IFNAME={netdev}\n")
        target = h.path(env_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text.encode())
    if common.OPTS.json:
        out.document({"hcas": hcas, "ports": found, "fabric_netdevs": p.network.fabric_netdevs})
    elif hcas:
        print(f"NCCL_IB_HCA={','.join(hcas)}")
    else:
        out.error("no ACTIVE Ethernet RDMA port on " + (", ".join(p.network.fabric_netdevs) or "any netdev"),
                  "bring the fabric port up and check network.fabric_netdevs in the profile (P24)")
    raise typer.Exit(int(Exit.OK if hcas else Exit.CHECK_FAILED))


@app.command()
def rail(env_file: Annotated[str | None, typer.Option(
        "--env-file", help="also write GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and VLLM_HOST_IP to this file (a path "
                           "on the host), for the engine unit's EnvironmentFile")] = None) -> None:
    """Print GLOO_SOCKET_IFNAME=... for the interface of this node that holds an address in network.fabric_cidr.
    The engine unit's ExecStartPre writes it to an environment file: without it Gloo advertises another address
    (loopback first) and the head dies waiting for its workers ("Gloo connectFullMesh failed")."""
    from p2pkit.host.roce import interfaces
    from p2pkit.parse.roce import rail as pick

    h = common.host()
    p = common.profile(h)
    out = common.output()
    out.simulated = h.simulated
    cidr = p.network.fabric_cidr
    found = interfaces(h) if cidr else {"error": "network.fabric_cidr is not set"}
    chosen = pick(found, cidr) if isinstance(found, list) else None
    if chosen and env_file:
        from p2pkit.core import writers
        from p2pkit.core.artifacts import atomic_write

        env = {"GLOO_SOCKET_IFNAME": chosen["ifname"], "NCCL_SOCKET_IFNAME": chosen["ifname"],
               "VLLM_HOST_IP": chosen["address"]}
        text = (f"# written by `p2pkit net rail` at this start{' (SIMULATED host)' if h.simulated else ''}\n"
                + writers.env_file(env, "", "net rail"))
        target = h.path(env_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, text.encode())
    if common.OPTS.json:
        out.document({"fabric_cidr": cidr, "rail": chosen, "interfaces": found if isinstance(found, list) else [],
                      **({"error": found["error"]} if isinstance(found, dict) else {})})
    elif chosen:
        print(f"GLOO_SOCKET_IFNAME={chosen['ifname']}\nNCCL_SOCKET_IFNAME={chosen['ifname']}\n"
              f"VLLM_HOST_IP={chosen['address']}")
    else:
        why = found["error"] if isinstance(found, dict) else \
            f"no interface of this node that is up holds an address in {cidr} (" + ", ".join(
                f"{i['ifname']} {' '.join(i['addrs']) or 'no IPv4'}{'' if i['up'] else ' down'}" for i in found) + ")"
        out.error(why, "give the node its address on the fabric's subnet (the cable's interface up, its address in "
                       "network.fabric_cidr), or set network.fabric_cidr to the subnet the nodes share (P24)")
    raise typer.Exit(int(Exit.OK if chosen else Exit.CHECK_FAILED))
