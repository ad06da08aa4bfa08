"""More than one machine: three simulated hosts run through a real Ansible inventory, one failing
at topology; the other two finish; the table and the JSON say exactly that."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pkit.app.inventory import HOST_TIMEOUT_S
from p2pkit.stages import names
from tests.conftest import REPO


def controller(tmp_path) -> tuple[str, str]:
    """The controller's state directory (where an inventory run's log goes): the test's, never the
    machine's /var/lib/p2pkit."""
    return ("--state-dir", str(tmp_path / "controller"))


@pytest.mark.slow
def test_three_hosts_one_failing_at_topology(cli, sim, tmp_path):
    roots = {"box-a": sim("healthy", "a"), "box-b": sim("healthy", "b"),
             "box-c": sim("p2p-chipset-not-supported", "c")}
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(
        f"    {h}: {{ansible_connection: local, p2pkit_root: {r}}}\n" for h, r in roots.items())
        # a per-host override from host vars: box-b's engine gets a shorter context than the profile's
        .replace(f"p2pkit_root: {roots['box-b']}}}", f"p2pkit_root: {roots['box-b']}, "
                 "p2pkit_set: {serve.flags.max-context: 4096}}"))
    r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--reboot")
    assert r.code == 1, r.err
    doc = r.json()
    hosts = doc["hosts"]
    # exactly the inventory's hosts (read from the run itself; the hosts' own stage playbooks, which
    # inherit its environment on a local host, leave nothing among them)
    assert set(hosts) == set(roots), set(hosts)
    # the results come back through p2pkit's own callback: nothing Ansible deprecates (its tree
    # callback is, since ansible-core 2.19; 2.23 removes it)
    log = Path(doc["log"]).read_text()
    assert "deprecat" not in log.lower(), [ln for ln in log.splitlines() if "eprecat" in ln]
    for h in ("box-a", "box-b"):
        assert hosts[h]["exit_code"] == 0 and all(hosts[h]["stages"][s] == "done" for s in names()), hosts[h]
    c = hosts["box-c"]
    assert c["exit_code"] == 1 and c["stages"]["topology"] == "failed" and c["stages"]["rebar"] == "done"
    assert all(c["stages"][s] == "not run" for s in ("link", "engine", "model", "service"))
    assert "topology failed: topology.p2p_read" in c["message"]
    units = {h: (roots[h] / "etc/systemd/system/p2pkit-engine.service").read_text() for h in ("box-a", "box-b")}
    assert "--max-context 4096" in units["box-b"] and "--max-context 4096" not in units["box-a"]
    for root in roots.values():  # each host keeps its own artifacts
        assert (root / "var/lib/p2pkit/preflight.json").is_file()
    assert not (roots["box-c"] / "var/lib/p2pkit/link.json").exists()
    r = cli(*controller(tmp_path), "--json", "status", "--inventory", str(inv))
    assert r.code == 1
    st = r.json()["hosts"]
    assert st["box-a"]["exit_code"] == 0 and st["box-c"]["stages"]["topology"] == "failed"
    # the lab's CI: verify every host, one JUnit file with a suite per host and stage
    junit = tmp_path / "lab.xml"
    r = cli(*controller(tmp_path), "--json", "verify", "--inventory", str(inv), "--junit", str(junit))
    assert r.code == 1
    v = r.json()["hosts"]
    assert v["box-a"]["exit_code"] == 0 and set(v["box-a"]["stages"].values()) <= {"pass", "warn"}, v["box-a"]
    assert v["box-c"]["stages"]["topology"] == "fail" and v["box-c"]["message"].startswith("topology failed:")
    import xml.etree.ElementTree as ET

    suites = {s.get("name"): s for s in ET.parse(junit).getroot()}
    assert int(suites["box-a/service"].get("failures")) == 0 and int(suites["box-b/link"].get("failures")) == 0
    fails = {c["id"] for x in v["box-c"]["results"] for c in x["checks"] if c["status"] == "fail"}
    got = {case.get("name") for name, s in suites.items() if name.startswith("box-c/") for case in s
           if case.find("failure") is not None}
    assert got == fails and "topology.p2p_read" in got


