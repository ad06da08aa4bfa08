"""The memory-cap check against a real memory cgroup made by the test (root; v1 or v2), and
against cgroup v2 trees laid out under a test root."""

import json
import os
import subprocess
import sys

from p2pkit.facts import collect as facts
from p2pkit.host import Host

GIB = 1 << 30


def test_real_capped_cgroup_is_found(capped_cgroup):
    code = ("import json; from p2pkit.facts import collect as facts; from p2pkit.host import Host; "
            "print(json.dumps(facts.collect(Host.at('/'), ['cgroup'])))")

    def enter():
        (capped_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run([sys.executable, "-c", code], preexec_fn=enter, capture_output=True, text=True,
                         check=True).stdout
    caps = json.loads(out)["cgroup"]["memory_caps"]
    assert any(c["limit_bytes"] == GIB and str(capped_cgroup.name) in c["file"] for c in caps), caps


def test_without_a_cap_nothing_is_found(tmp_path):
    root = tmp_path
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/system.slice/p2pkit.service\n")
    d = root / "sys/fs/cgroup/system.slice/p2pkit.service"
    d.mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("memory\n")
    (d / "memory.max").write_text("max\n")
    (root / "sys/fs/cgroup/system.slice/memory.max").write_text("max\n")
    assert facts.collect(Host.at(root), ["cgroup"])["cgroup"]["memory_caps"] == []


def test_v2_cap_up_the_tree(tmp_path):
    root = tmp_path
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/user.slice/user-1000.slice/app.slice/term.scope\n")
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("memory\n")
    leaf = root / "sys/fs/cgroup/user.slice/user-1000.slice/app.slice/term.scope"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text("max\n")
    (root / "sys/fs/cgroup/user.slice/user-1000.slice/memory.max").write_text(f"{4 * GIB}\n")
    caps = facts.collect(Host.at(root), ["cgroup"])["cgroup"]["memory_caps"]
    assert [c["limit_bytes"] for c in caps] == [4 * GIB]
    assert caps[0]["file"] == "/sys/fs/cgroup/user.slice/user-1000.slice/memory.max"


def test_unreadable_proc_cgroup_is_a_finding_not_a_crash(tmp_path):
    f = facts.collect(Host.at(tmp_path), ["cgroup"])["cgroup"]
    assert "could not determine p2pkit's own cgroup" in f["error"]
