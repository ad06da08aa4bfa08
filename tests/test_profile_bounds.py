"""Numbers and sizes bounded when a profile is read (issue 40, item 4): every number in the range its key
allows, every string, name, list, table and the whole file within a documented size (an engine value no
larger than execve takes), an unknown engine flag refused by `profile validate` as the start refuses it.
No value ends in exit 70; a refused value changes nothing on the host."""

from __future__ import annotations

import json
import typing
from dataclasses import fields

import jsonschema
import pytest
from conftest import make_sim

from p2pkit.core import config
from p2pkit.core.errors import Exit, P2pkitError
from p2pkit.schemas import profile_schema

BIG = "9" * 401  # a 401-digit integer: float() of it overflows
HUGE = "9" * 5000  # past Python's 4300-digit limit for reading an integer


def numeric_keys():
    for sec, cls in config.SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for fl in fields(cls):
            if hints[fl.name] in (int, float):
                yield f"{sec}.{fl.name}", fl


def test_every_number_key_has_a_range():
    open_ended = [k for k, fl in numeric_keys() if fl.metadata.get("lo") is None or fl.metadata.get("hi") is None]
    assert not open_ended, open_ended


@pytest.mark.parametrize("key", ["serve.flags.max-context", "serve.flags.tp", "serve.flags.prefill-chunk",
                                 "link.load_seconds", "link.max_replay_increase", "serve.port"])
@pytest.mark.parametrize("digits", [BIG, "-" + BIG, HUGE])
def test_a_huge_integer_is_an_input_error_naming_the_key(cli, key, digits):
    r = cli("--set", f"{key}={digits}", "profile", "validate", "dual-5090-ninfer")
    assert r.code == Exit.USAGE, (key, r.code, r.err[-600:])
    assert key in r.err and "internal error" not in r.err, r.err[-600:]
    assert len(r.err) < 4000, "the value is shown cut short, not whole"


@pytest.mark.parametrize("args", [["plan"], ["doctor"], ["verify", "service"], ["up", "--from", "service"],
                                  ["status"]])
def test_no_command_ends_in_exit_70_on_a_huge_flag_and_nothing_changes(cli, tmp_path, args):
    root = make_sim(tmp_path / "h")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    r = cli("--root", str(root), "--set", f"serve.flags.max-context={BIG}", *args)
    assert r.code == Exit.USAGE, (args, r.code, r.out[-300:], r.err[-600:])
    assert "serve.flags.max-context" in r.err
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_a_profile_file_with_a_5000_digit_integer_is_a_profile_error(tmp_path, cli):
    f = tmp_path / "p.toml"
    f.write_text(f"[profile]\nname = \"x\"\n[link]\nsamples = {HUGE}\n")
    r = cli("profile", "validate", str(f))
    assert r.code == Exit.USAGE and "internal error" not in r.err, r.err[-500:]
    assert "4300" in r.err or "digits" in r.err, r.err[-500:]


HOSTILE = [BIG, "-" + BIG, "1e400", "-1e400", "nan", "inf", "true", "[]", "{}", "[1, 2]", '"' + "x" * 200_000 + '"',
           '"a\u2028b"', "0", "-1", "1.5", "2147483648", "9223372036854775808"]


def every_key():
    for sec, cls in config.SECTIONS.items():
        for fl in fields(cls):
            yield f"{sec}.{fl.name}"
    yield from ("serve.flags.max-context", "serve.flags.tp", "serve.flags.model-id", "serve.env.X",
                "engine.python_pins.torch")


def test_no_value_of_any_key_ends_in_anything_but_a_profile_error():
    failures = []
    for key in every_key():
        for raw in HOSTILE:
            if key == "serve.host" and raw in ("true", "0", "-1", "1.5"):
                continue  # a name to resolve: left out so the test asks no resolver
            try:
                config.load("dual-5090-ninfer", (f"{key}={raw}",))
            except P2pkitError as e:
                if e.code != Exit.USAGE:
                    failures.append((key, raw[:20], e.code))
            except Exception as e:  # anything else is exit 70
                failures.append((key, raw[:20], f"{type(e).__name__}: {e}"[:120]))
    assert not failures, failures[:20]


# ------------------------------------------------------------------------------------------------ sizes

def refused(*sets: str) -> P2pkitError:
    with pytest.raises(P2pkitError) as e:
        config.load("dual-5090-ninfer", sets)
    assert e.value.code == Exit.USAGE
    return e.value


