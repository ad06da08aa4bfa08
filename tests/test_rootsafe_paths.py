"""Root safety of the paths p2pkit is given (issue 31): no path reaches a shell, one run per host,
paths stay inside their directory, and bad input is a clear error (never exit 70, never a hang)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from p2pkit.core import ansible
from tests.conftest import make_sim

# 1. no path reaches a shell -----------------------------------------------------------------------

# Each path, handed to a shell as it is, runs `touch {tmp}/Y` (as the issue found Ansible doing).
STATE_FORMS = {"$()": "{tmp}/s$(touch${{IFS}}{tmp}/Y)", ";": "{tmp}/s;touch${{IFS}}{tmp}/Y;x",
               "\n": "{tmp}/s\ntouch${{IFS}}{tmp}/Y\nx", "&": "{tmp}/s&touch${{IFS}}{tmp}/Y&x"}
ROOT_FORMS = {";": "{tmp}/h;touch${{IFS}}{tmp}/Y;x", "&": "{tmp}/h&touch${{IFS}}{tmp}/Y&x"}


def _named(ch: str) -> str:
    return "a newline (\\n)" if ch == "\n" else f"the character {ch[0]!r}"


@pytest.mark.parametrize("ch", list(STATE_FORMS))
def test_a_state_dir_holding_shell_syntax_is_refused_before_anything_acts(cli, tmp_path, monkeypatch, ch):
    root = make_sim(tmp_path / "host")
    monkeypatch.chdir(tmp_path)
    state = Path(STATE_FORMS[ch].format(tmp=tmp_path))
    r = cli("--root", str(root), "--state-dir", str(state), "--yes", "up", "--to", "driver")
    assert not (tmp_path / "Y").exists()
    assert r.code == 2 and "--state-dir" in r.err and f"holds {_named(ch)}" in r.err, r.err
    assert not state.exists() and not (root / "var/lib/p2pkit").exists()


@pytest.mark.parametrize("ch", list(ROOT_FORMS))
def test_a_root_holding_shell_syntax_is_refused_before_anything_acts(cli, tmp_path, monkeypatch, ch):
    root = Path(ROOT_FORMS[ch].format(tmp=tmp_path))  # laid out under a plain name (its profile's URLs
    root.parent.mkdir(parents=True)  # name it), moved there, the plain name left as a link to it
    make_sim(tmp_path / "host").rename(root)
    (tmp_path / "host").symlink_to(root)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    r = cli("--root", str(root), "--yes", "up", "--to", "driver")
    assert not (tmp_path / "Y").exists()
    assert r.code == 2 and "--root" in r.err and f"holds {_named(ch)}" in r.err, r.err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_profile_path_holding_shell_syntax_is_refused(cli, tmp_path):
    r = cli("--profile", str(tmp_path / "p;reboot.toml"), "profile", "validate")
    assert r.code == 2 and "--profile" in r.err and "the character ';'" in r.err, r.err


def test_a_space_in_the_state_dir_is_refused_at_the_door_not_after_the_driver_acted(cli, sim, tmp_path):
    root = sim("healthy")
    r = cli("--root", str(root), "--state-dir", str(tmp_path / "a b"), "--yes", "up", "--to", "driver")
    assert r.code == 2 and "--state-dir" in r.err and "' '" in r.err, r.err
    assert not (tmp_path / "a b").exists()


def test_ansible_temp_is_a_new_directory_of_safe_characters_and_refuses_an_unsafe_state_dir(tmp_path):
    """Behind the door too: Ansible's temporary directories are made by p2pkit, never named by the user."""
    from p2pkit.core.config import unsafe_path_char
    from p2pkit.core.errors import UsageError

    a, b = ansible.ansible_temp(tmp_path / "state"), ansible.ansible_temp(tmp_path / "state")
    assert a != b and a.is_dir() and a.parent == tmp_path / "state/.ansible/tmp"
    assert a.stat().st_mode & 0o777 == 0o700 and unsafe_path_char(str(a)) is None
    with pytest.raises(UsageError, match="the character '\\$'"):
        ansible.ansible_temp(tmp_path / "s$(touch Y)")
    assert not (tmp_path / "s$(touch Y)").exists()


