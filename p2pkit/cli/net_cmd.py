"""`p2pkit net hca`: the RoCE HCAs for NCCL, resolved from sysfs now (P24)."""

from __future__ import annotations

import typer

from p2pkit.cli import common
from p2pkit.errors import Exit

app = typer.Typer(help="The network between hosts (RoCE for NCCL).", no_args_is_help=True)


@app.command()
def hca() -> None:
    """Print NCCL_IB_HCA=... for the ACTIVE Ethernet ports on the profile's fabric netdevs. An engine's
    ExecStartPre can write it to an environment file, so every start uses the names of this boot."""
    from p2pkit.host.roce import ports, resolve

    h = common.host()
    p = common.profile(h)
    found = ports(h)
    hcas = resolve(found, p.network.fabric_netdevs)
    out = common.output()
    out.simulated = h.simulated
    if common.OPTS.json:
        out.document({"hcas": hcas, "ports": found, "fabric_netdevs": p.network.fabric_netdevs})
    elif hcas:
        print(f"NCCL_IB_HCA={','.join(hcas)}")
    else:
        out.error("no ACTIVE Ethernet RDMA port on " + (", ".join(p.network.fabric_netdevs) or "any netdev"),
                  "bring the fabric port up and check network.fabric_netdevs in the profile (P24)")
    raise typer.Exit(int(Exit.OK if hcas else Exit.CHECK_FAILED))
