"""Root-safe by construction (issue 19): values from a profile cannot inject into the files root
reads, secrets stay in the one root-only file, numbers are finite, pins are full."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config, secrets, writers
from p2pkit.core.ansible import COLLECTION
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import ProfileError
from p2pkit.core.output import Output
from p2pkit.host import Host, system
from p2pkit.sim import lifecycle
from p2pkit.stages import get
from p2pkit.stages.service import act as service

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
    assert writers.env_value(writers.env_line("A", 'a\\b"c$d`e').partition("=")[2]) == 'a\\b"c$d`e'
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
    monkeypatch.setattr("socket.getaddrinfo", lambda h, p: [(0, 0, 0, "", ("192.0.2.7", 0))])  # config imports it late
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


# 1, 5: the service stage on a simulated host, with values that would inject if pasted -----------

@pytest.fixture
def engine_host(sim):
    roots = []

    def make(env: dict) -> pipeline.Ctx:
        root = sim("healthy")
        h = Host.at(root)
        prof = config.load(h.sim["profile"])
        prof = replace(prof, serve=replace(prof.serve, health_timeout_s=30.0, env=env))  # past validation
        lifecycle.place_engine(root, prof)
        roots.append(root)
        for k, v in env.items():
            if secrets.is_secret(k):
                secrets.register(v)
        return pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())

    yield make
    for root in roots:
        subprocess.run([str(root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=False)


@pytest.mark.slow
def test_service_files_hold_injections_inert_and_the_secret_only_in_its_0600_file(engine_host, tmp_path):
    """A [serve.env] that slipped past validation: Jinja, $(...), backquotes and % reach the real
    playbook and come back literally in the environment file (nothing ran); the token is only in
    engine.secrets.env (0600), nowhere else under the host or in any artifact or log."""
    pwned = tmp_path / "pwned"
    token = "hf_S3cretT0kenValue"
    env = {"JINJA": "{{ lookup('pipe', 'touch " + str(pwned) + "') }}", "SUBST": f"$(touch {pwned})",
           "TICKS": f"`touch {pwned}`", "PCT": "50%n", "HF_TOKEN": token}
    ctx = engine_host(env)
    doc = pipeline.run_stage(ctx, get("service"), "model")
    assert doc["status"] == "passed", [c for c in doc["checks"] if c["status"] == "fail"]
    root = ctx.host.root
    assert not pwned.exists()
    env_file = (root / "etc/p2pkit/engine.env").read_text()
    back = dict(ln.split("=", 1) for ln in env_file.splitlines() if ln and not ln.startswith("#"))
    for k in ("JINJA", "SUBST", "TICKS", "PCT"):
        assert writers.env_value(back[k]) == env[k], (k, back[k])
    got = subprocess.run(["sh", "-c", f". {root / 'etc/p2pkit/engine.env'}; printf %s \"$JINJA|$SUBST|$TICKS\""],
                         capture_output=True, text=True, check=True).stdout
    assert got == f"{env['JINJA']}|{env['SUBST']}|{env['TICKS']}" and not pwned.exists()
    secret_file = root / "etc/p2pkit/engine.secrets.env"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert f'HF_TOKEN="{token}"' in secret_file.read_text()
    holders = [str(p.relative_to(root)) for p in root.rglob("*")
               if p.is_file() and not p.is_symlink() and token.encode() in p.read_bytes()]
    assert holders == ["etc/p2pkit/engine.secrets.env"], holders
    unit = (root / "etc/systemd/system/p2pkit-engine.service").read_text()
    assert "EnvironmentFile=/etc/p2pkit/engine.secrets.env" in unit
    assert 'HF_TOKEN=' not in env_file and 'HF_TOKEN=' not in unit


def test_a_newline_that_slipped_past_validation_never_reaches_a_file(sim):
    root = sim("healthy")
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    prof = replace(prof, serve=replace(prof.serve, env={"FOO": "x\nLD_PRELOAD=/tmp/evil.so"}))
    ctx = pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())
    with pytest.raises(writers.UnsafeValue, match=r"serve\.env\.FOO holds a newline"):
        service.service_vars(ctx)


# 2. hooks and units carry no pasted paths ----------------------------------------------------------

def test_restore_hook_and_unit_quote_a_hostile_state_dir(tmp_path, monkeypatch):
    """A --state-dir with $(...), ; and %: the kernel hook (run by a real sh) calls p2pkit with exactly
    those words and runs nothing else; the restore unit's Exec= line and condition read back to the
    same path with % escaped for systemd."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from p2pkit.core.ansible import share_dir
    from p2pkit.stages.p2p_module import act as acting

    pwned = tmp_path / "pwned"  # the hook runs in tmp_path: a $(touch${IFS}pwned) that ran leaves it there
    state = tmp_path / "st$(touch${IFS}pwned)`touch${IFS}pwned`x%i"
    record = tmp_path / "argv"
    fake = tmp_path / "bin/p2pkit"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(acting, "own_executable", lambda: str(fake))
    ctx = pipeline.Ctx(profile=config.load("dual-5090-ninfer"), host=Host.at("/"), store=Store(state), out=Output())
    v = acting.restore_command_vars(ctx)
    env = Environment(loader=FileSystemLoader(share_dir() / COLLECTION / "roles/p2pkit_p2p_module/templates"),
                      undefined=StrictUndefined)
    hook = tmp_path / "zz-p2pkit"
    hook.write_text(env.get_template("p2pkit-kernel-postinst.j2").render(**v))
    subprocess.run(["sh", str(hook), "6.8.0-99-generic"], check=True, cwd=tmp_path)
    assert not pwned.exists()
    assert record.read_text().splitlines() == ["--root", "/", "--profile", "dual-5090-ninfer", "--state-dir",
                                               str(state), "--yes", "restore", "--kernel", "6.8.0-99-generic"]
    unit = env.get_template("p2pkit-restore.service.j2").render(**v)
    cond = next(ln for ln in unit.splitlines() if ln.startswith("ConditionPathExists="))
    assert cond.partition("=")[2].replace("%%", "%") == str(state) and "%%i" in cond
    exec_ = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart=")).partition("=")[2]
    words = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(exec_)]
    assert words == [str(fake), "--root", "/", "--profile", "dual-5090-ninfer", "--state-dir", str(state), "--yes",
                     "restore"]
    assert "$(" not in exec_.replace("$$(", "")  # the $ is $$: systemd never expands it
    semicolon = pipeline.Ctx(profile=ctx.profile, host=ctx.host, store=Store(tmp_path / "a;b"), out=Output())
    with pytest.raises(writers.UnsafeValue, match="';'"):
        acting.restore_command_vars(semicolon)


