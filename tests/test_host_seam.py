"""The host seam (issue 28, item 4): a host root never falls back to this machine's tools, and the
product code asks the host object its questions instead of branching on "simulated"."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest

from p2pkit.core.errors import MissingError
from p2pkit.core.runner import Runner
from p2pkit.host import Host, kmod, nvml

PRODUCT = Path(__file__).resolve().parent.parent / "p2pkit"


def this_machines_tool(tmp_path: Path, monkeypatch, name: str, prints: str) -> Path:
    """A `name` on this machine's PATH (first) that leaves a marker file when it runs: it must never run
    for a host at another root. Returns the marker's path."""
    d = tmp_path / "this-machine-bin"
    d.mkdir(exist_ok=True)
    marker = tmp_path / f"{name}-ran"
    (d / name).write_text(f"#!/bin/sh\ntouch {marker}\ncat <<'EOF'\n{prints}\nEOF\n")
    (d / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    return marker


# ------------------------------------------------------------------------ no fallback to this machine

def test_doctor_on_a_host_without_dmesg_could_not_check_and_never_runs_this_machines(cli, sim, tmp_path,
                                                                                      monkeypatch):
    """The simulated host lacks dmesg; this machine's dmesg (first on PATH) prints a BAR that could not
    be assigned, which would fail P31 if p2pkit read it. Doctor says "could not check", naming dmesg and
    the host, for every check that reads the kernel log; this machine's dmesg never ran."""
    root = sim("p2p-up")
    (root / "usr/bin/dmesg").unlink()
    marker = this_machines_tool(tmp_path, monkeypatch, "dmesg",
                                "[    2.8] pci 0000:01:00.0: BAR 1 [mem size 0x800000000 64bit pref]: can't assign; "
                                "no space")
    r = cli("--root", str(root), "--json", "doctor")
    assert r.code in (0, 1), r.err
    checks = {c["id"]: c for g in json.loads(r.out)["groups"] for c in g["checks"]}
    for id_ in ("field.bar_assign", "field.gpu_wedged.kernel_log"):
        c = checks[id_]
        assert c["status"] == "warn", c
        assert c["measured"].startswith("could not check"), c
        assert f"dmesg is not in the host at {root}" in c["measured"], c
    assert not marker.exists(), "this machine's dmesg ran in place of the host's"


def test_a_host_tree_without_modinfo_says_so_and_never_runs_this_machines(tmp_path, monkeypatch):
    """A host's root filesystem given by --root (not simulated) without modinfo: what modprobe would load
    is "modinfo is not in the host at ROOT", not this machine's module."""
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text("ID=ubuntu\nVERSION_ID=24.04\n")
    marker = this_machines_tool(tmp_path, monkeypatch, "modinfo", "filename:       /lib/modules/x/nvidia.ko")
    got = kmod.modinfo(Host.at(root), "6.8.0-88-generic")
    assert "modinfo_filename" not in got or got["modinfo_filename"] is None, got
    assert f"modinfo is not in the host at {root.resolve()}" in json.dumps(got), got
    assert not marker.exists(), "this machine's modinfo ran in place of the host's"


def test_the_runner_looks_up_a_host_roots_tools_under_it_and_only_lent_ones_here(tmp_path, monkeypatch):
    root = tmp_path / "host"
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/sbin/own-tool").write_text("#!/bin/sh\necho host\n")
    (root / "usr/sbin/own-tool").chmod(0o755)
    marker = this_machines_tool(tmp_path, monkeypatch, "dmesg", "this machine")
    this_machines_tool(tmp_path, monkeypatch, "lent-tool", "this machine")
    runner = Runner(root=root, lent=("lent-tool",))
    assert runner.which("own-tool") == str(root / "usr/sbin/own-tool")
    assert runner.which("dmesg") is None  # on this machine's PATH, not in the host, not lent
    assert runner.which("lent-tool") == str(tmp_path / "this-machine-bin/lent-tool")
    with pytest.raises(MissingError) as e:
        runner.run(["dmesg"])
    assert e.value.message.startswith(f"dmesg is not in the host at {root}"), e.value.message
    assert not marker.exists()
    assert Runner().which("dmesg") == str(tmp_path / "this-machine-bin/dmesg")  # the root /: this machine's PATH


def host_tree(tmp_path: Path) -> Path:
    """A host's root filesystem (not simulated): its os-release and its own /bin/sh, a copy of this
    machine's real shell (a link to it, as Debian's, resolved inside the tree)."""
    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text("ID=ubuntu\nVERSION_ID=24.04\n")
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy(os.path.realpath("/bin/sh"), root / "usr/bin/dash")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin/sh").symlink_to("/usr/bin/dash")  # absolute: the host's /usr/bin/dash, not this machine's
    return root


def test_a_host_trees_architecture_is_its_own_and_its_libraries_are_not_loaded_here(tmp_path):
    """The architecture of a host tree comes from its own shell's ELF header (here a copy of this
    machine's, so the same answer), never from this machine's kernel when there is none; its NVML is
    never this machine's; its GPUs are never loaded from here."""
    root = host_tree(tmp_path)
    h = Host.at(root)
    assert h.machine() == os.uname().machine
    (root / "usr/bin/dash").unlink()
    assert h.machine().startswith("unknown"), h.machine()
    assert "is not this machine" in nvml.facts(h)["error"]
    with pytest.raises(MissingError, match="is not this machine"):
        h.load_backend()
    assert Host.at("/").load_backend() is None  # the root /: this machine's own GPUs


def test_a_host_object_runs_its_commands_under_its_own_root(tmp_path):
    """Host(root=X) with the default runner: the runner is X's, never one at / (this machine's tools)."""
    assert Host(root=tmp_path).runner.root == tmp_path
    assert Host(root=tmp_path, runner=Runner(cap_s=3)).runner.cap_s == 3  # the rest of a given runner kept


def test_the_simulated_host_lends_only_its_build_tools(sim):
    """What the simulated host lends by name is its build toolchain and systemd's verifier; nothing that
    reads a host (its own stand-ins answer those)."""
    h = Host.at(sim("healthy"))
    assert "cmake" in h.runner.lent and "systemd-analyze" in h.runner.lent
    for reader in ("dmesg", "modinfo", "nvidia-smi", "lsinitramfs", "journalctl", "systemctl", "uname"):
        assert reader not in h.runner.lent
        assert h.runner.which(reader).startswith(str(h.root)), reader


# ------------------------------------------------------------------ no behaviour branch on "simulated"

SIM_ATTRS = {"simulated", "sim", "sim_fact"}
SEAM = ("host/", "sim/")  # where knowing a host is simulated belongs
LABELLERS = ("core/output.py", "cli/sim_cmd.py")  # the SIMULATED prefix on every line; the simulator's own commands


def _is_label(node: ast.Attribute, parents: dict) -> bool:
    """A use of `x.simulated` that only labels output: the value of a "simulated" key or keyword, an
    assignment to another `.simulated`, or the test of a choice between two pieces of text."""
    up = parents.get(node)
    if isinstance(up, ast.keyword) and up.arg == "simulated":
        return True
    if isinstance(up, ast.Dict):
        i = next((i for i, v in enumerate(up.values) if v is node), None)
        key = up.keys[i] if i is not None else None
        return isinstance(key, ast.Constant) and key.value == "simulated"
    if isinstance(up, ast.Assign) and up.value is node:
        return all(isinstance(t, ast.Attribute) and t.attr == "simulated" for t in up.targets)
    if isinstance(up, ast.IfExp) and up.test is node:
        return all(isinstance(b, ast.Constant | ast.JoinedStr) and (not isinstance(b, ast.Constant)
                                                                     or isinstance(b.value, str))
                   for b in (up.body, up.orelse))
    return False


def branches_on_simulated(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    return sorted(f"{name}:{n.lineno}: .{n.attr}" for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in SIM_ATTRS and isinstance(n.ctx, ast.Load)
                  and not _is_label(n, parents))


def test_no_product_code_branches_on_simulated_outside_the_host_and_the_simulator():
    bad = []
    for path in sorted(PRODUCT.rglob("*.py")):
        rel = str(path.relative_to(PRODUCT))
        if rel.startswith(SEAM) or rel in LABELLERS:
            continue
        bad += branches_on_simulated(path.read_text(), rel)
    assert bad == [], ("ask the host object (p2pkit/host) instead of branching on whether it is simulated; "
                       "only labels may read it:\n" + "\n".join(bad))


def test_the_branch_finder_finds_a_branch_and_passes_a_label():
    source = ("def f(h, out):\n    out.simulated = h.simulated\n    doc = {'simulated': h.simulated}\n"
              "    s = ' (SIMULATED)' if h.simulated else ''\n    if h.simulated:\n        return 1\n"
              "    return h.sim_fact('x') if h.simulated else None\n")
    assert branches_on_simulated(source, "f.py") == ["f.py:5: .simulated", "f.py:7: .sim_fact",
                                                     "f.py:7: .simulated"]


def test_the_host_answers_the_questions_product_code_asks(sim):
    """What a simulated host and this machine answer where product code once branched on "simulated"."""
    root = sim("healthy")
    s, real = Host.at(root), Host.at("/")
    assert (s.reboot_command(), real.reboot_command()) == (f"p2pkit sim reboot {root}", None)
    assert (s.reboots_for_real(), real.reboots_for_real()) == (False, True)
    assert (s.default_profile(), real.default_profile()) == (str(root / ".p2pkit-sim/profile.toml"), None)
    assert (s.offers_simulator(), real.offers_simulator()) == (False, True)
    assert s.is_host_root() and real.is_host_root() and "scenario healthy" in s.banner() and real.banner() is None
