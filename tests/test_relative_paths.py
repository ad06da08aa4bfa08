"""A relative path in a profile resolves against the state directory, never against the directory
p2pkit was started from (a relative request-log path once left a stray requests.jsonl in playbooks/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from p2pkit.core import config


def test_relative_keys_are_anchored_under_the_state_directory():
    p = config.load("dual-5090-ninfer", ["p2p_module.signing_key=keys/mok.key",
                                          "engine.pkg_config_path=/opt/ff/lib/pkgconfig:local/pc",
                                          "model.draft_source=drafts/d1"])
    a = config.anchored(p, "/srv/state")
    assert a.p2p_module.signing_key == "/srv/state/keys/mok.key"
    assert a.engine.pkg_config_path == "/opt/ff/lib/pkgconfig:/srv/state/local/pc"  # absolute parts kept
    assert a.model.draft_source == "/srv/state/drafts/d1"
    # a file the engine writes: in the engine's own directory under the state directory
    assert p.serve.flags["request-log-jsonl"] == "requests.jsonl"
    assert a.serve.flags["request-log-jsonl"] == "/srv/state/engine/requests.jsonl"
    assert a.serve.flags["tp"] == p.serve.flags["tp"]  # other flags as they were


def test_absolute_values_are_left_alone():
    p = config.load("dual-5090-ninfer", ["p2p_module.signing_key=/root/mok.key",
                                          "serve.flags.request-log-jsonl=/var/log/ninfer.jsonl"])
    a = config.anchored(p, "/srv/state")
    assert a == p


def test_the_cli_resolves_them_against_the_hosts_state_directory_not_the_working_directory(sim, cli, tmp_path,
                                                                                            monkeypatch):
    root = sim("healthy")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = cli("--root", str(root), "--json", "profile", "show", "--set", "p2p_module.signing_key=keys/mok.key")
    assert r.code == 0, r.err
    prof = json.loads(r.out)["profile"]
    assert prof["p2p_module"]["signing_key"] == "/var/lib/p2pkit/keys/mok.key"
    assert prof["serve"]["flags"]["request-log-jsonl"] == "/var/lib/p2pkit/engine/requests.jsonl"
    r = cli("--root", str(root), "--state-dir", str(tmp_path / "st"), "--json", "profile", "show")
    assert r.code == 0, r.err
    want = "/" + str((tmp_path / "st").relative_to(root)) if (tmp_path / "st").is_relative_to(root) \
        else str(tmp_path / "st")
    assert json.loads(r.out)["profile"]["serve"]["flags"]["request-log-jsonl"] == f"{want}/engine/requests.jsonl"
    assert os.listdir(elsewhere) == []
    assert not (Path(config.__file__).resolve().parent.parent / "playbooks/requests.jsonl").exists()
