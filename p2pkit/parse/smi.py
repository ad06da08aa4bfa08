"""nvidia-smi text: `topo -m` and `topo -p2p r|w` (`-q`: parse/smi_q.py)."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TOPO_CODES = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+)$")
# `nvidia-smi topo -m`'s own legend, word for word (e.g. NVIDIA/go-gpuallocator#17, noonghunna/club-3090#1229)
TOPO_LEGEND = {
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
    "NV#": "Connection traversing a bonded set of # NVLinks",
}


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def topo_matrix(text: str) -> dict[str, dict[str, str]]:
    """A GPU-by-GPU matrix from `topo -m` or `topo -p2p X`: {'GPU0': {'GPU1': 'OK', ...}}.

    The header carries ANSI underline codes even when piped; rows start with a space; columns are
    tab-separated. Columns after the GPUs (CPU Affinity ...) are dropped.
    """
    lines = [strip_ansi(line).rstrip("\n") for line in text.splitlines()]
    header_i = next((i for i, line in enumerate(lines) if re.search(r"\tGPU\d+", line)), None)
    if header_i is None and "\t" not in text and any(SPACED_HEADER.match(line) for line in lines):
        return topo_matrix(_tabs_from_spaces(lines))  # copied from a terminal or a web page: tabs became spaces
    if header_i is None:
        raise ValueError("no GPU header row in nvidia-smi topo output")
    header = [c.strip() for c in lines[header_i].split("\t")]
    gpu_cols = [(i, c) for i, c in enumerate(header) if re.fullmatch(r"GPU\d+", c)]
    matrix: dict[str, dict[str, str]] = {}
    for line in lines[header_i + 1:]:
        if not line.strip() or line.strip().startswith("Legend"):
            break
        cells = [c.strip() for c in line.split("\t")]
        # rows start with a space in the p2p form (" GPU0\tX\t") but not always in -m ("GPU0\t X \t")
        while cells and cells[0] == "":
            cells.pop(0)
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = cells[0]
        offset = 1 - gpu_cols[0][0]
        matrix[row] = {}
        for i, col in gpu_cols:
            j = i + offset
            value = cells[j] if j < len(cells) else ""
            if not value:
                raise ValueError(f"row {row} has no value for {col}")
            matrix[row][col] = value
    if not matrix:
        raise ValueError("no GPU rows in nvidia-smi topo output")
    return matrix


SPACED_HEADER = re.compile(r"^\s+GPU\d+(\s+(GPU|NIC)\d+)+(\s{2}|\s*$)")


def _tabs_from_spaces(lines: list[str]) -> str:
    """Space-aligned `topo` output back to nvidia-smi's tab form: the header's columns (two or more
    spaces apart, "CPU Affinity" kept whole) and each row's cells (the self cell " X " is one cell)."""
    out = []
    for line in lines:
        if SPACED_HEADER.match(line):  # the header row: multi-word column names
            cols = re.split(r"\s{2,}", line.strip())
            cols = [c for col in cols for c in (col.split() if re.fullmatch(r"((GPU|NIC)\d+ ?)+", col) else [col])]
            out.append("\t" + "\t".join(cols))
        elif re.match(r"^\s*(GPU|NIC)\d+\s", line):
            out.append("\t".join(line.split()))
        else:
            out.append(line)
    return "\n".join(out)


def pair_relation(text: str, a: int = 0, b: int = 1) -> str:
    """The relation of GPU a and GPU b in `nvidia-smi topo -m`: SYS, NODE, PHB, PXB, PIX or NV<n>.
    Both directions must agree; anything else (a `-p2p` status, a missing GPU) is a ValueError."""
    m = topo_matrix(text)
    ga, gb = f"GPU{a}", f"GPU{b}"
    if ga not in m or gb not in m or gb not in m[ga] or ga not in m[gb]:
        raise ValueError(f"`nvidia-smi topo -m` has no {ga}/{gb} pair (GPUs: {', '.join(sorted(m)) or 'none'})")
    there, back = m[ga][gb], m[gb][ga]
    if there != back or not TOPO_CODES.match(there) or there == "X":
        raise ValueError(f"not a topology relation between {ga} and {gb}: {there!r} / {back!r}")
    return there


def relation_meaning(code: str) -> str:
    """nvidia-smi's legend text for a relation code (NV4 -> the NV# line with 4)."""
    if code.startswith("NV") and code[2:].isdigit():
        return TOPO_LEGEND["NV#"].replace("#", code[2:])
    return TOPO_LEGEND.get(code, f"unknown relation {code}")


def relation_has_switch(code: str) -> bool:
    """PIX and PXB: the pair meets below the host bridge, through PCIe bridges (a switch)."""
    return code in ("PIX", "PXB")