@pytest.mark.slow
def test_the_playbook_runs_with_its_own_temp_directories_and_removes_them(sim, monkeypatch):
    """The driver playbook, run for real: Ansible is handed p2pkit's directory for both temps, and
    it is gone afterwards."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.driver import act as driver_act

    root = sim("healthy")
    h = Host.at(root)
    ctx = pipeline.Ctx(profile=config.load(h.sim["profile"]), host=h, store=Store(root / "var/lib/p2pkit"),
                       out=Output())
    seen = []
    real = h.runner.run

    def spy(argv, *a, **kw):
        if "ansible-playbook" in str(argv[0]):
            seen.append(dict(kw["env"]))
            assert Path(kw["env"]["ANSIBLE_LOCAL_TEMP"]).is_dir()
        return real(argv, *a, **kw)
    monkeypatch.setattr(h.runner, "run", spy)
    assert driver_act.driver(ctx)["failed"] == 0
    assert seen and seen[0]["ANSIBLE_LOCAL_TEMP"] == seen[0]["ANSIBLE_REMOTE_TEMP"]
    tmp = Path(seen[0]["ANSIBLE_LOCAL_TEMP"])
    assert tmp.parent == root / "var/lib/p2pkit/.ansible/tmp" and not tmp.exists()
    assert os.listdir(tmp.parent) == []


# 3. one run per host ------------------------------------------------------------------------------

def _held_by_an_up(root: Path, state: Path):
    """What `up` holds while it acts (pipeline.up): the host's lock and its state directory's."""
    from p2pkit.core.lock import state_lock

    return state_lock(state, root=root)


def test_two_state_directories_on_one_host_run_one_at_a_time(cli, sim, tmp_path):
    root = sim("healthy")
    with _held_by_an_up(root, tmp_path / "state-a"):
        r = cli("--root", str(root), "--state-dir", str(tmp_path / "state-b"), "--yes", "up", "--to", "preflight")
    assert r.code == 5, r.err
    assert f"another p2pkit run (pid {os.getpid()}, state directory {tmp_path / 'state-a'}) is acting on this host" \
        in r.err, r.err
    assert not (tmp_path / "state-b/preflight.json").exists()
    r = cli("--root", str(root), "--state-dir", str(tmp_path / "state-b"), "--yes", "up", "--to", "preflight")
    assert r.code == 0, r.err  # released with its holder
    from p2pkit.core.lock import host_lock_path
    assert host_lock_path(root) == root / "run/p2pkit.core.lock" and host_lock_path(root).is_file()


@pytest.mark.parametrize("args", [("serve", "restart"), ("bench", "--ab", "serve.env.NCCL_P2P_DISABLE=1")])
def test_serve_restart_and_bench_ab_are_refused_while_an_up_holds_the_host(cli, sim, tmp_path, monkeypatch, args):
    """Both change the engine's unit or restart it: refused (exit 5) before they touch it."""
    from p2pkit.host import Host

    root = sim("healthy")
    runs = []
    real = Host.at(root).runner.__class__.run
    monkeypatch.setattr(Host.at(root).runner.__class__, "run",
                        lambda self, argv, *a, **kw: (runs.append(list(argv)), real(self, argv, *a, **kw))[1])
    with _held_by_an_up(root, root / "var/lib/p2pkit"):
        r = cli("--root", str(root), *args)
    assert r.code == 5 and "is acting on this host" in r.err, r.err
    assert not [a for a in runs if "systemctl" in a[0]], runs
    with _held_by_an_up(root, tmp_path / "other-state"):  # an up with another state directory: the same
        r = cli("--root", str(root), *args)
    assert r.code == 5 and "is acting on this host" in r.err, r.err


# 4. paths stay inside -----------------------------------------------------------------------------

def _problems(**changes) -> dict[str, str]:
    from tests.test_rootsafe import problems

    return problems(**changes)


@pytest.mark.parametrize("key", ["model__source", "model__draft_source", "model__output", "engine__build_dir"])
def test_dotdot_is_refused_in_every_path_key(key):
    got = _problems(**{key: "/srv/models/../../etc"})
    name = key.replace("__", ".")
    assert name in got and "'..' component" in got[name], got


def test_a_symlinked_parent_of_model_output_leading_out_of_the_models_directory_is_refused(tmp_path):
    """model.source /srv/models/Q and model.output /srv/models/sub/m.gguf share /srv/models: `sub`
    a link to /etc is refused; the models directory itself a link to another disk is not."""
    from p2pkit.core import config
    from p2pkit.host import Host
    from p2pkit.stages.model import act as model_stage
    from tests.test_rootsafe import profile_with

    prof = config.from_dict(profile_with(model__source="/srv/models/Q", model__output="/srv/models/sub/m.gguf"),
                            "ok.toml")
    assert config.models_dir(prof) == "/srv/models"
    host = Host.at(tmp_path)
    (tmp_path / "etc").mkdir()
    (tmp_path / "srv/models").mkdir(parents=True)
    (tmp_path / "srv/models/sub").symlink_to("/etc")
    got = dict(config.escaping_paths(prof, host.realpath))
    assert "model.output" in got and "/srv/models/sub/m.gguf leads to /etc/m.gguf, outside /srv/models" \
        in got["model.output"], got
    assert model_stage.leaves_its_directory(host, prof.model.output, config.models_dir(prof))
    (tmp_path / "srv/models/sub").unlink()
    (tmp_path / "srv/models/sub").mkdir()
    assert config.escaping_paths(prof, host.realpath) == []
    (tmp_path / "data/models/sub").mkdir(parents=True)
    (tmp_path / "srv/models/sub").rmdir()
    (tmp_path / "srv/models").rmdir()
    (tmp_path / "srv/models").symlink_to("/data/models")  # the models on another disk: fine
    assert config.escaping_paths(prof, host.realpath) == []