def test_resume_unit_escapes_its_state_dir(tmp_path):
    from p2pkit.app.reboot import render_resume_unit

    state = tmp_path / "a%b c"
    with pytest.raises(writers.UnsafeValue, match="' '"):
        render_resume_unit(config.load("dual-5090-ninfer"), state)
    unit = render_resume_unit(config.load("dual-5090-ninfer"), tmp_path / "a%b")
    assert f"ConditionPathExists={tmp_path}/a%%b" in unit and f"\"{tmp_path}/a%%b\" --yes up --reboot --resumed" in unit


# 12. model: the record before the rename ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("when", ["after the rename", "before the rename"])
def test_a_model_run_killed_at_its_rename_is_finished_by_the_next(sim, monkeypatch, when):
    """Killed right after (or right before) the rename of the converted file: the next run knows the
    output as its own (or renames the recorded partial file) and passes; it never refuses its own model."""
    import os as os_

    from p2pkit.stages.model import act as model_stage

    root = sim("healthy")
    h = Host.at(root)
    ctx = pipeline.Ctx(profile=config.load(h.sim["profile"]), host=h, store=Store(root / "var/lib/p2pkit"),
                       out=Output())
    assert pipeline.run_stage(ctx, get("engine"), "link")["status"] == "passed"
    out = str(h.path(ctx.profile.model.output))
    real = os_.replace

    def killed(src, dst, **kw):  # (os.replace itself: the atomic writes pass directory fds)
        if str(dst) == out:
            if when == "after the rename":
                real(src, dst)
            raise KeyboardInterrupt  # SIGINT/SIGKILL at that instant: nothing after it runs
        return real(src, dst, **kw)

    monkeypatch.setattr(model_stage.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_stage(ctx, get("model"), "engine")
    monkeypatch.setattr(model_stage.os, "replace", real)
    doc = pipeline.run_stage(ctx, get("model"), "engine")
    built = doc["facts"]["model_build"]
    assert doc["status"] == "passed", [c for c in doc["checks"] if c["status"] == "fail"]
    assert built["kept"] is True and ("finished_interrupted" in built) == (when == "before the rename")


# 13. restore puts the engine back -------------------------------------------------------------------

@pytest.fixture
def restore_ctx(tmp_path, monkeypatch):
    """restore's own logic with the host seams replaced: a running engine unit (systemctl calls
    recorded), a p2p-module gate that drifted, and a rebuild that is interrupted."""
    from p2pkit.app import restore as rs
    from p2pkit.rules.findings import FAIL, Check
    from p2pkit.stages.service import act as svc

    root = tmp_path / "host"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / f"etc/systemd/system/{system.ENGINE_UNIT}").write_text("[Service]\n")
    calls: list[str] = []
    state = {"active": True}
    monkeypatch.setattr(rs.system, "kernel_release", lambda h: "6.8.0-90-generic")
    monkeypatch.setattr(rs, "gate_checks", lambda ctx, t, r: {"p2p-module": [Check("m", "m", FAIL)]})
    monkeypatch.setattr(svc, "unit_alive", lambda h: state["active"])

    def systemctl(argv, **kw):
        calls.append(" ".join(argv))
        state["active"] = argv[1] == "start"

    ctx = pipeline.Ctx(profile=config.load("dual-5090-ninfer"), host=Host.at(root), store=Store(tmp_path / "st"),
                       out=Output())
    monkeypatch.setattr(ctx.host.runner, "run", systemctl)
    return rs, ctx, calls, state