def test_an_env_value_is_no_larger_than_execve_takes():
    # "X=" + value + NUL must fit MAX_ARG_STRLEN (131072 bytes with 4 KiB pages): one byte more is E2BIG
    fits = config.MAX_ARG_STRLEN - len("X=") - 1
    with pytest.raises(P2pkitError) as e:
        config.load("dual-5090-ninfer", (f"serve.env.X={'a' * (fits + 1)}",))
    assert e.value.code == Exit.USAGE and "serve.env.X" in str(e.value.problems)
    assert "131072" in str(e.value.problems) and "E2BIG" in str(e.value.problems)
    e = refused(f"serve.env.X={'a' * (1 << 20)}")  # the 1 MB value of the issue
    assert "serve.env.X" in str(e.problems)


def test_the_engines_environment_and_flags_together_fit_the_least_room_execve_gives():
    values = [f"serve.env.V{i}={'a' * 30_000}" for i in range(4)]  # each fits alone; together over 112 KiB
    e = refused(*values)
    assert "serve.env" in str(e.problems) and "131072" in str(e.problems), e.problems
    config.load("dual-5090-ninfer", tuple(values[:3]))  # 90 KB: fits


def test_a_table_holds_at_most_256_entries():
    sets = tuple(f"serve.env.V{i}=1" for i in range(config.ITEMS_MAX + 1))
    e = refused(*sets)
    assert any(k == "serve.env" and "257" in m and "256" in m for k, m in e.problems), e.problems
    config.load("dual-5090-ninfer", sets[:config.ITEMS_MAX])


@pytest.mark.parametrize("key,limit", [("profile.description", config.STRING_MAX), ("model.source", config.STRING_MAX),
                                       ("engine.build_dir", config.STRING_MAX)])
def test_a_string_key_holds_at_most_its_size(key, limit):
    start = "" if key == "profile.description" else "/opt/" if key == "engine.build_dir" else "/"  # not /x itself
    e = refused(f"{key}={start}{'a' * (limit + 1 - len(start))}")
    assert key in str(e.problems) and str(limit) in str(e.problems)
    config.load("dual-5090-ninfer", (f"{key}={start}{'a' * (limit - len(start))}",))


def test_a_name_holds_at_most_255_bytes():
    e = refused(f"serve.env.{'A' * 256}=1")
    assert "255" in str(e.problems)


def test_a_list_holds_at_most_256_items():
    e = refused(f"model.components={json.dumps(['x'] * 257)}")
    assert "model.components" in str(e.problems) and "256" in str(e.problems)


def test_a_profile_file_is_at_most_1_mib(tmp_path, cli):
    f = tmp_path / "big.toml"
    f.write_text(config.builtin_path("dual-5090-ninfer").read_text() + "#" * (1 << 20) + "\n")
    r = cli("profile", "validate", str(f))
    assert r.code == Exit.USAGE and "1048576" in r.err, r.err[-500:]


def test_the_limits_are_in_the_schema_and_the_schema_refuses_what_validate_refuses():
    s = profile_schema()
    props = s["properties"]
    assert props["profile"]["properties"]["description"]["maxLength"] <= config.STRING_MAX
    assert "bytes" in props["profile"]["properties"]["description"]["description"]
    env = props["serve"]["properties"]["env"]
    assert env["maxProperties"] == config.ITEMS_MAX and env["propertyNames"]["maxLength"] == config.NAME_MAX
    assert "131072" in env["description"] and "E2BIG" in env["description"]
    assert props["link"]["properties"]["max_replay_increase"]["maximum"] is not None
    assert props["model"]["properties"]["components"]["maxItems"] == config.ITEMS_MAX
    doc = config.load("dual-5090-ninfer").as_dict()
    jsonschema.validate(doc, s)
    doc["profile"]["description"] = "a" * (config.STRING_MAX + 1)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, s)


# ------------------------------------------------------------------------------------- engine flags

def test_profile_validate_refuses_an_unknown_engine_flag_as_the_start_does(cli):
    r = cli("--set", "serve.flags.bogus-flag=1", "profile", "validate", "dual-5090-ninfer")
    assert r.code == Exit.USAGE, r.out + r.err
    assert "serve.flags.bogus-flag" in r.err, r.err
    r = cli("--json", "--set", "serve.flags.bogus-flag=1", "profile", "validate", "dual-5090-ninfer")
    assert r.code == Exit.USAGE and any(p["key"] == "serve.flags.bogus-flag" for p in r.json()["problems"])
    for name in config.builtin_names():  # a built-in profile validates (an inventory completes the Spark pair's)
        assert cli("profile", "validate", name).code == 0, name
    r = cli("--set", "serve.flags.--tp=2", "profile", "validate", "dual-5090-ninfer")
    assert r.code == Exit.USAGE and "serve.flags.--tp" in r.err, r.err
