"""nvidia-smi, run through the runner and parsed; failures become {"error": ...}."""

from __future__ import annotations

from p2pkit.core.errors import P2pkitError
from p2pkit.host import Host
from p2pkit.parse import smi as psmi


def _run(host: Host, args: list[str]) -> str | dict:
    try:
        return host.runner.run(["nvidia-smi", *args], timeout=60).stdout
    except P2pkitError as e:
        return {"error": e.message.splitlines()[0]}


def topo_p2p(host: Host, mode: str) -> dict:
    """mode: r (read) or w (write)."""
    text = _run(host, ["topo", "-p2p", mode])
    if isinstance(text, dict):
        return text
    try:
        return {"matrix": psmi.topo_matrix(text)}
    except ValueError as e:
        return {"error": f"unexpected `nvidia-smi topo -p2p {mode}` output: {e}"}


def topo_m(host: Host) -> dict:
    """The matrix, and the relation of GPU0 and GPU1 ("pair": PHB, NODE, SYS, PXB, PIX, NV#) where
    there are two."""
    text = _run(host, ["topo", "-m"])
    if isinstance(text, dict):
        return text
    try:
        out: dict = {"matrix": psmi.topo_matrix(text)}
    except ValueError as e:
        return {"error": f"unexpected `nvidia-smi topo -m` output: {e}"}
    if len(out["matrix"]) >= 2:
        try:
            out["pair"] = psmi.pair_relation(text, 0, 1)
        except ValueError as e:
            out["pair_error"] = str(e)
    return out
