"""Reports for CI and monitoring: JUnit XML (one test case per check) and the node_exporter
textfile format through prometheus_client (figures a lab's Prometheus can watch for drift). Both
written atomically."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET
from pathlib import Path

from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import UsageError
from p2pkit.rules.findings import ERROR


def junit(results: list[dict], simulated: bool, timestamp: str | None = None) -> bytes:
    """`verify` results -> JUnit XML as Jenkins' junit-10.xsd has it (tests/fixtures/junit): a suite
    per stage, a case per check; fail -> <failure>, could-not-run -> <error>, skip -> <skipped>; the
    message carries measured, expected and the fix. Totals on <testsuites> and every <testsuite>; a
    suite's time is its stage's proof (facts gathered, checks judged), a case's time 0 (its check
    only judges the facts its suite gathered); a check's typed figure (number, unit, bound) is a
    suite property named after the check (the schema has no properties inside a testcase)."""
    timestamp = timestamp or dt.datetime.now(dt.UTC).replace(microsecond=0, tzinfo=None).isoformat()
    total = {"tests": 0, "failures": 0, "errors": 0, "time": 0.0}
    suites = ET.Element("testsuites", name="p2pkit verify" + (" (SIMULATED)" if simulated else ""))
    for r in results:
        checks = r["checks"]
        counts = {"tests": len(checks), "failures": sum(c["status"] == "fail" for c in checks),
                  "errors": sum(c["status"] == ERROR for c in checks)}
        seconds = float(r.get("seconds") or 0.0)
        s = ET.SubElement(suites, "testsuite", name=r["stage"], **{k: str(v) for k, v in counts.items()},
                          skipped=str(sum(c["status"] == "skip" for c in checks)), time=junit_time(seconds),
                          timestamp=timestamp)
        for k, v in counts.items():
            total[k] += v
        total["time"] += seconds
        figures = [c for c in checks if c.get("value") is not None]
        if figures:
            props = ET.SubElement(s, "properties")
            for c in figures:
                for k in ("value", "unit", "op", "limit"):
                    ET.SubElement(props, "property", name=f"{c['id']}.{k}", value=str(c.get(k)))
        for c in checks:
            case = ET.SubElement(s, "testcase", classname=f"p2pkit.{r['stage']}", name=c["id"], time="0")
            msg = (f"[{c['pitfall']}] " if c.get("pitfall") else "") + \
                f"measured {c['measured']}; expected {c['expected']}"
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
    suites.set("tests", str(total["tests"]))
    suites.set("failures", str(total["failures"]))
    suites.set("errors", str(total["errors"]))
    suites.set("time", junit_time(total["time"]))
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def junit_time(seconds: float) -> str:
    """Seconds as junit-10.xsd's SUREFIRE_TIME takes them: digits, at most three decimals."""
    return f"{max(seconds, 0.0):.3f}"


STAGE_STATE = {"pass": 1, "warn": 1, "fail": 0}
GB = 1e9


