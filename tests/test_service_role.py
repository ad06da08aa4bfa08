"""The service role is complete on its own (issue 28, item 3): `ansible-playbook -i INVENTORY
playbooks/service.yml`, without p2pkit, changes a simulated host as `p2pkit up`'s service stage does,
and a second run reports changed=0; each task decides its own change from the host. Without a
required variable it stops at its first task, naming it. p2pkit hands the role the profile's values
and reads Ansible's own result."""

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import ansible, config
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import P2pkitError
from p2pkit.core.output import Output
from p2pkit.host import Host, system
from p2pkit.sim import lifecycle
from p2pkit.stages.service import act as svc
from tests.conftest import REPO

pytestmark = pytest.mark.slow

RECAP = ansible.RECAP


def ctx_for(root: Path) -> pipeline.Ctx:
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    prof = replace(prof, serve=replace(prof.serve, health_timeout_s=30.0))
    lifecycle.place_engine(root, prof)
    return pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())


def left(root: Path) -> dict[str, str]:
    """What the role leaves on the host: each file's sha256, mode and owner; each directory's mode and owner."""
    out = {}
    for rel in ("etc/systemd/system/p2pkit.slice", f"etc/systemd/system/{system.ENGINE_UNIT}", "etc/p2pkit/engine.env",
                "etc/p2pkit/engine.secrets.env", "etc/passwd", "etc/group", "var/lib/p2pkit/engine", "etc/p2pkit"):
        p = root / rel
        st = p.stat()
        digest = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        out[rel] = f"{digest} {oct(st.st_mode & 0o7777)} {st.st_uid}:{st.st_gid}"
    return out


def by_hand(root: Path, tmp: Path, given: dict) -> subprocess.CompletedProcess:
    """ansible-playbook alone, as an operator runs the role from an inventory of their own."""
    inv = tmp / "inventory.yml"
    inv.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, **given}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "playbooks/ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible/tmp")}
    exe = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run([str(exe), "-i", str(inv), str(REPO / "playbooks/service.yml")], env=env,
                          capture_output=True, text=True, timeout=600)


def recap(out: str) -> dict:
    m = RECAP.search(out)
    assert m, out[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, m.groups())))