@pytest.mark.parametrize("key", ["engine__repo", "p2p_module__repo"])
def test_a_repository_that_git_would_read_as_an_option_is_refused(key):
    got = _problems(**{key: "--upload-pack=touch"})
    name = key.replace("__", ".")
    assert name in got and "not starting with -" in got[name], got


def test_git_gets_double_dash_before_every_url():
    """Every git command line p2pkit builds from a repository value puts `--` before it; the engine role,
    whose ansible.builtin.git gives git the URL without one, refuses a repository starting with `-` before
    its first git task (and p2pkit's engine stage runs no git of its own)."""
    import re

    import yaml

    from p2pkit.core.role_defaults import COLLECTION
    from tests.conftest import REPO

    text = (REPO / "p2pkit/app/pin.py").read_text()
    calls = re.findall(r'\["git", "(?:clone|ls-remote)"[^\]]*\]', text)
    assert calls and all('"--", ' in c for c in calls), calls
    assert not re.search(r'"git", "(?:clone|fetch|checkout)"', (REPO / "p2pkit/stages/engine/act.py").read_text())
    tasks = yaml.safe_load((REPO / COLLECTION / "roles/p2pkit_engine/tasks/checkout.yml").read_text())
    refusal = next(i for i, t in enumerate(tasks) if "startswith('-')" in str(t.get("ansible.builtin.assert", "")))
    first_git = next(i for i, t in enumerate(tasks) if "ansible.builtin.git" in t)
    assert refusal < first_git and "p2pkit_engine_repo" in str(tasks[refusal])


# 6. no exit 70 on user input ----------------------------------------------------------------------

@pytest.mark.parametrize("setting,fragment", [
    ("serve.flags.max-context=1e308", "expected an integer from 0 to 16777216, got 1e+308"),
    ("serve.flags.tp=99999999999999999999", "expected an integer from 1 to 64, got 99999999999999999999"),
    ("serve.flags.tp=two", 'expected an integer from 1 to 64, got "two"'),
])
@pytest.mark.parametrize("command", [("doctor",), ("verify", "service")])
def test_a_fit_flag_out_of_range_is_a_profile_error_not_an_internal_one(cli, sim, setting, fragment, command):
    root = sim("healthy")
    r = cli("--root", str(root), "--set", setting, *command)
    assert r.code == 2 and f"serve.flags.{setting.split('.')[2].split('=')[0]}: {fragment}" in r.err, r.err


def test_fit_flags_are_checked_per_recipe():
    from p2pkit.core import config
    from p2pkit.core.errors import ProfileError
    from tests.test_rootsafe import profile_with

    for recipe, flag, bad in [("llamacpp", "ctx-size", True), ("llamacpp", "tensor-split", "0,0"),
                              ("llamacpp", "tensor-split", "a,b"), ("vllm", "gpu-memory-utilization", 1.5),
                              ("vllm", "max-model-len", 1.5), ("ninfer", "max-context", float("inf"))]:
        d = profile_with(engine__recipe=recipe)
        d["serve"]["flags"][flag] = bad
        with pytest.raises(ProfileError) as e:
            config.from_dict(d, "x.toml")
        assert f"serve.flags.{flag}" in dict(e.value.problems), (flag, bad, e.value.problems)


def test_a_profile_that_is_not_utf8_is_a_clear_error(cli, tmp_path):
    f = tmp_path / "latin1.toml"
    f.write_bytes(b'[profile]\nname = "caf\xe9"\n')
    for args in (("profile", "validate", str(f)), ("--profile", str(f), "plan"), ("--profile", str(f), "doctor")):
        r = cli(*args)
        assert r.code == 2 and "is not UTF-8 text (byte 0xe9 at offset 21)" in r.err and "iconv" in r.err, r.err


def test_a_fifo_given_as_the_profile_is_refused_without_waiting(cli, tmp_path):
    """Nothing ever writes into the FIFO: a p2pkit that opened it for reading would wait for ever."""
    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    for args in (("profile", "validate", str(fifo)), ("--profile", str(fifo), "plan")):
        r = cli(*args)
        assert r.code == 2 and "is a FIFO, not a file" in r.err, r.err
    r = cli("profile", "validate", str(tmp_path))
    assert r.code == 2 and "is a directory" in r.err, r.err


def test_a_full_disk_at_the_lock_is_a_clear_error(cli, sim, monkeypatch):
    """ENOSPC where the lock records its holder (os.pwrite, in-process): exit 2 naming the disk."""
    import errno

    from p2pkit.core import lock

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    root = sim("healthy")
    monkeypatch.setattr(lock.os, "pwrite", full)
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and "No space left on device (the disk it is on is full)" in r.err and "df -h" in r.err, r.err
    assert "internal error" not in r.err


def test_a_full_disk_at_an_artifact_write_is_a_clear_error(cli, sim, monkeypatch):
    import errno

    from p2pkit.core import safefs

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    root = sim("healthy")
    monkeypatch.setattr(safefs, "atomic_write", full)
    r = cli("--root", str(root), "--yes", "up", "--to", "preflight")
    assert r.code == 2 and "the disk it is on is full" in r.err and "internal error" not in r.err, r.err
