"""`p2pkit net hca`: the RoCE HCAs for NCCL, resolved from sysfs now (P24)."""

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
