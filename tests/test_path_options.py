"""Every path option is checked before the first stage runs (issue 40, item 7): a relative one is the
working directory's, resolved once at the door; a file to write is refused (exit 2, naming the option)
when it is a directory, its directory is missing or it cannot be written; and `--set` twice for one key
with two values is refused naming both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import make_sim


def test_a_relative_state_dir_is_the_working_directorys_from_the_first_command(cli, tmp_path, monkeypatch):
    """It reached the p2p-module stage as "st" and failed there ("the state directory is not an absolute
    path"), after preflight and the driver had run."""
    root = make_sim(tmp_path / "host")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = cli("--root", str(root), "--state-dir", "st", "--json", "profile", "show")
    assert r.code == 0, r.err
    flags = json.loads(r.out)["profile"]["serve"]["flags"]
    assert flags["request-log-jsonl"] == f"{work}/st/engine/requests.jsonl", flags


@pytest.mark.slow
def test_up_with_a_relative_state_dir_goes_through_the_p2p_module_stage(cli, tmp_path, monkeypatch):
    root = make_sim(tmp_path / "host")
    monkeypatch.chdir(tmp_path)
    r = cli("--root", str(root), "--state-dir", "st", "--yes", "up", "--reboot", "--to", "p2p-module")
    assert r.code == 0, r.err[-2000:]
    assert json.loads((tmp_path / "st/p2p-module.json").read_text())["status"] == "passed"
    assert json.loads((tmp_path / "st/profile.json").read_text())["source"].startswith("/")


@pytest.mark.parametrize("option", ["--junit", "--prometheus"])
def test_verify_refuses_an_output_file_it_could_not_write_before_any_check(cli, tmp_path, option):
    root = make_sim(tmp_path / "host")
    ext = ".prom" if option == "--prometheus" else ".xml"
    cases = {
        "a directory": (tmp_path, "is a directory"),
        "a missing directory": (tmp_path / f"nowhere/out{ext}", "does not exist"),
        "a file as directory": (tmp_path / f"host/etc/os-release/out{ext}", "is not a directory"),
    }
    for what, (path, says) in cases.items():
        r = cli("--root", str(root), "verify", "preflight", option, str(path))
        assert r.code == 2 and "[preflight]" not in r.err, (what, r.err)  # refused before the checks ran
        if option == "--junit":  # (--prometheus says where node_exporter reads in its own words first)
            assert f"{option} {path}" in r.err and says in r.err, (what, r.err)
        else:
            assert str(path.parent if what != "a directory" else path) in r.err, (what, r.err)


def test_a_relative_output_file_is_written_in_the_working_directory(cli, tmp_path, monkeypatch):
    root = make_sim(tmp_path / "host")
    monkeypatch.chdir(tmp_path)
    r = cli("--root", str(root), "verify", "preflight", "--junit", "out.xml")
    assert r.code in (0, 1), r.err
    assert (tmp_path / "out.xml").is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_an_output_file_in_a_directory_that_cannot_be_written_is_refused(cli, tmp_path):
    import subprocess

    root = make_sim(tmp_path / "host")
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True).returncode:
        pytest.skip("cannot make a read-only bind mount here")
    try:
        r = cli("--root", str(root), "verify", "preflight", "--junit", str(ro / "out.xml"))
        assert r.code == 2 and f"--junit {ro / 'out.xml'}: {ro} is not writable" in r.err, r.err
    finally:
        subprocess.run(["umount", str(ro)])


def test_report_and_facts_record_refuse_a_missing_directory_before_any_work(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    for cmd in (["report", str(tmp_path / "no/r.tar.gz")], ["facts", "record", str(tmp_path / "no/f.json")]):
        r = cli("--root", str(root), *cmd)
        assert r.code == 2 and str(tmp_path / "no") in r.err, (cmd, r.err)


def test_bench_refuses_its_output_files_before_the_engine_is_asked(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    for option in ("--plot", "--prometheus"):
        r = cli("--root", str(root), "bench", option, str(tmp_path))
        assert r.code == 2 and f"{option} {tmp_path} is a directory" in r.err, (option, r.err)


def test_set_twice_for_one_key_with_two_values_is_refused_naming_both(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    r = cli("--root", str(root), "--set", "serve.port=8001", "--set", "serve.port=9001", "--yes", "up", "--to",
            "preflight")
    assert r.code == 2 and "--set serve.port is given twice with different values: '8001' and '9001'" in r.err, r.err
    assert not (root / "var/lib/p2pkit/profile.json").exists()
    r = cli("--root", str(root), "--set", "serve.port=8001", "--set", "serve.port=8001", "--json", "profile", "show")
    assert r.code == 0 and json.loads(r.out)["profile"]["serve"]["port"] == 8001, r.err


def test_a_recorded_override_is_replaced_by_one_set_not_called_a_repeat(cli, tmp_path):
    root = make_sim(tmp_path / "host")
    state = root / "var/lib/p2pkit"
    state.mkdir(parents=True)
    (state / "profile.json").write_text(json.dumps({"source": "dual-5090-ninfer", "overrides": ["serve.port=8001"]}))
    r = cli("--root", str(root), "--set", "serve.port=9001", "--json", "profile", "show")
    assert r.code == 0 and json.loads(r.out)["profile"]["serve"]["port"] == 9001, r.err
    assert Path(state / "profile.json").exists()
