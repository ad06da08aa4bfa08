"""`p2pkit report FILE`: one archive for a bug report; no secret in any member; never a half archive;
never over an existing file without --force; it runs on a host whose profile or GPUs are broken."""

from __future__ import annotations

import json
import tarfile

import pytest

from p2pkit.core import secrets, writers


def members(path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.removeprefix("p2pkit-report/"): tar.extractfile(m).read() for m in tar if m.isfile()}


@pytest.fixture
def forget_secrets(monkeypatch):
    """A fresh process's redaction: what earlier commands of this test process registered is forgotten
    (`report` must find the secrets itself)."""
    def forget() -> None:
        monkeypatch.setattr(secrets, "_values", set())
    return forget


def test_report_of_a_host_with_a_token_holds_no_token(cli, sim, tmp_path, forget_secrets):
    root = sim("healthy")
    token = "hf_r3p0rt_s3cr3t_t0ken"
    assert cli("--root", str(root), "--set", f"serve.env.HF_TOKEN={token}", "--set", "host.min_free_disk_gib=10",
               "up", "--to", "preflight").code == 0
    # where a token lives on a brought-up host: the engine's root-only secrets file (the service stage's
    # writer), and wherever a tool printed it (here: a line in a stage's log)
    (root / "etc/p2pkit").mkdir(parents=True, exist_ok=True)
    (root / "etc/p2pkit/engine.secrets.env").write_text(writers.env_file({"HF_TOKEN": token}, "secrets"))
    state = root / "var/lib/p2pkit"
    (state / "logs").mkdir(exist_ok=True)
    with open(state / "logs/preflight.log", "a") as fh:
        fh.write(f"engine: using HF_TOKEN={token}\n")
    forget_secrets()
    out = tmp_path / "bug.tar.gz"
    r = cli("--root", str(root), "--json", "report", str(out))
    assert r.code == 0, r.err
    got = members(out)
    for name, data in got.items():
        assert token.encode() not in data, name
    assert b"HF_TOKEN=<redacted>" in got["logs/preflight.log"]
    assert {"report.json", "facts.json", "profile.json", "state/preflight.json", "state/profile.json",
            "logs/preflight.log"} <= set(got)
    assert json.loads(got["state/profile.json"])["overrides"] == ["host.min_free_disk_gib=10"]
    rep = json.loads(got["report.json"])
    assert set(rep["versions"]) == {"p2pkit", "kernel", "driver", "engine", "ansible"}
    assert rep["simulated"] is True and rep["members"] == sorted(set(got) - {"report.json"})
    assert json.loads(got["facts.json"])["kind"] == "p2pkit-facts"
    assert r.json()["file"] == str(out) and (out.stat().st_mode & 0o777) == 0o600


def test_report_refuses_an_existing_file_without_force(cli, sim, tmp_path):
    root = sim("healthy")
    out = tmp_path / "bug.tar.gz"
    out.write_text("mine")
    r = cli("--root", str(root), "report", str(out))
    assert r.code == 2 and "exists" in r.err and "--force" in r.err and out.read_text() == "mine"
    assert cli("--root", str(root), "report", str(out), "--force").code == 0
    assert "report.json" in members(out)


def test_no_half_archive_when_writing_fails(cli, sim, tmp_path, monkeypatch):
    root = sim("healthy")
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(tarfile.TarFile, "addfile", full_disk)
    r = cli("--root", str(root), "report", str(out_dir / "bug.tar.gz"))
    assert r.code == 2 and "No space left on device" in r.err and "Traceback" not in r.err
    assert list(out_dir.iterdir()) == []  # neither the archive nor its temporary file


def test_report_runs_on_a_host_without_gpus_and_a_truncated_profile_record(cli, sim, tmp_path):
    """Nothing works there: no GPU, no driver, the recorded profile cut short. The archive is still
    written, the profile's error and the unread facts said."""
    root = sim("no-gpu")
    state = root / "var/lib/p2pkit"
    state.mkdir(parents=True, exist_ok=True)
    (state / "profile.json").write_text('{"source": "dual-5090-ninf')
    out = tmp_path / "bug.tar.gz"
    r = cli("--root", str(root), "--json", "report", str(out))
    assert r.code == 0, r.err
    left = {x["what"]: x["why"] for x in r.json()["left_out"]}
    assert "the recorded profile" in left["the profile in force"]
    got = members(out)
    assert got["state/profile.json"] == b'{"source": "dual-5090-ninf'  # the broken record itself
    rep = json.loads(got["report.json"])
    assert rep["versions"]["driver"].startswith("unknown") and rep["facts_not_read"]
    assert "left out: the profile in force" in r.err
