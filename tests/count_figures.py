"""How many findings carry their number typed (value, unit, op, limit) and how many still carry it only
in their text: every stage's checks (doctor's, the field checks included) over the facts of every
simulated scenario. Run: `P2PKIT_FAST=1 .venv/bin/python tests/count_figures.py [--list]`; the test
(tests/test_figures_typed.py) holds the untyped ones at zero.

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


def has_number(text: str) -> bool:
    return bool(NUMBER.search(str(text)))


def findings(scenario: str, base: Path) -> list[dict]:
    from conftest import make_sim

    from p2pkit import config, doctor, facts
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
    """{"findings", "typed", "untyped": [(scenario, id, measured)]}: typed has its value set; untyped has a
    number in its measured text and no value."""
    out: dict = {"findings": 0, "typed": 0, "untyped": []}
    with tempfile.TemporaryDirectory() as d:
        for s in scenarios:
            for c in findings(s, Path(d)):
                out["findings"] += 1
                if c["value"] is not None:
                    out["typed"] += 1
                elif has_number(c["measured"]):
                    out["untyped"].append((s, c["id"], str(c["measured"])))
    return out


def main() -> None:
    from p2pkit.sim import scenarios

    n = count(list(scenarios.SCENARIOS))
    ids = {i for _, i, _ in n["untyped"]}
    typed_ids = n["typed"]
    print(f"{n['findings']} findings over {len(scenarios.SCENARIOS)} scenarios: {typed_ids} typed (value set), "
          f"{len(n['untyped'])} with a number only in their text ({len(ids)} check ids)")
    if "--list" in sys.argv:
        seen = set()
        for s, i, m in n["untyped"]:
            if i not in seen:
                seen.add(i)
                print(f"  {i}: {m}  [{s}]")


if __name__ == "__main__":
    main()
