"""More than one machine: three simulated hosts run through a real Ansible inventory, one failing
at topology; the other two finish; the table and the JSON say exactly that."""

import pytest

from p2pkit.stages import names

pytestmark = pytest.mark.slow


def test_three_hosts_one_failing_at_topology(cli, sim, tmp_path):
    roots = {"box-a": sim("healthy", "a"), "box-b": sim("healthy", "b"),
             "box-c": sim("p2p-chipset-not-supported", "c")}
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(
        f"    {h}: {{ansible_connection: local, p2pkit_root: {r}}}\n" for h, r in roots.items()))
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
    for root in roots.values():  # each host keeps its own artifacts
        assert (root / "var/lib/p2pkit/preflight.json").is_file()
    assert not (roots["box-c"] / "var/lib/p2pkit/link.json").exists()
    r = cli("--json", "status", "--inventory", str(inv))
    assert r.code == 1
    st = r.json()["hosts"]
    assert st["box-a"]["exit_code"] == 0 and st["box-c"]["stages"]["topology"] == "failed"


def test_unreadable_inventory(cli, tmp_path):
    bad = tmp_path / "nothing.yml"
    bad.write_text("all:\n  hosts: {}\n")
    r = cli("up", "--inventory", str(bad))
    assert r.code == 2 and "names no host" in r.err
