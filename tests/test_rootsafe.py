"""Root-safe by construction (issue 19): values from a profile cannot inject into the files root
reads, secrets stay in the one root-only file, numbers are finite, pins are full."""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import tomllib

import pytest

from p2pkit import config, secrets, writers
from p2pkit.errors import ProfileError

BASE = tomllib.loads(config.builtin_path("dual-5090-ninfer").read_text())
INJECT = "x\nExecStartPre=+/bin/sh -c 'touch /tmp/pwned'"


def profile_with(**changes) -> dict:
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        *secs, key = path.split("__")
        t = d
        for s in secs:
            t = t.setdefault(s, {})
        t[key] = value
    return d


def problems(**changes) -> dict[str, str]:
    with pytest.raises(ProfileError) as e:
        config.from_dict(profile_with(**changes), "evil.toml")
    return dict(e.value.problems)


# 1. one writer per format, and key types that say which characters they may hold ----------------

@pytest.mark.parametrize("changes,key,fragment", [
    ({"serve__env__FOO": INJECT}, "serve.env.FOO", "a newline (\\n)"),
    ({"serve__flags__model-id": INJECT}, "serve.flags.model-id", "a newline (\\n)"),
    ({"serve__flags__x\ny": "1"}, "serve.flags.x\ny", "a newline"),
    ({"engine__python_pins__vllm": "0.1\r"}, "engine.python_pins.vllm", "a carriage return"),
    ({"model__output": "/srv/models/$(reboot).gguf"}, "model.output", "'$'"),
    ({"model__output": "/srv/models/../../etc/cron.d/x"}, "model.output", "'..' component"),
    ({"engine__build_dir": "/opt/a b"}, "engine.build_dir", "' '"),
    ({"engine__build_dir": "/opt/50%"}, "engine.build_dir", "'%'"),
    ({"driver__installer_url": "https://x/{{ lookup('pipe','id') }}"}, "driver.installer_url", "'{'"),
    ({"profile__description": "{{ lookup('pipe', 'id') }}"}, "profile.description", "Jinja2 expression"),
    ({"serve__host": "127.0.0.1;reboot"}, "serve.host", "';'"),
])
def test_a_value_that_cannot_be_written_safely_is_refused_naming_key_and_character(changes, key, fragment):
    got = problems(**changes)
    assert key in got, got
    assert fragment in got[key], got[key]


def test_profile_validate_refuses_the_newline_injection(cli, tmp_path):
    f = tmp_path / "evil.toml"
    f.write_text(config.builtin_path("dual-5090-ninfer").read_text()
                 + '\n[serve.env]\nFOO = "x\\nExecStartPre=+/bin/sh"\n')
    r = cli("profile", "validate", str(f))
    assert r.code == 2 and "serve.env.FOO" in r.err and "newline" in r.err, r.err


def test_unit_exec_words_read_back_as_written():
    """What systemd would split (quotes, backslash escapes) gives back each word; % and $ are not
    specifiers or variables; a newline is refused."""
    argv = ["/usr/bin/engine", "--name", "a b", "50%", "$HOME", 'q"\\z', "{{ x }}"]
    line = writers.unit_exec(argv)
    back = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line)]
    assert back == argv
    assert "%%" in line and "$$HOME" in line
    with pytest.raises(writers.UnsafeValue, match="newline"):
        writers.unit_exec(["/bin/x", "a\nExecStartPre=+/bin/sh"])
    with pytest.raises(writers.UnsafeValue, match="prefix"):
        writers.unit_exec(["+/bin/sh"])