@pytest.mark.slow
def test_unreadable_inventory(cli, tmp_path):
    bad = tmp_path / "nothing.yml"
    bad.write_text("all:\n  hosts: {}\n")
    r = cli(*controller(tmp_path), "up", "--inventory", str(bad))
    assert r.code == 2 and "names no host" in r.err


SSH_TOOLS = ("/usr/sbin/sshd", "ssh", "ssh-keygen", "ssh-agent", "ssh-add")


def require_sshd() -> None:
    """Skip, naming the package, where OpenSSH's server or tools are not installed (.ci/run installs
    them; a developer's machine may lack the server)."""
    missing = [t for t in SSH_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs the OpenSSH server and tools ({', '.join(missing)} not found): install Debian's "
                    "openssh-server (`apt-get install openssh-server`; .ci/run does)")


def test_without_sshd_the_ssh_tests_skip_naming_the_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "/usr/sbin/sshd" else name)
    with pytest.raises(pytest.skip.Exception, match=r"/usr/sbin/sshd not found.*apt-get install openssh-server"):
        require_sshd()


@pytest.fixture
def sshd(tmp_path):
    """The real OpenSSH server (Debian's openssh-server) on 127.0.0.1 at a free port, a throwaway host
    key, root's logins by a user key held only by a real ssh-agent; stopped afterwards."""
    require_sshd()
    d = tmp_path / "sshd"
    d.mkdir()
    for name in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "user.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\n"
                                   f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
                                   "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
                                   "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                                   "Subsystem sftp /usr/lib/openssh/sftp-server\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    with open(d / "sshd.log", "wb") as log:
        server = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stderr=log)
    sock = d / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: sock.exists() and port_open(port), f"sshd or ssh-agent did not start: {d / 'sshd.log'}")
        subprocess.run(["ssh-add", "-q", str(d / "user")], env={"SSH_AUTH_SOCK": str(sock), "PATH": "/usr/bin:/bin"},
                       check=True)
        (d / "user").unlink()  # the key lives in the agent only
        yield {"port": port, "agent": sock, "dir": d,
               "host_key": f"[127.0.0.1]:{port} " + " ".join((d / "host.pub").read_text().split()[:2])}
    finally:
        for proc in (server, agent):
            proc.terminate()
            proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(ready, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow
def test_inventory_over_a_real_sshd(cli, sim, sshd, tmp_path, monkeypatch):
    """Two hosts through a real sshd, each with its own simulated root, p2pkit installed on them from
    the controller's wheel over ssh; the operator's environment (only SSH_AUTH_SOCK carries the key)
    and Ansible configuration are what Ansible runs with: an unknown host key is refused until the
    operator's known_hosts has it; a host whose ssh hangs is unreachable after its own timeout while
    the others finish; a host that cannot install p2pkit says why."""
    from p2pkit import __version__

    roots = {"lab-a": sim("healthy", "lab-a"), "lab-b": sim("healthy", "lab-b")}
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)], check=True)
    wheel = next(dist.glob("p2pkit-*.whl"))
    hung = socket.socket()  # accepts the TCP connection, never says the SSH banner
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    known = tmp_path / "operator/known_hosts"
    known.parent.mkdir()
    known.write_text("")
    cfg = known.parent / "ansible.cfg"  # the operator's own: p2pkit must read it, and never turn host keys off
    cfg.write_text(f"[defaults]\nremote_tmp = {tmp_path / 'remote-tmp'}\n[ssh_connection]\n"
                   f"ssh_args = -o UserKnownHostsFile={known} -o GlobalKnownHostsFile=/dev/null "
                   "-o ControlMaster=no -o IdentitiesOnly=no\n")
    for var in [v for v in os.environ if v.startswith(("SSH_", "ANSIBLE_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(sshd["agent"]))
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    ssh = (f"ansible_host: 127.0.0.1, ansible_port: {sshd['port']}, ansible_user: root, "
           "ansible_python_interpreter: /usr/bin/python3, p2pkit_host_python: /usr/bin/python3")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n" + "".join(f"    {h}: {{{ssh}, p2pkit_root: {r}}}\n" for h, r in roots.items())
                   + f"    hung: {{ansible_host: 127.0.0.1, ansible_port: {hung.getsockname()[1]}, "
                   "ansible_ssh_timeout: 3}\n"
                   f"    broken: {{ansible_connection: local, p2pkit_root: {tmp_path / 'elsewhere'}, "
                   "p2pkit_install: true, p2pkit_host_python: /nonexistent/python3}\n")
    try:
        r = cli(*controller(tmp_path), "--json", "status", "--inventory", str(inv), "--wheel", str(wheel))
        hosts = r.json()["hosts"]
        for h in roots:  # the host key is nobody's yet: refused, with ssh's reason
            assert hosts[h]["exit_code"] is None and "Host key verification failed" in hosts[h]["error"], hosts[h]
        known.write_text(sshd["host_key"] + "\n")  # the operator accepts the key
        t0 = time.monotonic()
        r = cli(*controller(tmp_path), "--json", "status", "--inventory", str(inv), "--wheel", str(wheel))
        hosts = r.json()["hosts"]
    finally:
        hung.close()
    assert r.code == 1
    for h, root in roots.items():
        assert hosts[h]["simulated"] is True and hosts[h]["stages"]["preflight"] == "not run", hosts[h]
        venv = root / "opt/p2pkit/venv/bin/p2pkit"
        out = subprocess.run([str(venv), "--version"], capture_output=True, text=True).stdout.strip()
        assert out == f"p2pkit {__version__}"
    h = hosts["hung"]
    assert h["exit_code"] is None and h["error"].startswith("unreachable: ") and "timed out" in h["error"], h
    assert hosts["broken"]["exit_code"] is None
    assert hosts["broken"]["error"].startswith("p2pkit could not be installed on the host")
    assert time.monotonic() - t0 < HOST_TIMEOUT_S["status"]
    r = cli(*controller(tmp_path), "status", "--inventory", str(inv), "--wheel", str(tmp_path / "nope.whl"))
    assert r.code == 2 and "no wheel at" in r.err


def test_p2pkit_settings_only_where_the_operator_has_none(tmp_path):
    """Ansible's own order (ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg): p2pkit's settings are added
    only for keys that config and the environment leave unset; its results callback joins the operator's;
    host key checking is never among them."""
    from p2pkit.app.inventory import P2PKIT_SETTINGS, ansible_env, operator_config

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {"HOME": str(home), "https_proxy": "http://proxy.lab:3128", "SSH_AUTH_SOCK": "/run/agent.sock"}
    assert operator_config(env, cwd) in (None, Path("/etc/ansible/ansible.cfg"))
    (home / ".ansible.cfg").write_text("[defaults]\ntimeout = 120\ncallbacks_enabled = profile_tasks\n")
    assert operator_config(env, cwd) == home / ".ansible.cfg"
    (cwd / "ansible.cfg").write_text("[defaults]\nnocolor = 0\n")
    assert operator_config(env, cwd) == cwd / "ansible.cfg"  # ./ansible.cfg before ~/.ansible.cfg
    given = tmp_path / "ops.cfg"
    given.write_text("[defaults]\ntimeout = 99\n[ssh_connection]\nssh_args = -o StrictHostKeyChecking=yes\n")
    env["ANSIBLE_CONFIG"] = str(given)
    assert operator_config(env, cwd) == given
    add = ansible_env(env, cwd, tmp_path / "tree")
    assert "ANSIBLE_TIMEOUT" not in add  # the operator's timeout = 99 stands
    assert add["ANSIBLE_RETRY_FILES_ENABLED"] == "false" and add["P2PKIT_LAST_RESULT_DIR"] == str(tmp_path / "tree")
    assert not any("HOST_KEY" in k for k in add) and all("host_key" not in k for k in P2PKIT_SETTINGS)
    env["ANSIBLE_NOCOLOR"] = "0"
    env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.profile_tasks"
    add = ansible_env(env, cwd, tmp_path / "tree")
    assert "ANSIBLE_NOCOLOR" not in add  # set in the environment: the operator's
    assert add["ANSIBLE_CALLBACKS_ENABLED"] == "ansible.posix.profile_tasks,p2pkit_last_result"
    assert not set(add) & {"https_proxy", "SSH_AUTH_SOCK", "PATH", "HOME"}  # those stay the operator's


def test_a_host_with_no_result_is_read_from_the_results_callbacks_json(tmp_path):
    from p2pkit.app.inventory import ansible_failure

    (tmp_path / "gone").write_text('{"changed": false, "msg": "Task failed: Failed to connect to the host via ssh: '
                                   'ssh: connect to host 127.0.0.1 port 1: Connection refused", "unreachable": true}')
    assert ansible_failure(tmp_path / "gone") == ("unreachable: Failed to connect to the host via ssh: ssh: connect "
                                                  "to host 127.0.0.1 port 1: Connection refused")
    (tmp_path / "slow").write_text('{"failed": true, "msg": "The task was terminated due to timeout after 5 s"}')
    assert ansible_failure(tmp_path / "slow").startswith("failed: The task was terminated due to timeout")
    assert ansible_failure(tmp_path / "none").startswith("no result came back")


def test_a_hosts_result_comes_from_the_results_callbacks_json_of_its_run_task(tmp_path):
    """No copy task brings a host's result back: the run task is its last, so the results callback's JSON
    holds rc, stdout and stderr; what the install's rescue wrote wins; a failed or unreachable
    result is no run (its failure is reported instead)."""
    import json

    from p2pkit.app.inventory import host_result

    ran = tmp_path / "ran"
    ran.write_text(json.dumps({"changed": False, "rc": 1, "stdout": "{}", "stderr": "x", "cmd": ["p2pkit"]}))
    assert host_result(tmp_path / "none.json", ran) == {"rc": 1, "stdout": "{}", "stderr": "x"}
    (tmp_path / "timed").write_text(json.dumps({"failed": True, "msg": "The task was terminated due to timeout"}))
    assert host_result(tmp_path / "none.json", tmp_path / "timed") is None
    (tmp_path / "gone").write_text(json.dumps({"unreachable": True, "msg": "ssh: connect"}))
    assert host_result(tmp_path / "none.json", tmp_path / "gone") is None
    assert host_result(tmp_path / "none.json", tmp_path / "missing") is None
    rescued = tmp_path / "h.json"
    rescued.write_text(json.dumps({"host": "h", "rc": None, "stdout": "", "stderr": "p2pkit could not be installed"}))
    assert host_result(rescued, ran)["rc"] is None


def test_an_inventory_runs_log_lives_in_the_state_directory_rotated(cli, tmp_path, monkeypatch):
    """ansible-playbook's log of an inventory run goes to <state>/logs/inventory-<action>.log (the
    earlier runs' kept as .1 ...), not into a temporary directory left behind; the run's other files
    are removed after it."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    bad = tmp_path / "nothing.yml"
    bad.write_text("all:\n  hosts: {}\n")
    logs = tmp_path / "controller/logs"
    for _run in (1, 2):
        r = cli(*controller(tmp_path), "status", "--inventory", str(bad))
        assert r.code == 2 and "names no host" in r.err
        assert "PLAY [" in (logs / "inventory-status.log").read_text()  # ansible-playbook's own output
    assert (logs / "inventory-status.log.1").is_file() and not (logs / "inventory-status.log.2").exists()
    assert list(scratch.iterdir()) == []
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "logs").write_text("")  # a state directory that cannot hold logs
    r = cli("--state-dir", str(blocked), "status", "--inventory", str(bad))
    assert r.code == 2 and "cannot write the inventory run's log" in r.err and "--state-dir" in r.err
    assert "no NVIDIA GPU" not in r.err  # the controller's own GPUs are not what an inventory run is about
