"""One definition of a line break (issue 40, item 5): every writer refuses, and every check of a profile
value refuses, each character any reader could take as a line or word break or that changes how text
reads (p2pkit.core.breaks.BREAKS); p2pkit's own readers of the files it writes, or systemd reads, split only
on \\n, so a hand-written file holding U+2028 is read as the one variable systemd reads."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from p2pkit.core import breaks, config, tomlwrite, writers
from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.facts import collect
from p2pkit.host import Host, access
from p2pkit.parse import boot, system

SMUGGLED = "a\u2028NCCL_P2P_DISABLE=1"  # what str.splitlines() reads as two lines
BREAK_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Zs", "Cs"}


def test_the_table_holds_every_break_of_this_pythons_unicode_database():
    missing = [f"U+{cp:04X}" for cp in range(sys.maxunicode + 1)
               if unicodedata.category(chr(cp)) in BREAK_CATEGORIES and chr(cp) != " "
               and not breaks.BREAKS.match(chr(cp))]
    assert not missing, missing[:20]
    # and nothing a profile may hold in plain text: letters, digits, punctuation, the space, CJK, emoji
    for ch in "aZ09 _-./:@=~,+%!*()[]{}'\"\\`$#&;<>?|^ü中😀":
        assert not breaks.BREAKS.match(ch), ch


@pytest.mark.parametrize("ch", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\u202e", "\u2066", "\u200b",
                                "\ufeff", "\u00a0", "\u061c", "\udc80"])
def test_every_writer_refuses_each_break(ch):
    v = f"a{ch}b"
    for write in (lambda: writers.env_line("X", v), lambda: writers.unit_value("Description", v),
                  lambda: writers.unit_exec(["/bin/engine", v]), lambda: writers.shell_word("x", v),
                  lambda: writers.env_file({"X": v})):
        with pytest.raises(writers.UnsafeValue) as e:
            write()
        assert f"U+{ord(ch):04X}" in e.value.message, e.value.message


@pytest.mark.parametrize("ch", ["\u2028", "\x85", "\u202e", "\u200b", "\ufeff"])
def test_the_toml_writer_escapes_each_break_and_reads_it_back(ch):
    import tomllib

    text = f"v = {tomlwrite.value('a' + ch + 'b')}\n{tomlwrite.comment('c' + ch + 'd')}\n"
    assert not breaks.BREAKS.search(text.replace("\n", "")), repr(text)
    assert tomllib.loads(text)["v"] == f"a{ch}b"


def test_a_value_holding_u2028_is_refused_at_validate_naming_the_key_and_the_character(cli):
    r = cli("--set", f"serve.env.X={SMUGGLED}", "profile", "validate", "dual-5090-ninfer")
    assert r.code == Exit.USAGE, r.out + r.err
    assert "serve.env.X" in r.err and "U+2028 LINE SEPARATOR" in r.err, r.err


@pytest.mark.parametrize("key,value", [
    ("serve.env.X", "a\u0085NCCL_P2P_DISABLE=1"),  # NEXT LINE
    ("serve.flags.model-id", "qwen\u202eftp"),  # RIGHT-TO-LEFT OVERRIDE
    ("profile.description", "a\u200bb"),  # ZERO WIDTH SPACE
    ("model.source", "/srv/models/a\u2066b"),  # LEFT-TO-RIGHT ISOLATE
])
def test_each_break_is_refused_by_the_profile_check(key, value):
    with pytest.raises(P2pkitError) as e:
        config.load("dual-5090-ninfer", (f"{key}={value}",))
    assert e.value.code == Exit.USAGE
    assert key in str(e.value.problems), e.value.problems


def test_a_profile_file_holding_u2028_is_refused_naming_the_key(tmp_path, cli):
    text = tomlwrite.dumps(config.load("dual-5090-ninfer").as_dict())
    text = text.replace("[serve.env]", f"[serve.env]\nX = \"{SMUGGLED}\"") if "[serve.env]" in text else \
        text + f"\n[serve.env]\nX = \"{SMUGGLED}\"\n"
    f = tmp_path / "p.toml"
    f.write_text(text)
    r = cli("profile", "validate", str(f))
    assert r.code == Exit.USAGE and "serve.env.X" in r.err and "U+2028" in r.err, r.out + r.err


def test_a_hand_written_env_file_holding_u2028_is_one_variable(tmp_path):
    # systemd's EnvironmentFile= parser (src/basic/env-file.c) breaks a line on \n and \r only
    root = tmp_path / "host"
    (root / "etc/p2pkit").mkdir(parents=True)
    (root / "etc/p2pkit/engine.env").write_text(f'X="{SMUGGLED}"\nNCCL_P2P_LEVEL=SYS\n', encoding="utf-8")
    env = collect.collect(Host.at(root), ["engine_env_file"])["engine_env_file"]["env"]
    assert env == {"X": SMUGGLED, "NCCL_P2P_LEVEL": "SYS"}, env


def test_the_env_file_reader_reads_what_systemd_reads():
    text = ('# a comment\n; another\nA=plain  \nB="quoted \\"x\\" \\$y"\nC=\'single $z\'\n  D = spaced\n'
            'E="two\\\nlines"\nF=\nG=a\\ b\nA=again\n')
    assert writers.read_env_file(text) == {"A": "again", "B": 'quoted "x" $y', "C": "single $z", "D": "spaced",
                                           "E": "twolines", "F": "", "G": "a b"}
    for k, v in {"X": 'a\\b"c$d`e', "Y": "plain", "Z": ""}.items():  # the writer's lines read back exactly
        assert writers.read_env_file(writers.env_line(k, v) + "\n") == {k: v}


def test_readers_of_files_split_only_on_newline(tmp_path):
    assert breaks.lines("a\u2028b\x85c\x0bd\x0ce\x1cf\rg\nh\n") == ["a\u2028b\x85c\x0bd\x0ce\x1cf\rg", "h"]
    assert system.os_release(f'ID=ubuntu\nPRETTY_NAME="x{SMUGGLED}"\n') == {"ID": "ubuntu",
                                                                          "PRETTY_NAME": f"x{SMUGGLED}"}
    assert boot.entry_options("title x\u2028options iommu=pt\noptions quiet\n") == ["quiet"]
    root = tmp_path / "h"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                     "bob:x:1000:1000:a\u2028p2pkit:x:0:0::/:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    assert access.user_ids(Host.at(root), "p2pkit") is None


def test_toml_set_keeps_a_value_holding_u2028_whole():
    text = 'a = "x\u2028[serve]"\n[serve]\nport = 1\n'
    out = writers.toml_set(text, ["serve", "port"], 2)
    import tomllib

    assert tomllib.loads(out) == {"a": "x\u2028[serve]", "serve": {"port": 2}}


def test_a_unit_value_ending_in_a_backslash_is_refused_and_the_real_systemd_shows_why(tmp_path):
    """systemd joins a setting's line ending in `\\` with the next line: with the real systemd-analyze, an
    ExecStart= after such a line is swallowed (comment lines are not joined). unit_value cannot know where its
    value ends up on the line, so it refuses a final backslash; one inside a value stays as it is."""
    import shutil
    import subprocess

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed (CI installs systemd)")

    def verify(body: str) -> subprocess.CompletedProcess:
        unit = tmp_path / "t.service"
        unit.write_text(f"[Unit]\nDescription=t\n[Service]\n{body}ExecStart=/bin/true\n")
        return subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True)

    joined = verify("Environment=A=b\\\n")
    assert joined.returncode != 0 and "no ExecStart=" in joined.stderr, joined.stderr
    assert verify("Environment=A=b\n").returncode == 0
    with pytest.raises(writers.UnsafeValue) as e:
        writers.unit_value("the profile's name", "lab\\")
    assert "ends with a backslash" in e.value.message and "the profile's name" in e.value.message
    assert writers.unit_value("the profile's name", "a\\b 50%") == "a\\b 50%%"
