"""`p2pkit pin` (issue 17): the three pins filled from what the user has, the archive's own
checksums first (its makeself header read, never run), the diff before the write. The simulated
host's installer is a makeself-style archive with an MD5 of its payload; its fork and engine are
real git repositories."""

import json
import tomllib
from pathlib import Path

from p2pkit.core import config


def blank_profile(root: Path, tmp_path: Path) -> tuple[Path, dict]:
    src = Path(json.loads((root / ".p2pkit-sim/state.json").read_text())["profile"])
    pinned = tomllib.loads(src.read_text())
    text = src.read_text()
    for v in (pinned["driver"]["installer_sha256"], pinned["p2p_module"]["commit"], pinned["engine"]["commit"]):
        text = text.replace(f'"{v}"', '""')
    mine = tmp_path / "mine.toml"
    mine.write_text("# my box\n" + text)
    return mine, pinned


def test_pin_fills_the_three_pins_showing_the_diff_first(cli, sim, tmp_path):
    root = sim("healthy")
    mine, pinned = blank_profile(root, tmp_path)
    before = mine.read_text()
    installer = root / ".p2pkit-sim/downloads/NVIDIA-Linux-x86_64-615.71.09.run"
    args = ["--profile", str(mine), "pin", "--installer", installer.as_uri(), "--fork-remote",
            "--engine", str(root / ".p2pkit-sim/git/ninfer-work")]
    r = cli(*args)
    assert r.code == 0, r.err
    assert f'+installer_sha256 = "{pinned["driver"]["installer_sha256"]}"' in r.out
    assert f'+commit = "{pinned["p2p_module"]["commit"]}"' in r.out
    assert "MD5 checksums are OK" in r.err and "nothing was written" in r.err
    assert mine.read_text() == before  # the diff only
    r = cli(*args, "--yes")
    assert r.code == 0 and "wrote" in r.err
    got = tomllib.loads(mine.read_text())
    assert got["driver"]["installer_sha256"] == pinned["driver"]["installer_sha256"]
    assert got["p2p_module"]["commit"] == pinned["p2p_module"]["commit"]
    assert got["engine"]["commit"] == pinned["engine"]["commit"]
    assert mine.read_text().startswith("# my box\n")  # the user's file, kept but for the pins
    assert cli("profile", "validate", str(mine)).code == 0


def test_pin_refuses_an_archive_that_fails_nvidias_own_check(cli, sim, tmp_path):
    root = sim("healthy")
    mine, _ = blank_profile(root, tmp_path)
    before = mine.read_text()
    bad = tmp_path / "NVIDIA-Linux-x86_64-615.71.09.run"
    good = root / ".p2pkit-sim/downloads/NVIDIA-Linux-x86_64-615.71.09.run"
    bad.write_text(good.read_text() + "# a truncated download's tail\n")
    bad.chmod(0o755)
    r = cli("--profile", str(mine), "pin", "--installer", str(bad), "--yes")
    assert r.code == 1 and "integrity check" in r.err and "bytes follow the payload" in r.err
    assert mine.read_text() == before
    bad.write_text(good.read_text()[:-10])  # a download cut short
    r = cli("--profile", str(mine), "pin", "--installer", str(bad), "--yes")
    assert r.code == 1 and "10 bytes short (the download is truncated)" in r.err
    bad.write_text(good.read_text().replace("libnvidia-ml", "libnvidia-mX"))  # a changed payload
    r = cli("--profile", str(mine), "pin", "--installer", str(bad), "--yes")
    assert r.code == 1 and "MD5 of payload file 1 is" in r.err and "the header says" in r.err
    assert mine.read_text() == before


