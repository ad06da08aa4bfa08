"""What a fresh install gets is what the suite was run with (issue 47, item 1): cryptography 51.0.1, a
release made after p2pkit's last passing run, made ansible-core 2.19.14 print a CryptographyDeprecationWarning
at every ansible-playbook start, into every stage log. constraints.txt holds every dependency at a tested
version; the README's lines and .ci/run install with it, and these tests fail where that stopped being so."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)
# a Python warning as the warnings module prints it ("FILE:LINE: CategoryWarning: text"), and Ansible's own
# deprecation notice: either, in a stage log, is a dependency talking about itself to p2pkit's user
PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: .*$", re.M)
ANSIBLE_DEPRECATION = re.compile(r"^\[DEPRECATION WARNING\].*$", re.M)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    return {_norm(m.group(1)): m.group(2) for m in PIN.finditer(text)}


def test_pins_reads_a_constraints_line_and_a_hashed_lock_line():
    assert pins("cffi==2.1.1 ; platform_python_implementation != 'PyPy' \\\n    --hash=sha256:00\n") == \
        {"cffi": "2.1.1"}
    assert pins("# ansible-core==1.0 in a comment\nMarkupSafe==3.0.4\n") == {"markupsafe": "3.0.4"}


def test_constraints_hold_the_locks_runtime_versions():
    """The hashed lock (what a remote host installs with --require-hashes) and constraints.txt (what the
    README's install takes) say the same version for every runtime dependency."""
    lock = pins((REPO / "p2pkit/requirements.lock").read_text())
    cons = pins((REPO / "constraints.txt").read_text())
    assert lock, "the lock names no package"
    differ = {n: (v, cons.get(n)) for n, v in lock.items() if cons.get(n) != v}
    assert not differ, f"constraints.txt differs from p2pkit/requirements.lock (lock, constraints): {differ}"


def test_every_install_line_uses_the_constraints():
    """Each place that installs p2pkit from this tree for a user or for CI passes -c constraints.txt."""
    places = {"README.md": (REPO / "README.md").read_text(), ".ci/run": (REPO / ".ci/run").read_text(),
              "gpu-lab.yml": (REPO / ".github/workflows/gpu-lab.yml").read_text()}
    for name, text in places.items():
        lines = [ln for ln in text.splitlines() if re.search(r"pip install\b.*(\s\.|'\.\[|-e )", ln)
                 or re.search(r"pip install -q -c", ln)]
        assert lines, f"{name}: no install line found"
        for ln in lines:
            assert "-c constraints.txt" in ln, f"{name}: {ln.strip()!r} installs without -c constraints.txt"


def test_this_environment_is_the_constrained_one():
    """Every package constraints.txt names that is installed here has the constrained version: a suite run on
    anything else is not the tested set (reinstall with the README's line)."""
    cons = pins((REPO / "constraints.txt").read_text())
    off = {}
    for dist in metadata.distributions():
        name = _norm(dist.metadata["Name"] or "")
        if name in cons and dist.version != cons[name]:
            off[name] = (dist.version, cons[name])
    assert not off, (f"installed (found, constrained): {off}; reinstall with "
                     "`pip install -c constraints.txt 'torch==2.13.0' -e '.[test]'`")


def test_ansible_playbook_starts_without_a_dependencys_warning():
    """The ansible-playbook p2pkit runs (the one beside this interpreter) prints no Python warning and no
    deprecation as it starts: whatever it prints goes to the head of every stage log."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    if not exe.exists():
        pytest.skip("no ansible-playbook beside this interpreter")
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    said = PY_WARNING.findall(r.stdout + r.stderr) + ANSIBLE_DEPRECATION.findall(r.stdout + r.stderr)
    assert not said, said


@pytest.mark.slow
def test_no_stage_log_holds_a_dependencys_warning(cli, sim):
    """A simulated bring-up through every acting stage: no stage log carries a Python warning or an Ansible
    deprecation (the test that failed first on cryptography 51 read this only by chance, in an inventory's
    log)."""
    root = sim("healthy")
    r = cli("--root", str(root), "up", "--reboot", "--to", "engine")
    assert r.code == 0, r.err
    logs = sorted((root / "var/lib/p2pkit/logs").glob("*.log"))
    assert {p.name.split("-")[0].split(".")[0] for p in logs} >= {"driver", "p2p", "engine"}, logs
    for log in logs:
        text = log.read_text(errors="replace")
        said = PY_WARNING.findall(text) + ANSIBLE_DEPRECATION.findall(text)
        assert not said, (log.name, said)


def test_the_warning_readers_see_what_cryptography_51_printed():
    """The line ansible-core 2.19.14 printed at its start with cryptography 51.0.1 (recorded from
    `ansible-playbook --version` in a venv without the constraints, 2026-12-05) is seen."""
    seen = ("/v/lib/python3.11/site-packages/ansible/_internal/_ssh/_ssh_agent.py:18: CryptographyDeprecationWarning: "
            "DSA is deprecated and support will be removed in a future release. Use a more modern signature "
            "algorithm.\n  from cryptography.hazmat.primitives.asymmetric.dsa import (\n"
            "ansible-playbook [core 2.19.14]\n")
    assert len(PY_WARNING.findall(seen)) == 1
    assert ANSIBLE_DEPRECATION.findall("[DEPRECATION WARNING]: The tree callback plugin is deprecated.\n")
    assert not PY_WARNING.findall("ansible-playbook [core 2.19.14]\n  config file = None\n")
