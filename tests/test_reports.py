"""`verify --junit` and `--prometheus`: the files parse, and count what failed."""

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from p2pkit.sim import lifecycle
from p2pkit.stages.link.checks import ceiling_gbps

NODE_EXPORTER = "prometheus-node-exporter"  # Debian's package of node_exporter 1.5.0 (.ci/run installs it)


@contextlib.contextmanager
def node_exporter(textfile_dir):
    """The real node_exporter on a free loopback port, only its textfile collector, reading textfile_dir.
    Yields a function that scrapes /metrics; stderr (its log, where it names a rejected file) is kept."""
    exe = shutil.which(NODE_EXPORTER)
    assert exe, "install Debian's prometheus-node-exporter (.ci/run does)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = textfile_dir.parent / "node_exporter.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([exe, "--collector.disable-defaults", "--collector.textfile",
                                 f"--collector.textfile.directory={textfile_dir}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=err, stderr=err)
    try:
        def scrape() -> str:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        return r.read().decode()
                except OSError:
                    assert proc.poll() is None, f"node_exporter exited: {log.read_text()}"
                    assert time.monotonic() < deadline, f"node_exporter did not answer: {log.read_text()}"
                    time.sleep(0.2)
        scrape.log = log
        yield scrape
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def accepted_by_node_exporter(textfile_dir) -> dict:
    """Scrape node_exporter over textfile_dir: the families it serves; node_exporter's own words about
    the file when it rejected it (node_textfile_scrape_error 1)."""
    with node_exporter(textfile_dir) as scrape:
        text = scrape()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        err = next(s.value for s in fams["node_textfile_scrape_error"].samples)
        said = [ln for ln in scrape.log.read_text().splitlines() if "textfile" in ln.lower()]
        assert err == 0, "node_exporter rejected the file: " + " / ".join(said)
    return fams


def test_a_textfile_directory_that_does_not_exist_is_named(cli, tmp_path):
    r = cli("verify", "--prometheus", str(tmp_path / "nowhere/p2pkit.prom"))
    assert r.code == 2 and f"the textfile directory {tmp_path / 'nowhere'} does not exist" in r.err
    assert "Traceback" not in r.err
    r = cli("verify", "--prometheus", str(tmp_path / "p2pkit.txt"))
    assert r.code == 2 and "reads only *.prom files" in r.err


def test_node_exporter_rejects_the_old_hand_written_form(tmp_path):
    """The check itself: a second TYPE line for one family (what p2pkit wrote per GPU before) is
    rejected whole by the real node_exporter, and the helper above says so in node_exporter's words."""
    d = tmp_path / "textfile"
    d.mkdir()
    (d / "p2pkit.prom").write_text("".join(f'# HELP p2pkit_bar1_bytes BAR1\n# TYPE p2pkit_bar1_bytes gauge\n'
                                           f'p2pkit_bar1_bytes{{gpu="{i}"}} 1\n' for i in (0, 1)))
    with pytest.raises(AssertionError, match=r"rejected the file: .*second HELP line for metric name .*p2pkit_bar1"):
        accepted_by_node_exporter(d)


def bring_to_topology(cli, root):
    r = cli("--root", str(root), "up", "--to", "p2p-module")
    if r.code == 4:
        lifecycle.reboot(root)
    return cli("--root", str(root), "up", "--to", "topology")


@pytest.mark.slow
def test_junit_and_prometheus_from_a_failing_host(cli, sim, tmp_path):
    root = sim("p2p-chipset-not-supported")
    r = bring_to_topology(cli, root)
    assert r.code == 1
    junit, prom = tmp_path / "verify.xml", tmp_path / "p2pkit.prom"
    r = cli("--root", str(root), "--json", "verify", "--junit", str(junit), "--prometheus", str(prom))
    assert r.code == 1
    doc = r.json()
    tree = ET.parse(junit).getroot()
    failed = {(s.get("name"), c.get("name")) for s in tree.iter("testsuite") for c in s.iter("testcase")
              if c.find("failure") is not None}
    expected = {(st["stage"], c["id"]) for st in doc["stages"] for c in st["checks"] if c["status"] == "fail"}
    assert failed == expected and ("topology", "topology.p2p_read") in failed
    total = sum(int(s.get("failures")) for s in tree.iter("testsuite"))
    assert total == len(expected)
    msg = next(c.find("failure") for s in tree.iter("testsuite") for c in s.iter("testcase")
               if c.get("name") == "topology.p2p_read")
    assert "measured GPU0->GPU1 CNS" in msg.get("message") and "chipset not supported" in msg.text
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    ok = {s.labels["stage"]: s.value for s in families["p2pkit_stage_ok"].samples}
    assert ok["topology"] == 0 and ok["rebar"] == 1 and ok["preflight"] == 1
    fails = {s.labels["check"] for s in families["p2pkit_check_failed"].samples}
    assert "topology.p2p_read" in fails
    assert {s.labels["version"] for s in families["p2pkit_driver_info"].samples} == {"615.71.09"}
    assert all(s.labels["simulated"] == "true" for f in families.values() for s in f.samples)


@pytest.mark.slow
def test_prometheus_carries_link_figures(cli, sim, tmp_path):
    """A two-GPU simulated host's figures, served by the real node_exporter (textfile collector)."""
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot", "--to", "link").code == 0
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    prom = textfile / "p2pkit.prom"
    r = cli("--root", str(root), "verify", "link", "--prometheus", str(prom))
    assert r.code == 0
    fams = accepted_by_node_exporter(textfile)
    assert {s.labels["gpu"]: s.value for s in fams["p2pkit_link_gen_under_load"].samples} == {"0": 5, "1": 5}
    assert [s.value for s in fams["p2pkit_p2p_bytes_per_second"].samples] == pytest.approx([28.5e9, 28.5e9])
    assert {(s.labels["src"], s.labels["dst"]) for s in fams["p2pkit_p2p_latency_seconds"].samples} == \
        {("0", "1"), ("1", "0")}
    ratios = {s.labels["check"]: s.value for s in fams["p2pkit_bandwidth_ratio"].samples}
    assert ratios["link.p2p_bw.gpu0-gpu1"] == round(28.5 / ceiling_gbps(5, 8), 4)  # the number, not its text
    assert all(s.labels["simulated"] == "true" for n, f in fams.items() if n.startswith("p2pkit_") for s in f.samples)


JUNIT_XSD = Path(__file__).parent / "fixtures/junit/junit-10.xsd"


def junit_problems(path) -> list[str]:
    """What Jenkins' junit-10.xsd (xunit-plugin's own file, tests/fixtures/junit) says of a JUnit
    file, through a real XSD validator (lxml's libxml2); empty when it is valid."""
    from lxml import etree

    schema = etree.XMLSchema(etree.parse(str(JUNIT_XSD)))
    if schema.validate(etree.parse(str(path))):
        return []
    return [f"line {e.line}: {e.message}" for e in schema.error_log]


def test_the_validator_refuses_what_p2pkit_wrote_before(tmp_path):
    """The check itself: properties inside a testcase and a suite without failures/errors (p2pkit's
    JUnit before) are refused by junit-10.xsd."""
    old = tmp_path / "old.xml"
    old.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="p2pkit verify">'
                   '<testsuite name="link" tests="1"><testcase classname="p2pkit.link" name="link.x">'
                   '<properties><property name="value" value="1"/></properties></testcase></testsuite>'
                   '</testsuites>')
    problems = junit_problems(old)
    assert any("properties" in p for p in problems) and any("failures" in p for p in problems), problems


def test_junit_is_valid_against_jenkins_junit_10_xsd_with_times_and_totals(cli, sim, tmp_path):
    """Every stage of a fresh simulated host (failures, skips, a proof that cannot run, figures):
    the file passes junit-10.xsd, carries a time on every suite and case, and its totals are the
    sums of its suites."""
    root = sim("healthy")
    junit = tmp_path / "verify.xml"
    r = cli("--root", str(root), "--json", "verify", "--junit", str(junit))
    assert r.code in (1, 6), r.err
    assert junit_problems(junit) == []
    tree = ET.parse(junit).getroot()
    suites = list(tree.iter("testsuite"))
    doc = r.json()
    assert [s.get("name") for s in suites] == [st["stage"] for st in doc["stages"]]
    for key in ("tests", "failures", "errors"):
        assert int(tree.get(key)) == sum(int(s.get(key)) for s in suites) > (0 if key != "errors" else -1)
    assert int(tree.get("tests")) == sum(len(st["checks"]) for st in doc["stages"])
    assert float(tree.get("time")) == pytest.approx(sum(float(s.get("time")) for s in suites), abs=0.01)
    assert all(s.get("time") and s.get("timestamp") for s in suites)
    assert all(c.get("time") is not None for c in tree.iter("testcase"))
    assert all(st["seconds"] >= 0 for st in doc["stages"])
