"""Reports for CI and monitoring: JUnit XML (one test case per check) and the node_exporter
textfile format (figures a lab's Prometheus can watch for drift). Both written atomically."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from p2pkit.artifacts import atomic_write
from p2pkit.checks import ERROR


def junit(results: list[dict], simulated: bool) -> bytes:
    """`verify` results -> JUnit XML: a suite per stage, a case per check; fail -> <failure>,
    skip -> <skipped>; the message carries measured, expected and the fix."""
    suites = ET.Element("testsuites", name="p2pkit verify" + (" (SIMULATED)" if simulated else ""))
    for r in results:
        checks = r["checks"]
        s = ET.SubElement(suites, "testsuite", name=r["stage"], tests=str(len(checks)),
                          failures=str(sum(c["status"] == "fail" for c in checks)),
                          errors=str(sum(c["status"] == ERROR for c in checks)),
                          skipped=str(sum(c["status"] == "skip" for c in checks)))
        for c in checks:
            case = ET.SubElement(s, "testcase", classname=f"p2pkit.{r['stage']}", name=c["id"])
            if c.get("value") is not None:  # a typed figure: its number, unit and bound, as properties
                props = ET.SubElement(case, "properties")
                for k in ("value", "unit", "op", "limit"):
                    ET.SubElement(props, "property", name=k, value=str(c.get(k)))
            msg = f"measured {c['measured']}; expected {c['expected']}"
            if c["status"] == "fail":
                f = ET.SubElement(case, "failure", message=msg)
                f.text = f"{c['title']}: {msg}\nfix: {c.get('hint') or ''}" + (
                    f"\npitfall {c['pitfall']}" if c.get("pitfall") else "")
            elif c["status"] == ERROR:  # the proof could not run here: JUnit's <error>, not a failure
                e = ET.SubElement(case, "error", message=str(c["measured"]))
                e.text = f"{c['title']}: {c['measured']}\nfix: {c.get('hint') or ''}"
            elif c["status"] == "skip":
                ET.SubElement(case, "skipped", message=str(c["measured"]))
            else:
                out = ET.SubElement(case, "system-out")
                out.text = f"{c['status']}: {msg}"
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def _labels(**kw) -> str:
    def esc(v) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kw.items()) + "}"


STAGE_STATE = {"pass": 1, "warn": 1, "fail": 0}


def prometheus(results: list[dict], facts: dict, simulated: bool, profile: str) -> str:
    """node_exporter textfile collector format: HELP, TYPE, samples."""
    lines: list[str] = []

    def metric(name: str, help_: str, samples: list[tuple[dict, float]], kind: str = "gauge") -> None:
        if not samples:
            return
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(**lbl)} {val}" for lbl, val in samples)

    sim = {"simulated": "true" if simulated else "false", "profile": profile}
    metric("p2pkit_stage_ok", "1 when every check of the stage passed (warnings allowed), 0 otherwise",
           [({**sim, "stage": r["stage"]}, STAGE_STATE.get(r["status"], 0)) for r in results])
    metric("p2pkit_stage_could_not_run", "1 for a stage whose proof could not run here (a tool or extra missing)",
           [({**sim, "stage": r["stage"]}, 1) for r in results if r["status"] == ERROR])
    metric("p2pkit_check_failed", "1 for each failed check",
           [({**sim, "stage": r["stage"], "check": c["id"]}, 1) for r in results for c in r["checks"]
            if c["status"] == "fail"])
    nvml = facts.get("nvml") or {}
    if isinstance(nvml, dict) and nvml.get("driver_version"):
        metric("p2pkit_driver_info", "the loaded NVIDIA driver", [({**sim, "version": nvml["driver_version"]}, 1)])
    for g in (nvml.get("gpus") or []) if isinstance(nvml, dict) else []:
        if isinstance(g.get("bar1_total"), int):
            metric("p2pkit_bar1_bytes", "BAR1 size from NVML", [({**sim, "gpu": g["index"]}, g["bar1_total"])])
    load = facts.get("link_load") or {}
    for g in load.get("gpus", []) if isinstance(load, dict) else []:
        lbl = {**sim, "gpu": g["index"]}
        metric("p2pkit_link_gen_under_load", "PCIe generation reached under load", [(lbl, g["max_seen"]["gen"])])
        metric("p2pkit_link_width_under_load", "PCIe width reached under load", [(lbl, g["max_seen"]["width"])])
        metric("p2pkit_h2d_gbps", "pinned host-to-device GB/s", [(lbl, round(g["host"]["h2d_gbps"], 3))])
    for x in load.get("pairs", []) if isinstance(load, dict) else []:
        lbl = {**sim, "src": x["from"], "dst": x["to"]}
        metric("p2pkit_p2p_gbps", "P2P copy GB/s, one way", [(lbl, round(x["unidir_gbps"], 3))])
        metric("p2pkit_p2p_latency_us", "P2P small-copy latency", [(lbl, round(x["latency_us"], 3))])
    for r in results:
        for c in r["checks"]:
            m = re.search(r"= ([\d.]+) of ", str(c["measured"]))
            if m and c["id"].startswith(("link.p2p_bw", "link.h2d", "link.d2h")):
                metric("p2pkit_bandwidth_ratio", "measured bandwidth over the link's raw ceiling",
                       [({**sim, "check": c["id"]}, float(m.group(1)))])
    return "\n".join(lines) + "\n"


def write(path: Path, data: bytes | str) -> None:
    atomic_write(Path(path).resolve(), data.encode() if isinstance(data, str) else data)