def test_pin_reads_the_installer_and_never_runs_it(cli, sim, tmp_path):
    """The archive is read as text: an installer whose first line would run a program (as root, under
    sudo) is pinned by its header and payload checksums, and the program never runs."""
    root = sim("healthy")
    mine, _ = blank_profile(root, tmp_path)
    good = root / ".p2pkit-sim/downloads/NVIDIA-Linux-x86_64-615.71.09.run"
    ran = tmp_path / "it-ran"
    trap = tmp_path / "trap.sh"
    trap.write_text(f"#!/bin/sh\ntouch {ran}\n")
    trap.chmod(0o755)
    lines = good.read_text().splitlines(keepends=True)
    evil = tmp_path / "NVIDIA-Linux-x86_64-615.71.09.run"
    evil.write_text(f"#!{trap}\n" + "".join(lines[1:]))  # the same header lines and payload
    evil.chmod(0o755)
    r = cli("--json", "--profile", str(mine), "pin", "--installer", str(evil))
    assert r.code == 0, r.err
    found = r.json()["found"]["installer"]
    assert found["version"] == "615.71.09" and found["label"].endswith("Linux-x86_64 615.71.09")
    assert found["check"].startswith("MD5 checksums are OK")
    assert not ran.exists()


def test_pin_refuses_an_installer_of_another_driver_version(cli, sim, tmp_path):
    root = sim("healthy")
    mine, _ = blank_profile(root, tmp_path)
    from p2pkit.sim.provision import make_installer

    other, _ = make_installer(tmp_path / "other", "595.71.05", True)
    r = cli("--profile", str(mine), "pin", "--installer", str(other), "--yes")
    assert r.code == 2 and "is driver 595.71.05" in r.err and "the profile pins driver 615.71.09" in r.err


def test_makeself_header_fields():
    from p2pkit.parse.makeself import header

    text = ('#!/bin/sh\n# This script was generated using Makeself 2.1.5\n\nCRCsum="1234"\n'
            'MD5="00000000000000000000000000000000"\nSHA="' + "ab" * 32 + '"\n'
            'label="NVIDIA Accelerated Graphics Driver for Linux-aarch64 615.71.09"\nfilesizes="10 20"\n'
            'offset=`head -n 530 "$1" | wc -c | tr -d " "`\n')
    h = header(text)
    assert (h["version"], h["skip"], h["sizes"], h["shas"]) == ("615.71.09", 530, [10, 20], ["ab" * 32])
    assert "md5s" not in h  # all zeros: makeself made it with --nomd5


def test_pin_a_builtin_profile_into_a_new_file(cli, sim, tmp_path):
    root = sim("healthy")
    r = cli("pin", "--fork", str(root / ".p2pkit-sim/git/work"))
    assert r.code == 2 and "--out" in r.err
    out = tmp_path / "dual.toml"
    r = cli("--set", "serve.port=8001", "pin", "--fork", str(root / ".p2pkit-sim/git/work"), "--out", str(out),
            "--yes")
    assert r.code == 0, r.err
    p = config.load(str(out))
    assert p.name == "dual-5090-ninfer" and p.serve.port == 8001 and len(p.p2p_module.commit) == 40
    doc = cli("--json", "--profile", str(out), "pin", "--engine", str(root / ".p2pkit-sim/git/ninfer-work")).json()
    assert doc["kind"] == "p2pkit-pin" and doc["written"] is False and len(doc["found"]["engine"]["commit"]) == 40


def test_pin_out_writes_a_comment_per_pin_and_junk_is_bad_input(cli, sim, tmp_path):
    """Issue 47 item 12: `pin --out F --yes` wrote one header comment, not a comment per pin saying where it came
    from (the README says it does); `pin --installer junk.txt` exited 1 where other bad input exits 2."""
    root = sim("healthy")
    out = tmp_path / "mine.toml"
    work = root / ".p2pkit-sim/git/work"
    r = cli("pin", "--fork", str(work), "--engine", str(root / ".p2pkit-sim/git/ninfer-work"), "--out", str(out),
            "--yes")
    assert r.code == 0, r.err
    lines = out.read_text().splitlines()
    for where in (f"checkout {work} ", "ninfer-work"):  # beside each pinned commit, as `up --pin` writes them
        notes = [ln for ln in lines if ln.startswith("commit = ") and "# pinned by `p2pkit pin` on " in ln
                 and where in ln]
        assert len(notes) == 1, (where, out.read_text()[:3000])
    junk = tmp_path / "junk.txt"
    junk.write_text("not an installer\n")
    r = cli("pin", "--installer", str(junk), "--out", str(tmp_path / "other.toml"))
    assert r.code == 2 and "is not a makeself archive" in r.err and not (tmp_path / "other.toml").exists(), r.err
