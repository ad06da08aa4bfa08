"""A flag value the engine would read as an option of its own (issue 40, also noticed: serve.flags.model-id =
"--host=0.0.0.0"). From each engine's real parser: ninfer-serve (src/serve/serve_options.cpp, require_value)
and llama-server (common/arg.cpp, parse_cli_args: `argv[++i]`) take the argument after a flag that takes a
value as that value, whatever it starts with, so such a value is accepted and passed as one argument; after a
switch (a flag that takes no value) the next argument is read as an option, so a switch takes only true or
false. vLLM's argparse reads every argument that starts with "-" as an option unless it is a negative number
or holds a space, so vLLM's flags take no such value."""

from __future__ import annotations

import argparse

import pytest

from p2pkit.core import config
from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import vllm
from p2pkit.sim import engine as sim_engine


def refusal(profile: str, *sets: str) -> list[tuple[str, str]]:
    with pytest.raises(P2pkitError) as e:
        config.load(profile, sets)
    assert e.value.code == Exit.USAGE
    return e.value.problems


def test_ninfer_takes_a_dash_value_after_a_flag_that_takes_one_as_that_value():
    p = config.load("dual-5090-ninfer", ("serve.flags.model-id=--host=0.0.0.0",))
    argv = engine_cmd.argv(p)
    i = argv.index("--model-id")
    assert argv[i + 1] == "--host=0.0.0.0"
    # the simulated ninfer-serve parses as the real one does (require_value: the next argument, whatever it is)
    _, flags = sim_engine.parse(argv[1:])
    assert flags["model-id"] == "--host=0.0.0.0" and flags["host"] == p.serve.host


@pytest.mark.parametrize("profile,key,value", [
    ("dual-5090-ninfer", "lm-head-draft", "--host=0.0.0.0"),
    ("dual-5090-ninfer", "vision", "yes"),
    ("dual-5090-llamacpp", "jinja", "--host=0.0.0.0"),
    ("dual-5090-llamacpp", "metrics", "1"),
])
def test_a_switch_takes_only_true_or_false(profile, key, value):
    problems = refusal(profile, f"serve.flags.{key}={value}")
    assert any(k == f"serve.flags.{key}" and "takes no value" in m for k, m in problems), problems


def test_llamacpp_takes_a_dash_value_after_a_flag_that_takes_one():
    p = config.load("dual-5090-llamacpp", ("serve.flags.mmproj=--host=0.0.0.0", "serve.flags.n-gpu-layers=-1"))
    argv = engine_cmd.argv(p)
    assert argv[argv.index("--mmproj") + 1] == "--host=0.0.0.0" and argv[argv.index("--n-gpu-layers") + 1] == "-1"


@pytest.mark.parametrize("value", ["--host=0.0.0.0", "-x", "--port"])
def test_vllm_takes_no_value_that_starts_with_a_dash(value):
    problems = refusal("dual-spark-vllm", f"serve.flags.served-model-name={value}")
    assert any(k == "serve.flags.served-model-name" and "argparse" in m for k, m in problems), problems


@pytest.mark.parametrize("value", ["-1", "-0.5", "a -b", "qwen"])
def test_vllm_takes_a_negative_number_or_a_value_with_a_space(value):
    config.load("dual-spark-vllm", (f"serve.flags.served-model-name={value}",))


def test_argparse_reads_a_dash_value_as_an_option_as_the_refusal_says():
    # the real argparse vLLM's FlexibleArgumentParser is built on: the rule the refusal mirrors
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--host")
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args(["--served-model-name", "--host=0.0.0.0"])
    ns = parser.parse_args(["--served-model-name", "a -b", "--max-model-len", "-1"])
    assert ns.served_model_name == ["a -b"] and ns.max_model_len == -1
    for value in ("--host=0.0.0.0", "-x", "--port"):
        assert not vllm.NEGATIVE_NUMBER.match(value)
    for value in ("-1", "-0.5"):
        assert vllm.NEGATIVE_NUMBER.match(value) and parser._negative_number_matcher.match(value)