def test_the_role_alone_changes_the_host_as_up_does_and_then_nothing(sim, tmp_path):
    up_root, hand_root = sim("healthy", "up"), sim("healthy", "hand")
    ctx = ctx_for(up_root)
    first = svc.act(ctx)
    assert first["changed"] > 0 and svc.unit_alive(ctx.host)
    # what p2pkit handed the role (logs/service.vars.json): the profile's values, nothing predicted
    given = json.loads((ctx.store.dir / "logs/service.vars.json").read_text())
    assert not [k for k in given if k.endswith(("_files", "_todo"))] and "p2pkit_simulated" not in json.dumps(
        {k: v for k, v in given.items() if k.startswith("p2pkit_service_")})
    # the same profile values hold the same port: the first engine makes way for the second
    subprocess.run([str(up_root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=True)
    hand = ctx_for(hand_root)
    given = {k: v for k, v in given.items() if k.startswith("p2pkit_service_")}
    given |= {"p2pkit_root": str(hand_root), "p2pkit_path": hand.host.runner.path_env()}
    r = by_hand(hand_root, tmp_path, given)
    assert r.returncode == 0, r.stdout[-3000:]
    assert recap(r.stdout)["changed"] >= 4
    assert left(hand_root) == left(up_root)
    assert svc.unit_alive(hand.host)
    # the user is the host's: its /etc/passwd and /etc/group, in the video and render groups
    assert "p2pkit-engine:" in (hand_root / "etc/passwd").read_text()
    assert "render:x:992:p2pkit-engine" in (hand_root / "etc/group").read_text()
    pid = svc.main_pid(hand.host)
    again = by_hand(hand_root, tmp_path, given)
    assert again.returncode == 0 and recap(again.stdout)["changed"] == 0, again.stdout[-3000:]
    assert svc.main_pid(hand.host) == pid  # nothing it reads changed: not restarted
    subprocess.run([str(hand_root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=True)
    assert svc.act(ctx)["changed"] == 1  # through p2pkit: the stopped engine started, nothing written
    second = svc.act(ctx)
    assert second["changed"] == 0 and "log_from" not in second


def test_a_changed_file_restarts_the_running_engine_and_a_stopped_one_is_started(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    svc.act(ctx)
    env = root / "etc/p2pkit/engine.env"
    good = env.read_text()
    env.write_text(good + "EXTRA=1\n")
    pid = svc.main_pid(ctx.host)
    res = svc.act(ctx)
    assert res["changed"] == 2 and env.read_text() == good  # the file, and the restart
    assert svc.main_pid(ctx.host) not in (None, pid) and res["log_from"]
    log = (ctx.store.dir / "logs/service.log").read_text()
    assert "changed: [localhost]" in log.split("restarted when what it reads changed]", 1)[1][:200]
    subprocess.run([str(root / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], check=True)
    res = svc.act(ctx)
    assert res["changed"] == 1 and svc.unit_alive(ctx.host)


def test_without_a_required_variable_the_first_task_stops_naming_it(sim, tmp_path):
    root = sim("healthy")
    h = Host.at(root)
    r = by_hand(root, tmp_path, {"p2pkit_root": str(root), "p2pkit_path": h.runner.path_env(),
                                 "p2pkit_service_recipe": "ninfer"})
    assert r.returncode != 0
    # the first task is Ansible's check of the role's meta/argument_specs.yml
    first_task = r.stdout.split("TASK [", 2)[1]
    assert first_task.startswith("p2pkit.host.p2pkit_service : Validating arguments against arg spec 'main'"), \
        first_task
    assert "FAILED" in first_task and "missing required arguments: p2pkit_service_command, " \
                                     "p2pkit_service_listen_host, p2pkit_service_profile" in first_task
    assert r.stdout.count("TASK [") == 1  # nothing after it ran
    assert not (root / "etc/p2pkit").exists() and "p2pkit-engine" not in (root / "etc/passwd").read_text()
    # given empty, the role's own first task names them
    r = by_hand(root, tmp_path, {"p2pkit_root": str(root), "p2pkit_path": h.runner.path_env(),
                                 "p2pkit_service_recipe": "ninfer", "p2pkit_service_profile": "",
                                 "p2pkit_service_command": [], "p2pkit_service_listen_host": ""})
    second_task = r.stdout.split("TASK [", 3)[2]
    assert "FAILED" in second_task and "p2pkit_service_profile, p2pkit_service_command, " \
                                       "p2pkit_service_listen_host" in second_task
    assert r.returncode != 0 and r.stdout.count("TASK [") == 2  # nothing after it ran
    assert not (root / "etc/p2pkit").exists() and "p2pkit-engine" not in (root / "etc/passwd").read_text()


def test_a_host_without_the_render_group_fails_with_ansibles_message_and_the_fix(sim):
    root = sim("healthy")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    ctx = ctx_for(root)
    with pytest.raises(P2pkitError) as e:
        svc.act(ctx)
    assert "render are not in" in e.value.message and "groupadd --system" in e.value.message
    assert "Ensure the engine's system user exists" in e.value.message
    assert not (root / "etc/p2pkit").exists()  # nothing after the failed task ran


def test_the_roles_and_stages_branch_on_no_simulated_host():
    """The host seam: the roles and the service and engine stages never ask whether the host is
    simulated (a label that prints SIMULATED is fine); the host object and the simulator decide."""
    roles = REPO / "playbooks/collections/ansible_collections/p2pkit/host/roles"
    files = [*(roles / "p2pkit_service").rglob("*"), *(roles / "p2pkit_engine").rglob("*"),
             *(REPO / "p2pkit/stages" / n for n in ("service.py", "service_launcher.py", "engine.py", "llamacpp.py"))]
    for path in files:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            assert "p2pkit_simulated" not in line, (path, line)
            assert ".simulated" not in line or "SIMULATED" in line, (path, line)


def test_the_simulated_useradd_and_usermod_change_only_the_hosts_files(tmp_path):
    """The stand-ins as shadow's tools: a user once (exit 9 the second time), groups that exist (exit 6
    for one that does not), --append keeps the others; another tree's --root is refused."""
    from p2pkit.sim.standins import user_tool

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:992:\nkvm:x:993:\n")
    args = ["--root", str(tmp_path), "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    assert user_tool("useradd", tmp_path, [*args, "--groups", "video,nope", "eng"]) == 6
    assert "eng" not in (tmp_path / "etc/passwd").read_text()
    assert user_tool("useradd", tmp_path, [*args, "--groups", "video", "eng"]) == 0
    assert user_tool("useradd", tmp_path, [*args, "eng"]) == 9
    assert user_tool("usermod", tmp_path, ["--root", str(tmp_path), "--append", "--groups", "render", "eng"]) == 0
    groups = (tmp_path / "etc/group").read_text()
    assert "video:x:44:eng\n" in groups and "render:x:992:eng\n" in groups and "kvm:x:993:\n" in groups
    line = next(ln for ln in (tmp_path / "etc/passwd").read_text().splitlines() if ln.startswith("eng:"))
    assert line.split(":")[2:4] == [str(os.getuid()), str(os.getgid())] and line.endswith(":/usr/sbin/nologin")
    assert user_tool("usermod", tmp_path, ["--root", "/", "--append", "--groups", "kvm", "eng"]) == 1
    assert user_tool("usermod", tmp_path, ["--root", str(tmp_path), "-a", "-G", "video", "nobody"]) == 6