def test_restore_interrupted_mid_rebuild_starts_the_engine_again(restore_ctx, monkeypatch):
    rs, ctx, calls, state = restore_ctx

    def interrupted(*a, **kw):
        assert rs.engine_mark(ctx).is_file()  # what to return to is recorded before the engine stops
        raise KeyboardInterrupt

    monkeypatch.setattr(rs.pipeline, "run_stage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rs.restore(ctx)
    stop_start = [f"systemctl stop {system.ENGINE_UNIT}", f"systemctl start {system.ENGINE_UNIT}"]
    assert calls == stop_start and state["active"]
    assert not rs.engine_mark(ctx).exists()


def test_a_restore_killed_with_the_engine_stopped_is_undone_by_the_next(restore_ctx, monkeypatch):
    """SIGKILL runs no finally: the mark stays; the next restore starts the engine before anything."""
    rs, ctx, calls, state = restore_ctx
    rs.engine_mark(ctx).parent.mkdir(parents=True)
    rs.engine_mark(ctx).write_text("stopped by a restore that was killed\n")
    state["active"] = False
    monkeypatch.setattr(rs, "gate_checks", lambda ctx, t, r: {})  # no drift this time
    _code, record = rs.restore(ctx)
    assert calls == [f"systemctl start {system.ENGINE_UNIT}"] and state["active"] and not rs.engine_mark(ctx).exists()
    assert "killed restore" in json.dumps(record["actions"])


# 9. artifacts read defensively, an immutable state directory --------------------------------------

@pytest.mark.parametrize("data,fragment", [(b"\xff\xfe{", "cannot be read"), (b"[1, 2]", "not a p2pkit model record"),
                                           (b'{"path": "/srv/x"}', "not a p2pkit model record")])
def test_a_broken_model_record_is_a_clear_error(tmp_path, data, fragment):
    from p2pkit.core.artifacts import CorruptArtifact
    from p2pkit.stages.model import act as model_stage

    rec = tmp_path / "model-output.json"
    rec.write_bytes(data)
    with pytest.raises(CorruptArtifact, match=fragment) as e:
        model_stage._record(rec)
    assert str(rec) in e.value.hint and "--from model --force" in e.value.hint


def test_an_immutable_state_directory_is_a_usage_error_naming_chattr(cli, sim):
    root = sim("healthy")
    state = root / "var/lib/p2pkit"
    state.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["chattr", "+i", str(state)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root on a file system that has it")
    try:
        r = cli("--root", str(root), "up", "--to", "preflight")
    finally:
        subprocess.run(["chattr", "-i", str(state)], check=True)
    assert r.code == 2, r.err
    assert f"chattr -i {state}" in r.err and "internal error" not in r.err


# 11. the engine's user reaches its working directory, engine and model -----------------------------

def test_the_engine_user_reaches_what_it_reads_as_the_kernel_says(tmp_path):
    """The access probe against the kernel itself: the engine's start (cd into the working directory,
    read the model, run the engine) run as the unit's user with setpriv, on a host tree. With the
    working directory root:root 0750 (what the playbook made before) both say no; owned by the user,
    both say yes."""
    import os
    import shutil
    import tempfile

    from p2pkit.host import access

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux)")
    top = Path(tempfile.mkdtemp(prefix="p2pkit-access-", dir="/tmp"))
    try:
        top.chmod(0o755)
        (top / "etc").mkdir()
        (top / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\np2pkit-engine:x:65534:65534::/:/usr/sbin/nologin\n")
        (top / "etc/group").write_text("root:x:0:\nvideo:x:44:p2pkit-engine\n")
        work, model, exe = top / "var/lib/p2pkit/engine", top / "srv/models/m.gguf", top / "opt/e/serve"
        for d in (work, model.parent, exe.parent):
            d.mkdir(parents=True)
            for up in [d, *d.parents]:
                if up == top:
                    break
                up.chmod(0o755)
        work.chmod(0o750)
        model.write_text("GGUF")
        model.chmod(0o644)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
        host = Host.at(top)
        wants = {"/var/lib/p2pkit/engine": "x", "/srv/models/m.gguf": "r", "/opt/e/serve": "x"}

        def kernel_says() -> bool:
            start = f"cd {shlex.quote(str(work))} && test -r {shlex.quote(str(model))} && {shlex.quote(str(exe))}"
            return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", start],
                                  capture_output=True).returncode == 0

        got = access.engine_reach(host, "p2pkit-engine", wants)
        assert list(got["blocked"]) == ["/var/lib/p2pkit/engine"] and "cannot be entered" in \
            got["blocked"]["/var/lib/p2pkit/engine"]
        assert kernel_says() is False
        os.chown(work, 65534, 65534)  # what the service role now does on a real host
        assert access.engine_reach(host, "p2pkit-engine", wants)["blocked"] == {}
        assert kernel_says() is True
        model.chmod(0o600)
        assert list(access.engine_reach(host, "p2pkit-engine", wants)["blocked"]) == ["/srv/models/m.gguf"]
        assert kernel_says() is False
    finally:
        shutil.rmtree(top)


def _unit_settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        k, eq, v = line.partition("=")
        if eq and not line.startswith("#"):
            out.setdefault(k, []).append(v)
    return out


@pytest.mark.slow
def test_the_rendered_unit_starts_as_its_user_and_answers_health():
    """The service stage on a simulated host whose /etc/passwd gives the unit's User= the uid of nobody,
    then the unit's own ExecStart run as that user (setpriv), entering WorkingDirectory as that user as
    systemd does, with the unit's environment files: the simulated NInfer server answers /health. The
    model made root's 0700: the same start fails reading it, and service.user_access names it with its
    fix; the working directory made root's 0750 (what the playbook left before): the start fails to
    enter it (systemd's CHDIR), named the same way."""
    import os
    import shutil
    import signal
    import tempfile
    import time
    import urllib.error
    import urllib.request

    from p2pkit.stages.service import checks as service_checks
    from tests.conftest import REPO, make_sim
    from tests.test_inventory import free_port

    nobody = 65534
    # through sh: setpriv's own exec still has root's capabilities; what sh runs has only nobody's
    drop = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups", "sh", "-c"]
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux)")
    top = Path(tempfile.mkdtemp(prefix="p2pkit-user-", dir="/tmp"))  # not under a 0700 pytest directory
    top.chmod(0o755)
    # the simulated engine (standard library only) from a copy nobody can read, wherever the checkout
    # lives (CI's may be under /root, 0700), as a real engine's own files are readable by its user
    shutil.copytree(REPO / "p2pkit", top / "src/p2pkit", ignore=shutil.ignore_patterns("__pycache__"))
    for d in (top / "src", *(top / "src").rglob("*")):
        d.chmod(0o755 if d.is_dir() else 0o644)
    load = f"import sys; sys.path.insert(0, {str(top / 'src')!r}); import p2pkit.sim.engine"
    # its interpreter must be one nobody can run (a venv's python may lead into /root)
    python = next((py for py in (sys.executable, "/usr/bin/python3") if subprocess.run(
        [*drop, 'exec "$@"', "sh", py, "-c", load], cwd="/", capture_output=True).returncode == 0), None)
    if python is None:
        shutil.rmtree(top)
        pytest.skip("no Python here that nobody can run: the simulated engine cannot run as nobody")
    root = make_sim(top / "host")
    procs: list[subprocess.Popen] = []
    try:
        (root / "etc/passwd").write_text(f"root:x:0:0::/root:/bin/sh\n{system.ENGINE_USER}:x:{nobody}:{nobody}::/:"
                                         "/usr/sbin/nologin\n")
        # the render group as Ubuntu has it (udev's system group): the role adds the user to it
        (root / "etc/group").write_text(f"root:x:0:\nvideo:x:44:{system.ENGINE_USER}\nrender:x:992:\n")
        h = Host.at(root)
        prof = config.load(h.sim["profile"])
        port = free_port()
        prof = replace(prof, serve=replace(prof.serve, port=port, health_timeout_s=30.0))
        lifecycle.place_engine(root, prof)
        exe = h.path(service.engine_cmd.binary(prof))
        exe.write_text(f"#!{python}\n# SIMULATED engine\n{load}\np2pkit.sim.engine.main()\n")
        ctx = pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())
        doc = pipeline.run_stage(ctx, get("service"), "model")
        assert doc["status"] == "passed", [c for c in doc["checks"] if c["status"] == "fail"]
        assert next(c for c in doc["checks"] if c["id"] == "service.user_access")["status"] == "pass"
        subprocess.run([str(root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=True)
        unit = _unit_settings((root / "etc/systemd/system" / system.ENGINE_UNIT).read_text())
        assert unit["User"] == [system.ENGINE_USER]
        work = root / unit["WorkingDirectory"][0].lstrip("/")
        assert work.stat().st_uid == nobody  # the playbook gave it to the user
        for left in work.iterdir():  # the stand-in systemctl ran the engine as root; systemd runs it as the user
            os.chown(left, nobody, nobody)

        def on_host(word: str) -> str:  # an absolute path that exists on the simulated host points into it
            return str(root / word.lstrip("/")) if word.startswith("/") and (root / word.lstrip("/")).exists() \
                else word

        argv = [on_host(w.replace("%%", "%").replace("$$", "$")) for w in shlex.split(unit["ExecStart"][0])]
        env = {"PATH": "/usr/bin:/bin"}
        for envf in unit["EnvironmentFile"]:  # systemd (root) reads them before it drops to User=
            f = root / envf.lstrip("-").lstrip("/")
            for ln in f.read_text().splitlines() if f.is_file() else []:
                if "=" in ln and not ln.startswith("#"):
                    k, _, v = ln.partition("=")
                    env[k] = on_host(writers.env_value(v))

        def start() -> tuple[subprocess.Popen, Path]:
            log = top / f"engine-{len(procs)}.log"
            with open(log, "wb") as fh:
                proc = subprocess.Popen([*drop, 'cd "$1" || exit 200; shift; exec "$@"', "sh", str(work), *argv],
                                        env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(proc)
            return proc, log

        def health(proc) -> int | None:
            end = time.monotonic() + 30
            while time.monotonic() < end and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        return r.status
                except urllib.error.HTTPError as e:
                    if e.code != 503:  # 503: still loading
                        return e.code
                except OSError:
                    pass
                time.sleep(0.1)
            return None

        proc, log = start()
        assert health(proc) == 200, log.read_text()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(rf"^Uid:\s+{nobody}\s", status, re.M) and os.readlink(f"/proc/{proc.pid}/cwd") == str(work)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)

        def finding() -> dict:
            [check] = service_checks._user_access(service.user_access(ctx))
            return asdict(check)

        model = root / prof.model.output.lstrip("/")
        os.chown(model, 0, 0)
        model.chmod(0o700)
        proc, log = start()
        assert health(proc) is None and proc.wait(timeout=10) != 0
        assert "cannot open artifact" in log.read_text() and "Permission denied" in log.read_text()
        got = finding()
        assert got["status"] == "fail" and f"{prof.model.output} (-rwx------ 0:0) cannot be read" in got["measured"]
        assert "give p2pkit-engine search (x) on each directory named and read on the model" in got["hint"]
        model.chmod(0o644)
        os.chown(work, 0, 0)
        work.chmod(0o750)
        proc, log = start()
        assert health(proc) is None and proc.wait(timeout=10) == 200  # systemd's status=200/CHDIR
        assert "cannot be entered" in finding()["measured"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        lifecycle.stop_services(root)
        shutil.rmtree(top)


def test_the_engine_user_must_read_the_draft_model_too(tmp_path):
    """A draft model named in serve.flags is read by the engine as well: one its user may not read is
    named among what it cannot reach."""
    tmp_path.chmod(0o755)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(f"{system.ENGINE_USER}:x:65534:65534::/:/usr/sbin/nologin\n")
    prof = config.load("dual-5090-llamacpp", ["serve.flags.model-draft=/srv/models/draft.gguf"])
    host = Host.at(tmp_path)
    for path, mode in ((prof.model.output, 0o644), ("/srv/models/draft.gguf", 0o600)):
        host.path(path).parent.mkdir(parents=True, exist_ok=True)
        host.path(path).write_text("GGUF")
        host.path(path).chmod(mode)
    ctx = pipeline.Ctx(profile=prof, host=host, store=Store(tmp_path / "var/lib/p2pkit"), out=Output())
    blocked = service.user_access(ctx)["blocked"]
    assert "/srv/models/draft.gguf" in blocked and "cannot be read" in blocked["/srv/models/draft.gguf"]
    assert prof.model.output not in blocked


# 10. playbooks set a directory's mode only when they create it -------------------------------------

@pytest.mark.slow
def test_the_driver_playbook_leaves_an_existing_directory_mode_alone(sim):
    from p2pkit.stages.driver import act as driver_act

    root = sim("healthy")
    h = Host.at(root)
    ctx = pipeline.Ctx(profile=config.load(h.sim["profile"]), host=h, store=Store(root / "var/lib/p2pkit"),
                       out=Output())
    cache = h.path(ctx.profile.driver.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o700)  # the user's choice
    assert driver_act.driver(ctx)["failed"] == 0
    assert cache.stat().st_mode & 0o777 == 0o700


# 4. profile paths stay under their directory -------------------------------------------------------

def test_a_model_output_that_is_a_symlink_leading_out_is_refused(tmp_path):
    """`..` is refused when the profile is read (above); a link planted where the model goes is
    refused before p2pkit reads or writes through it (root hashing /etc/shadow, or /dev/zero forever)."""
    from p2pkit.stages.model import act as model_stage

    host = Host.at(tmp_path)
    models = tmp_path / "srv/models"
    models.mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/shadow").write_text("root:secret\n")
    (models / "m.gguf").symlink_to("/etc/shadow")
    why = model_stage.leaves_its_directory(host, "/srv/models/m.gguf")
    assert why and "/etc/shadow" in why and "outside /srv/models" in why
    (tmp_path / "data").mkdir()
    (tmp_path / "srv/linked").symlink_to("/data")  # a models directory that is itself a link: fine
    assert model_stage.leaves_its_directory(host, "/srv/linked/m.gguf") is None
    assert model_stage.leaves_its_directory(host, "/srv/models/new.gguf") is None


def test_the_remote_install_checks_every_dependency_against_a_locked_sha256():
    """p2pkit/requirements.lock pins every runtime dependency (and theirs) with sha256s, and the
    inventory playbook installs from it in pip's hash-checking mode, nothing unpinned besides."""
    from importlib import resources

    import yaml

    from tests.conftest import REPO

    lock = (resources.files("p2pkit") / "requirements.lock").read_text()
    reqs = {}
    body = "\n".join(ln for ln in lock.splitlines() if not ln.lstrip().startswith("#"))
    for block in re.split(r"\n(?=[a-z0-9])", body):
        m = re.match(r"([a-z0-9_.-]+)==([0-9][^ ;\\]*)", block.strip())
        if m:
            reqs[m.group(1)] = re.findall(r"--hash=sha256:([0-9a-f]{64})\b", block)
    runtime = [re.match(r"[A-Za-z0-9_.-]+", d).group().lower()
               for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    assert set(runtime) <= set(reqs), set(runtime) - set(reqs)
    assert all(reqs.values()), [k for k, v in reqs.items() if not v]
    book = yaml.safe_load((REPO / "playbooks/inventory.yml").read_text())
    tasks = [t for b in book[0]["tasks"] for t in b.get("block", [b])]
    pips = [t["ansible.builtin.pip"] for t in tasks if "ansible.builtin.pip" in t]
    assert [p.get("extra_args") for p in pips] == ["--require-hashes --no-deps"] * 2, pips
    assert pips[0]["requirements"].endswith("requirements.lock") and "name" not in pips[1]
    assert pips[1]["requirements"].endswith("/p2pkit.requirement")


def _pip_dry_run(req: Path, extra_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                           *extra_args.split(), "-r", str(req)], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_remote_install_refuses_a_tampered_wheel_or_lock_entry(tmp_path):
    """The playbook's own tasks, rendered as the host gets them, run by the real pip: the controller's
    wheel with the sha256 the controller took of it installs; the same wheel changed by one byte is
    refused, and so is a lock entry whose sha256 was changed; without a wheel the install is refused."""
    import shutil

    import yaml
    from jinja2 import Environment

    from p2pkit.app import inventory
    from tests.conftest import REPO

    book = yaml.safe_load((REPO / "playbooks/inventory.yml").read_text())
    tasks = {t["name"]: t for b in book[0]["tasks"] for t in b.get("block", [b])}
    write = next(t["ansible.builtin.copy"] for n, t in tasks.items() if "requirement with its sha256" in n)
    pip = next(t["ansible.builtin.pip"] for t in tasks.values() if "ansible.builtin.pip" in t
               and t["ansible.builtin.pip"]["requirements"] == write["dest"])
    refuse = next(t for n, t in tasks.items() if n.startswith("Refuse to install p2pkit without"))
    env = Environment()
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)], check=True,
                   capture_output=True)
    wheel = next(dist.glob("p2pkit-*.whl"))
    hv = inventory.wheel_vars(wheel)
    assert env.compile_expression(refuse["when"])(**hv) is False
    assert env.compile_expression(refuse["when"])() is True and "--wheel" in refuse["ansible.builtin.fail"]["msg"]
    # on the host: the wheel copied byte for byte to p2pkit_wheel_dest, the requirement beside it
    host_wheel = tmp_path / "host/opt/p2pkit/dist" / wheel.name
    host_wheel.parent.mkdir(parents=True)
    shutil.copy(wheel, host_wheel)
    req = tmp_path / "host/opt/p2pkit/p2pkit.requirement"
    req.write_text(env.from_string(write["content"]).render(**hv, p2pkit_wheel_dest=str(host_wheel)))
    ok = _pip_dry_run(req, pip["extra_args"])
    assert ok.returncode == 0 and "Would install p2pkit" in ok.stdout, ok.stderr[-2000:]
    with open(host_wheel, "ab") as fh:  # changed on the way or on the host
        fh.write(b"\0")
    bad = _pip_dry_run(req, pip["extra_args"])
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr[-2000:]
    # a lock entry whose sha256 was changed (the smallest locked package, fetched as the host would)
    lock = (REPO / "p2pkit/requirements.lock").read_text()
    entry = re.search(r"^annotated-doc==.*?(?=^\S)", lock, re.M | re.S).group()
    first = re.search(r"sha256:([0-9a-f]{64})", entry).group(1)
    good_lock = tmp_path / "good.lock"
    good_lock.write_text(entry)
    if _pip_dry_run(good_lock, "--require-hashes --no-deps").returncode != 0:
        pytest.skip("the package index that serves the lock's files cannot be reached here")
    tampered = tmp_path / "tampered.lock"
    tampered.write_text(re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + first[::-1], entry))
    bad = _pip_dry_run(tampered, "--require-hashes --no-deps")
    assert bad.returncode != 0 and "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr[-2000:]


