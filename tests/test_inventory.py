"""More than one machine: three simulated hosts run through a real Ansible inventory, one failing
at topology; the other two finish; the table and the JSON say exactly that."""

from pathlib import Path

import pytest

from p2pkit.stages import names

pytestmark = pytest.mark.slow


def test_three_hosts_one_failing_at_topology(cli, sim, tmp_path):
    roots = {"box-a": sim("healthy", "a"), "box-b": sim("healthy", "b"),
             "box-c": sim("p2p-chipset-not-supported", "c")}
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(
        f"    {h}: {{ansible_connection: local, p2pkit_root: {r}}}\n" for h, r in roots.items())
        # a per-host override from host vars: box-b's engine gets a shorter context than the profile's
        .replace(f"p2pkit_root: {roots['box-b']}}}", f"p2pkit_root: {roots['box-b']}, "
                 "p2pkit_set: {serve.flags.max-context: 4096}}"))
    r = cli("--json", "up", "--inventory", str(inv), "--reboot")
    assert r.code == 1, r.err
    doc = r.json()
    hosts = doc["hosts"]
    for h in ("box-a", "box-b"):
        assert hosts[h]["exit_code"] == 0 and all(hosts[h]["stages"][s] == "done" for s in names()), hosts[h]
    c = hosts["box-c"]
    assert c["exit_code"] == 1 and c["stages"]["topology"] == "failed" and c["stages"]["rebar"] == "done"
    assert all(c["stages"][s] == "not run" for s in ("link", "engine", "model", "service"))
    assert "topology failed: topology.p2p_read" in c["message"]
    units = {h: (roots[h] / "etc/systemd/system/p2pkit-engine.service").read_text() for h in ("box-a", "box-b")}
    assert "--max-context 4096" in units["box-b"] and "--max-context 4096" not in units["box-a"]
    for root in roots.values():  # each host keeps its own artifacts
        assert (root / "var/lib/p2pkit/preflight.json").is_file()
    assert not (roots["box-c"] / "var/lib/p2pkit/link.json").exists()
    r = cli("--json", "status", "--inventory", str(inv))
    assert r.code == 1
    st = r.json()["hosts"]
    assert st["box-a"]["exit_code"] == 0 and st["box-c"]["stages"]["topology"] == "failed"
    # the lab's CI: verify every host, one JUnit file with a suite per host and stage
    junit = tmp_path / "lab.xml"
    r = cli("--json", "verify", "--inventory", str(inv), "--junit", str(junit))
    assert r.code == 1
    v = r.json()["hosts"]
    assert v["box-a"]["exit_code"] == 0 and set(v["box-a"]["stages"].values()) <= {"pass", "warn"}, v["box-a"]
    assert v["box-c"]["stages"]["topology"] == "fail" and v["box-c"]["message"].startswith("topology failed:")
    import xml.etree.ElementTree as ET

    suites = {s.get("name"): s for s in ET.parse(junit).getroot()}
    assert int(suites["box-a/service"].get("failures")) == 0 and int(suites["box-b/link"].get("failures")) == 0
    fails = {c["id"] for x in v["box-c"]["results"] for c in x["checks"] if c["status"] == "fail"}
    got = {case.get("name") for name, s in suites.items() if name.startswith("box-c/") for case in s
           if case.find("failure") is not None}
    assert got == fails and "topology.p2p_read" in got


def test_unreadable_inventory(cli, tmp_path):
    bad = tmp_path / "nothing.yml"
    bad.write_text("all:\n  hosts: {}\n")
    r = cli("up", "--inventory", str(bad))
    assert r.code == 2 and "names no host" in r.err


def test_remote_hosts_get_the_controllers_p2pkit(cli, sim, tmp_path):
    """A host that is not reached locally gets p2pkit in its own virtual environment, from the
    controller's wheel, at the controller's version; p2pkit_install forces that path here."""
    import subprocess
    import sys

    from p2pkit import __version__

    root = sim("healthy", "remote")
    dist = tmp_path / "dist"
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(repo)], check=True)
    wheel = next(dist.glob("p2pkit-*.whl"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    remote: {{ansible_connection: local, p2pkit_root: {root}, "
                   "p2pkit_install: true}\n    broken: {ansible_connection: local, p2pkit_root: "
                   f"{tmp_path / 'elsewhere'}, p2pkit_install: true, p2pkit_host_python: /nonexistent/python3}}\n")
    r = cli("--json", "status", "--inventory", str(inv), "--wheel", str(wheel))
    hosts = r.json()["hosts"]
    venv = root / "opt/p2pkit/venv/bin/p2pkit"
    assert venv.is_file()
    out = subprocess.run([str(venv), "--version"], capture_output=True, text=True).stdout.strip()
    assert out == f"p2pkit {__version__}"
    assert hosts["remote"]["simulated"] is True and hosts["remote"]["stages"]["preflight"] == "not run"
    assert hosts["broken"]["exit_code"] is None
    assert hosts["broken"]["error"].startswith("p2pkit could not be installed on the host")
    assert r.code == 1
    r = cli("status", "--inventory", str(inv), "--wheel", str(tmp_path / "nope.whl"))
    assert r.code == 2 and "no wheel at" in r.err


def test_unreachable_host_is_named_with_ansibles_reason(cli, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gone: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_user: nobody}\n")
    r = cli("--json", "status", "--inventory", str(inv))
    assert r.code == 1
    gone = r.json()["hosts"]["gone"]
    assert gone["exit_code"] is None and gone["error"].startswith("unreachable: "), gone
