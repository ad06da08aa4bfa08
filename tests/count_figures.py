"""How many findings carry their number typed (value, unit, op, limit) and how many still carry it only
in their text: every stage's checks (doctor's, the field checks included) over the facts of every
simulated scenario. Run: `P2PKIT_FAST=1 .venv/bin/python tests/count_figures.py [--list]`; the test
(tests/test_figures_typed.py) holds the untyped ones, less those listed below with a reason, at zero.

A number in the measured text is a figure standing on its own ("31 GiB free", "2 GPUs", "x8"); a
version ("580.95.05"), a PCI address, an id or a path is not one."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# a figure standing on its own: not inside a version, an address, a name or a path ("x8" is a width)
NUMBER = re.compile(r"(?<![\w.:/-])(?:x)?\d+(?:\.\d+)?(?![\w.:/-]|\.\d)")


# findings whose measured text holds digits that are no measured quantity: names, ids, settings, codes
NOT_FIGURES = {
    "preflight.gpu_model": "a model name and its PCI device id (RTX 5090, 0x2b85)",
    "preflight.os": "a release version (24.04)",
    "preflight.iommu": "kernel options (iommu.passthrough=0)",
    "p2p.iommu": "kernel options (iommu.passthrough=0)",
    "service.devices": "GPU ids (0,1)",
    "service.vision_device": "a GPU id",
    "service.node_rank": "a node's rank, an id",
    "service.ple_mmap": "an environment setting (VLLM_PLE_MMAP=1)",
    "topology.nvml_p2p": "GPU indices (0->1)",
    "link.clocks_locked": "NVML's clock-event reasons, a bitmask",
    "field.roce.gid": "a GID table index",
    "field.static_bar1": "a registry setting (RMForceStaticBar1=1)",
    "rebar.applies": "why the stage does not apply, in words",
}
# findings with a number still only in their text, and why
KNOWN_UNTYPED = {
    "topology.capability": "two numbers held to two bounds (Gen >= min_gen and x >= min_width); a figure is one number",
}
# a finding that could not judge quotes the tool's message, digits and all
NOT_JUDGED = ("could not check", "could not determine", "not measured", "not applicable")


def has_number(text: str) -> bool:
    return bool(NUMBER.search(str(text)))


def kind(check_id: str, table: dict) -> str | None:
    """The reason `table` gives for a check id or a prefix of it (field.roce.gid.rocep1s0f0:1 is field.roce.gid)."""
    return next((why for k, why in table.items() if check_id == k or check_id.startswith(k + ".")), None)


def untyped(checks: list[dict]) -> list[dict]:
    """The findings with a number in their measured text, no value, and no reason listed above."""
    return [c for c in checks if c["value"] is None and has_number(c["measured"])
            and not str(c["measured"]).startswith(NOT_JUDGED)
            and kind(c["id"], NOT_FIGURES) is None and kind(c["id"], KNOWN_UNTYPED) is None]


def findings(scenario: str, base: Path) -> list[dict]:
    from conftest import make_sim

    from p2pkit.app import doctor
    from p2pkit.core import config
    from p2pkit.facts import collect as facts
    from p2pkit.host import Host
    from p2pkit.sim import lifecycle

    root = make_sim(base / scenario, scenario)
    try:
        h = Host.at(root)
        prof = config.load(h.sim["profile"])
        report = doctor.judge(facts.collect(h, profile=prof), prof, simulated=True)
    finally:
        lifecycle.stop_services(root)
    return [c for g in report["groups"] for c in g["checks"]]


def count(scenarios: list[str]) -> dict:
    """{"findings", "typed", "number_in_text", "untyped": [(scenario, id, measured)]}: typed has its value
    set; number_in_text has a number in its measured text and no value (whatever the number is); untyped
    is the part of those with no reason listed above."""
    out: dict = {"findings": 0, "typed": 0, "number_in_text": 0, "known_untyped": 0, "untyped": []}
    with tempfile.TemporaryDirectory() as d:
        for s in scenarios:
            checks = findings(s, Path(d))
            out["findings"] += len(checks)
            out["typed"] += sum(c["value"] is not None for c in checks)
            out["number_in_text"] += sum(c["value"] is None and has_number(c["measured"]) for c in checks)
            out["known_untyped"] += sum(c["value"] is None and kind(c["id"], KNOWN_UNTYPED) is not None for c in checks)
            out["untyped"] += [(s, c["id"], str(c["measured"])) for c in untyped(checks)]
    return out


def main() -> None:
    from p2pkit.sim import scenarios

    n = count(list(scenarios.SCENARIOS))
    print(f"{n['findings']} findings over {len(scenarios.SCENARIOS)} scenarios: {n['typed']} typed (value set), "
          f"{n['number_in_text']} with digits only in their text: {n['known_untyped']} listed as still untyped "
          f"({', '.join(KNOWN_UNTYPED)}), {len(n['untyped'])} a quantity with no reason listed "
          f"({len({i for _, i, _ in n['untyped']})} check ids)")
    if "--list" in sys.argv:
        seen = set()
        for s, i, m in n["untyped"]:
            if i not in seen:
                seen.add(i)
                print(f"  {i}: {m}  [{s}]")


if __name__ == "__main__":
    main()
