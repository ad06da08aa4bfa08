"""Issue 29, item 1: every empty pin named in preflight, before anything changes; `up --pin`
resolves them from the profile's own sources and writes them into the host's profile."""

import json
import tomllib

from test_pin import blank_profile

from p2pkit.core import config
from p2pkit.stages.preflight import checks as preflight


def test_the_builtin_profiles_pins_are_named_up_front():
    p = config.load("dual-5090-ninfer")
    assert preflight.missing_pins(p) == ["driver.installer_sha256", "p2p_module.commit", "engine.commit"]
    c = preflight._pins(p)
    assert c.status == "fail"
    for key in ("driver.installer_sha256", "p2p_module.commit", "engine.commit"):
        assert key in c.measured
    assert "p2pkit up --pin" in c.hint and "p2pkit pin --installer" in c.hint and "--fork-remote" in c.hint
    # llama.cpp's source archive is pinned in the profile; its engine needs no commit
    assert preflight.missing_pins(config.load("dual-5090-llamacpp")) == ["driver.installer_sha256",
                                                                         "p2p_module.commit"]


def test_preflight_names_every_empty_pin_and_up_stops_before_the_driver_acts(cli, sim, tmp_path):
    root = sim("healthy")
    mine, _ = blank_profile(root, tmp_path)
    r = cli("--root", str(root), "--profile", str(mine), "--json", "up")
    assert r.code == 1, r.err
    doc = r.json()
    stages = {s["stage"]: s for s in doc["stages"]}
    assert stages["preflight"]["state"] == "failed"
    # a first run that stops at preflight records nothing on the host (issue 47 item 11): its findings are shown
    assert not (root / "var/lib/p2pkit").exists()
    pins = next(c for c in stages["preflight"]["checks"] if c["id"] == "preflight.pins")
    assert pins["status"] == "fail"
    assert all(k in pins["measured"] for k in ("driver.installer_sha256", "p2p_module.commit", "engine.commit"))
    assert f"p2pkit --root {root} up --pin" in pins["hint"]  # as printed: for this host
    assert doc["ran"] == ["preflight"] and not (root / "var/lib/p2pkit/driver.json").exists()
    assert not (root / "usr/bin/nvidia-smi-615.71.09").exists()


def test_up_pin_resolves_shows_and_writes_each_pin_with_where_it_came_from(cli, sim, tmp_path):
    root = sim("healthy")
    mine, pinned = blank_profile(root, tmp_path)
    r = cli("--root", str(root), "--profile", str(mine), "up", "--pin", "--to", "driver")
    assert r.code == 0, r.err
    got = tomllib.loads(mine.read_text())
    assert got["driver"]["installer_sha256"] == pinned["driver"]["installer_sha256"]
    assert got["p2p_module"]["commit"] == pinned["p2p_module"]["commit"]
    assert got["engine"]["commit"] == pinned["engine"]["commit"]
    for key, value in (("driver.installer_sha256", pinned["driver"]["installer_sha256"]),
                       ("p2p_module.commit", pinned["p2p_module"]["commit"])):
        assert f"pinned {key} = {value}" in r.err
    lines = mine.read_text().splitlines()
    sha_line = next(ln for ln in lines if ln.startswith("installer_sha256 ="))
    assert "# pinned by `p2pkit up --pin`" in sha_line and "archive check" in sha_line
    assert "git ls-remote" in next(ln for ln in lines if ln.startswith("commit =") and "p2pkit up --pin" in ln)
    assert json.loads((root / "var/lib/p2pkit/profile.json").read_text())["source"] == str(mine.resolve())
    assert json.loads((root / "var/lib/p2pkit/driver.json").read_text())["status"] == "passed"
    # a second `up --pin` finds nothing empty and writes nothing
    before = mine.read_text()
    assert cli("--root", str(root), "--profile", str(mine), "up", "--pin", "--to", "driver").code == 0
    assert mine.read_text() == before


def test_up_pin_on_a_builtin_profile_writes_the_hosts_own_copy(cli, sim, tmp_path):
    root = sim("healthy")
    mine, pinned = blank_profile(root, tmp_path)
    # the fork resolved from the simulated remote; the installer is the simulated one. A built-in other than
    # the one the host was laid out with (that name means the host's own pinned copy there: Host.own_profile)
    r = cli("--root", str(root), "--profile", "dual-5090-llamacpp",
            "--set", f"driver.installer_url={tomllib.loads(mine.read_text())['driver']['installer_url']}",
            "--set", f"p2p_module.repo={pinned['p2p_module']['repo']}",
            "--set", f"p2p_module.branch={pinned['p2p_module']['branch']}",
            "up", "--pin", "--to", "preflight")
    assert r.code == 0, r.err
    copy = root / "var/lib/p2pkit/profile.toml"
    got = tomllib.loads(copy.read_text())
    assert got["driver"]["installer_sha256"] == pinned["driver"]["installer_sha256"]
    assert got["p2p_module"]["commit"] == pinned["p2p_module"]["commit"]
    assert json.loads((root / "var/lib/p2pkit/profile.json").read_text())["source"] == str(copy)