# 14. logs capped and rotated ---------------------------------------------------------------------

def test_playbook_logs_are_capped_rotated_and_redacted(tmp_path):
    from p2pkit.core import logfiles

    secrets.register("tok_ABCDEFGH")
    log = tmp_path / "driver.log"
    for run in range(5):
        logfiles.write(log, f"run {run} tok_ABCDEFGH\n" + "x" * (3 * logfiles.CAP), cap=logfiles.CAP)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["driver.log", "driver.log.1", "driver.log.2", "driver.log.3"]  # the oldest dropped
    assert log.read_text().startswith("run 4 <redacted>")
    assert (tmp_path / "driver.log.3").read_text().startswith("run 1")
    assert all((tmp_path / n).stat().st_size <= logfiles.CAP + 100 for n in kept)
    assert "p2pkit cut" in log.read_text() and "tok_ABCDEFGH" not in "".join((tmp_path / n).read_text() for n in kept)


def test_profile_show_redacts_a_secret(cli, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(config.builtin_path("dual-5090-ninfer").read_text() + '\n[serve.env]\nHF_TOKEN = "hf_0123456789"\n')
    for args in (["profile", "show", str(f)], ["profile", "show", "--toml", str(f)], ["--json", "profile", "show",
                                                                                        str(f)]):
        r = cli(*args)
        assert r.code == 0 and "hf_0123456789" not in r.out + r.err and "<redacted>" in r.out, (args, r.err)


@pytest.mark.parametrize("key", [*config.CONTAINED, *[f"serve.flags.{k}" for k in config.path_flags()],
                                 *config.STATE_PATHS])
def test_every_contained_path_refuses_a_symlink_leading_out(tmp_path, key):
    """Each path that belongs under a directory, planted as a link to the host's /etc: refused naming
    the key, the path and where it leads. A directory above it that is a link, or a link that stays
    inside, is fine. (Removing a key from the check fails its case here.)"""
    (tmp_path / "etc").mkdir()
    (tmp_path / "data/real").mkdir(parents=True)
    state = "/var/lib/p2pkit"
    if key in config.STATE_PATHS:
        prof, path = config.from_dict(profile_with(), "ok.toml"), f"{state}/{config.STATE_PATHS[key]}"
    else:
        *sec, name = key.split(".")
        path = f"/srv/{name}/item"
        prof = config.from_dict(profile_with(**{"__".join([*sec, name]): path}), "ok.toml")
    host = Host.at(tmp_path)
    link = host.path(path)
    link.parent.mkdir(parents=True, exist_ok=True)
    assert config.escaping_paths(prof, host.realpath, state) == []
    link.symlink_to("/etc")
    got = dict(config.escaping_paths(prof, host.realpath, state))
    under = config.models_dir(prof) if key == "model.output" else path.rpartition("/")[0]
    assert list(got) == [key] and f"{path} leads to /etc, outside {under}" in got[key], got
    link.unlink()
    link.symlink_to("real-inside")  # a link that stays in its directory
    assert config.escaping_paths(prof, host.realpath, state) == []
    link.unlink()
    parent = link.parent
    parent.rmdir()
    parent.symlink_to("/data/real")  # the directory itself elsewhere: where it leads is the directory
    # (but model.output's directory lies below the models directory it shares with model.source, /srv
    # here: a link there leading out of it is a way out, issue 31)
    got = dict(config.escaping_paths(prof, host.realpath, state))
    # a directory p2pkit makes and fills (the installer cache, the engine's checkout) is never reached through a
    # link leading out of its directory (issue 48 item 5: the campaign's link at opt/p2pkit had the engine built
    # in its target)
    assert list(got) == ([key] if key == "model.output" or key in config.MADE_DIRS else []), got
    if key in config.MADE_DIRS:
        assert f"leaves /srv through the link {path.rpartition('/')[0]} (to /data/real)" in got[key], got


def test_every_path_key_is_contained_or_left_out_for_a_reason():
    keys = {f"{sec}.{fl.name}" for sec, cls in config.SECTIONS.items() for fl in config.fields(cls)
            if fl.metadata.get("chars") == "path" or str(fl.metadata.get("pattern") or "").startswith(r"^/")
            or "(/.*)" in str(fl.metadata.get("pattern") or "")} | {"model.source"}  # a local directory
    assert keys == set(config.CONTAINED) | set(config.NOT_CONTAINED), keys ^ (set(config.CONTAINED)
                                                                            | set(config.NOT_CONTAINED))


def test_profile_validate_and_up_refuse_a_model_output_linked_out(cli, sim):
    """On a simulated host: the model's output planted as a link to /etc/shadow. `profile validate
    --root` exits 2 naming the key, the path and where it leads; `up` refuses before it writes anything."""
    root = sim("healthy")
    prof = config.load(Host.at(root).sim["profile"])
    out = Host.at(root).path(prof.model.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.symlink_to("/etc/shadow")
    r = cli("--root", str(root), "profile", "validate", prof.name)
    assert r.code == 2 and f"model.output: {prof.model.output} leads to /etc/shadow, outside " in r.err, r.err
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and "model.output" in r.err, r.err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