def prometheus(results: list[dict], facts: dict, simulated: bool, profile: str):
    """The figures a lab's Prometheus watches, as a prometheus_client registry: one family per metric
    (one HELP and TYPE however many GPUs, pairs or checks), labelled, in base units (bytes per
    second, seconds), from the typed values (facts, each check's `value`), never from display text."""
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry(auto_describe=True)
    base = {"simulated": "true" if simulated else "false", "profile": profile}

    def family(name: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        if not samples:
            return
        g = Gauge(name, help_, [*base, *samples[0][0]], registry=reg)
        for labels, value in samples:
            g.labels(**base, **{k: str(v) for k, v in labels.items()}).set(value)

    _check_families(family, results)
    _nvml_families(family, facts)
    _load_families(family, facts)
    return reg


def _check_families(family, results: list[dict]) -> None:
    """Each stage's result, each failed check, each bandwidth ratio."""
    family("p2pkit_stage_ok", "1 when every check of the stage passed (warnings allowed), 0 otherwise",
           [({"stage": r["stage"]}, STAGE_STATE.get(r["status"], 0)) for r in results])
    family("p2pkit_stage_could_not_run", "1 for a stage whose proof could not run here (a tool or extra missing)",
           [({"stage": r["stage"]}, 1) for r in results if r["status"] == ERROR])
    family("p2pkit_check_failed", "1 for each failed check (pitfall: its PITFALLS id, empty when none applies)",
           [({"stage": r["stage"], "check": c["id"], "pitfall": c.get("pitfall") or ""}, 1) for r in results
            for c in r["checks"] if c["status"] == "fail"])
    family("p2pkit_bandwidth_ratio", "measured bandwidth over the link's raw ceiling",
           [({"check": c["id"]}, c["value"]) for r in results for c in r["checks"]
            if isinstance(c.get("value"), int | float) and c["id"].startswith(("link.p2p_bw", "link.h2d", "link.d2h"))])


def _nvml_families(family, facts: dict) -> None:
    """The loaded driver and each GPU's BAR1, from NVML."""
    nvml = facts.get("nvml") if isinstance(facts.get("nvml"), dict) else {}
    if nvml.get("driver_version"):
        family("p2pkit_driver_info", "the loaded NVIDIA driver", [({"version": nvml["driver_version"]}, 1)])
    family("p2pkit_bar1_bytes", "BAR1 size from NVML",
           [({"gpu": g["index"]}, g["bar1_total"]) for g in nvml.get("gpus") or [] if isinstance(g.get("bar1_total"),
                                                                                              int)])


def _load_families(family, facts: dict) -> None:
    """What the link stage's load measured: the links under load, the copies' bandwidth, P2P latency."""
    load = facts.get("link_load") if isinstance(facts.get("link_load"), dict) else {}
    gpus, pairs = load.get("gpus", []), load.get("pairs", [])
    family("p2pkit_link_gen_under_load", "PCIe generation reached under load",
           [({"gpu": g["index"]}, g["max_seen"]["gen"]) for g in gpus])
    family("p2pkit_link_width_under_load", "PCIe lanes reached under load",
           [({"gpu": g["index"]}, g["max_seen"]["width"]) for g in gpus])
    for key, what in (("h2d", "host-to-device"), ("d2h", "device-to-host")):
        family(f"p2pkit_{key}_bytes_per_second", f"pinned {what} copy bandwidth",
               [({"gpu": g["index"]}, g["host"][f"{key}_gbps"] * GB) for g in gpus if f"{key}_gbps" in g["host"]])
    family("p2pkit_p2p_bytes_per_second", "P2P copy bandwidth, one way",
           [({"src": x["from"], "dst": x["to"]}, x["unidir_gbps"] * GB) for x in pairs])
    family("p2pkit_p2p_latency_seconds", "P2P small-copy latency",
           [({"src": x["from"], "dst": x["to"]}, x["latency_us"] / 1e6) for x in pairs])


def write_prometheus(path: Path, registry) -> None:
    """The node_exporter textfile: written atomically by prometheus_client's own textfile helper
    (a temporary file beside it, renamed over it), into a directory that must exist."""
    from prometheus_client import write_to_textfile

    path = textfile_path(path)
    try:
        write_to_textfile(str(path), registry)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}",
                         hint=f"check that {path.parent} is writable and its disk is not full") from e


def textfile_path(path: Path) -> Path:
    """Where the textfile goes, refused before any work when node_exporter could never read it."""
    path = Path(path).resolve()
    if not path.parent.is_dir():
        raise UsageError(f"the textfile directory {path.parent} does not exist",
                         hint=f"create it (`mkdir -p {path.parent}`) or point --prometheus at node_exporter's "
                              "--collector.textfile.directory")
    if path.suffix != ".prom":
        raise UsageError(f"{path} does not end in .prom: node_exporter's textfile collector reads only *.prom files",
                         hint=f"name it {path.with_suffix('.prom').name}")
    return path


def write(path: Path, data: bytes | str) -> None:
    atomic_write(Path(path).resolve(), data.encode() if isinstance(data, str) else data)