def test_env_file_reads_back_inert_through_a_shell(tmp_path):
    """The environment file, sourced by a real shell: each value comes back as written, nothing runs."""
    env = {"A": "$(touch pwned)", "B": '`touch pwned` "q" \\', "C": "{{ 7*7 }}"}
    f = tmp_path / "engine.env"
    f.write_text(writers.env_file(env))
    out = subprocess.run(["sh", "-c", f". {f}; printf '%s\\n' \"$A\" \"$B\" \"$C\""], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [env["A"], env["B"], env["C"]]
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(writers.UnsafeValue, match="newline"):
        writers.env_file({"A": "1\nLD_PRELOAD=/tmp/x.so"})


def test_toml_set_keeps_comments_and_writes_what_it_reads_back():
    text = config.builtin_path("dual-5090-ninfer").read_text()
    commit = "a" * 40
    new = writers.toml_set(text, ["p2p_module", "commit"], commit)
    assert tomllib.loads(new)["p2p_module"]["commit"] == commit
    assert [ln for ln in new.splitlines() if ln.startswith("#")] == [ln for ln in text.splitlines()
                                                                     if ln.startswith("#")]
    evil = 'x"\nExecStartPre=+/bin/sh\n[p2p_module]\ncommit = "0"'
    back = tomllib.loads(writers.toml_set(text, ["serve", "env", "NOTE"], evil))
    assert back["serve"]["env"]["NOTE"] == evil and back["p2p_module"] == tomllib.loads(text)["p2p_module"]


def test_json_writer_never_writes_nan():
    assert writers.json_text({"a": float("nan"), "b": [float("inf")]}, indent=None) == '{"a": null, "b": [null]}\n'


# 3. serve.host ------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["::", "0.0.0.0", "10.0.0.5", "fe80::1", "::ffff:10.0.0.1", "192.168.1.2"])
def test_any_address_that_is_not_loopback_needs_allow_public(host):
    assert "serve.host" in problems(serve__host=host)
    config.from_dict(profile_with(serve__host=host, serve__allow_public=True), "ok.toml")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "127.0.0.2", "::ffff:127.0.0.1", "localhost"])
def test_loopback_needs_nothing(host):
    assert config.from_dict(profile_with(serve__host=host), "ok.toml").serve.host == host


def test_a_name_is_judged_by_what_it_resolves_to(monkeypatch):
    monkeypatch.setattr(config.socket, "getaddrinfo", lambda h, p: [(0, 0, 0, "", ("192.0.2.7", 0))])
    assert "resolves to 192.0.2.7" in problems(serve__host="api.example")["serve.host"]


# 8. pins -----------------------------------------------------------------------------------------

def test_a_commit_prefix_is_not_a_pin():
    assert "40 hex digits" in problems(p2p_module__commit="abc1234")["p2p_module.commit"]
    assert "40 hex digits" in problems(engine__commit="abc1234")["engine.commit"]
    assert "64 lowercase hex" in problems(driver__installer_sha256="ab" * 20)["driver.installer_sha256"]
    ok = config.from_dict(profile_with(p2p_module__commit="a" * 40), "ok.toml")
    assert ok.p2p_module.commit == "a" * 40


# 9. numbers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["link__p2p_min_ratio", "link__p2p_max_latency_us", "serve__health_timeout_s",
                                 "serve__security_max_exposure"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinite_thresholds_are_refused(key, value):
    assert "finite" in problems(**{key: value})[key.replace("__", ".")]


def test_nan_in_a_flag_table_is_refused_and_ranges_hold():
    assert "finite" in problems(serve__flags__temperature=float("nan"))["serve.flags.temperature"]
    assert "at most 65535" in problems(serve__port=70000)["serve.port"]
    assert "at least 0" in problems(host__min_free_disk_gib=-1)["host.min_free_disk_gib"]


def test_nan_from_a_toml_file_is_refused(cli, tmp_path):
    f = tmp_path / "nan.toml"
    text = config.builtin_path("dual-5090-ninfer").read_text()
    f.write_text(re.sub(r"p2p_min_ratio = .*", "p2p_min_ratio = nan", text))
    r = cli("profile", "validate", str(f))
    assert r.code == 2 and "link.p2p_min_ratio: expected a finite number, got nan" in r.err, r.err


# 5. secrets (the profile side) -------------------------------------------------------------------

def test_secret_flag_is_refused_and_secret_env_is_redacted():
    d = profile_with()
    d["serve"]["flags"]["api-key"] = "sk-123456"
    with pytest.raises(ProfileError) as e:
        config.from_dict(d, "evil.toml")
    assert "looks like a secret" in dict(e.value.problems)["serve.flags.api-key"]
    p = config.from_dict(profile_with(serve__env__HF_TOKEN="hf_abcdef", serve__env__MINE="s3cr3t-value",
                                      serve__secret_env=["MINE"]), "ok.toml")
    assert secrets.redact("token hf_abcdef and s3cr3t-value") == "token <redacted> and <redacted>"
    over = config.load("dual-5090-ninfer", ["serve.env.HF_TOKEN=hf_zzzzzz", "serve.port=8001"])
    assert "hf_zzzzzz" not in " ".join(over.cli_args()) and "serve.port=8001" in over.cli_args()
    assert p.serve.env["HF_TOKEN"] == "hf_abcdef"
    assert [n for n in ("HF_TOKEN", "api-key", "DB_PASSWORD", "max-num-batched-tokens", "KEYBOARD", "MINE",
                        "long-prefill-token-threshold")
            if secrets.is_secret(n)] == ["HF_TOKEN", "api-key", "DB_PASSWORD"]
