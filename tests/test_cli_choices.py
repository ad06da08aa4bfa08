"""Stage names are choices: a typo is refused while the command line is read, with the list, and
shell completion offers them (through typer's completion protocol, as an installed completion
script calls it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from p2pkit.stages import names


@pytest.mark.parametrize("args", [["verify", "lnk"], ["up", "--to", "tpology"], ["up", "--from", "drivr"]])
def test_a_mistyped_stage_is_refused_with_the_list(cli, sim, args):
    root = sim("healthy")
    r = cli("--root", str(root), *args)
    assert r.code == 2
    assert "the stages are: " + ", ".join(names()) in r.err
    assert not (root / "var/lib/p2pkit/preflight.json").exists()  # nothing ran


@pytest.mark.parametrize(("words", "cword", "want"), [("p2pkit verify li", 2, ["link"]),
                                                      ("p2pkit up --from p2", 3, ["p2p-module"]),
                                                      ("p2pkit verify ", 2, names()),
                                                      ("p2pkit logs ", 2, names()),
                                                      ("p2pkit rollback ", 2, ["p2p-module", "driver"]),
                                                      ("p2pkit --profile dual-5090", 2,
                                                       ["dual-5090-llamacpp", "dual-5090-ninfer"])])
def test_shell_completion_offers_stage_names(words, cword, want):
    env = {**os.environ, "_P2PKIT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    r = subprocess.run([sys.executable, "-m", "p2pkit"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == want


def test_completion_can_be_shown_for_bash():
    r = subprocess.run([sys.executable, "-m", "p2pkit", "--show-completion", "bash"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "_P2PKIT_COMPLETE=complete_bash" in r.stdout


def test_ctrl_c_says_interrupted_and_exits_130(cli, monkeypatch):
    """A real SIGINT while a command runs. typer turns the KeyboardInterrupt into a silent exit 130;
    p2pkit says "interrupted" and how to go on, on stderr and in the JSON error document."""
    import os
    import signal
    import time

    from p2pkit.core import config

    def ctrl_c(*a, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises before this ends
        raise AssertionError("SIGINT did not interrupt")

    old = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(config, "load", ctrl_c)
    try:
        r = cli("--json", "profile", "show", "dual-5090-ninfer")
    finally:
        signal.signal(signal.SIGINT, old)
    assert r.code == 130, r.err
    assert "interrupted" in r.err and "run the same command again" in r.err
    doc = json.loads(r.out)
    assert (doc["kind"], doc["exit_code"]) == ("p2pkit-error", 130), doc


def test_ctrl_c_that_a_command_ends_on_is_not_an_interruption(monkeypatch, capsys):
    """`logs --follow` stops on Ctrl-C by design and exits 0: no "interrupted", no 130."""
    import os
    import signal

    from p2pkit.cli import app

    def follows(*a, **kw):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # let the handler run
        except KeyboardInterrupt:
            return 0
        raise AssertionError("SIGINT did not interrupt")

    old = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(app, "app", follows)
    monkeypatch.setattr(sys, "argv", ["p2pkit", "logs", "driver", "--follow"])
    try:
        with pytest.raises(SystemExit) as e:
            app.run()
    finally:
        signal.signal(signal.SIGINT, old)
    assert e.value.code == 0 and "interrupted" not in capsys.readouterr().err


def test_help_names_the_stages_and_the_bench_lengths_defaults(cli):
    r = cli("up", "--help")
    text = " ".join(r.out.replace("│", " ").split())
    assert "<str>" not in text and "STAGE" in text
    assert "last stage to run (one of " + ", ".join(names()) + ")" in text
    r = cli("bench", "--help")
    text = " ".join(r.out.replace("│", " ").split())
    assert "the fixed prompt length of every request (default: the profile's bench.prompt_tokens; 128" in text
    assert "the fixed output length of every request (default: the profile's bench.output_tokens; 64" in text
