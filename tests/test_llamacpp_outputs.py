"""What the real llama.cpp prints, read by p2pkit: llama-bench's four output formats and its errors,
llama-server's --help (removed options), its start failures, and the build's own log, re-configure
and no-op dry run (P07). Every text here was recorded from the real CPU build tests/llama_real.py
makes; tests/fixtures/llamacpp/README.md says how."""

import json
from pathlib import Path

import pytest

from p2pkit.parse import engine_api as pe

FIX = Path(__file__).parent / "fixtures/llamacpp"


# ------------------------------------------------------------------ --help: removed options (issue 27, 4)

def test_options_the_real_help_marks_removed_are_not_accepted_flags():
    """llama-server keeps --draft-max and friends in its --help only to say what replaced them
    (common/arg.cpp arg_removed): they are not flags to write into a unit."""
    text = (FIX / "llama-server-help.txt").read_text()
    flags, removed = pe.help_flags(text), pe.help_removed(text)
    gone = {"draft", "draft-n", "draft-max", "draft-min", "draft-n-min", "spec-ngram-size-n", "spec-ngram-size-m",
            "spec-ngram-min-hits"}
    assert set(removed) == gone and not gone & flags
    assert removed["draft-max"] == "the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max"
    assert {"spec-draft-n-max", "spec-draft-n-min", "ctx-checkpoints", "swa-checkpoints"} <= flags
    # a description that starts on the next line (the names fill the column) is read there
    opts = {tuple(sorted(n)): d for n, d in pe.help_options(text)}
    assert opts[("ctx-checkpoints", "swa-checkpoints")].startswith("max number of context checkpoints")
