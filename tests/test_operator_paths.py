"""What an operator still tripped on (issue 41, items 13, 16 and 17), each from the operator's side: the
command as typed, the output as read, the exit code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import make_sim


@pytest.mark.slow
def test_status_as_a_user_that_is_not_root_says_so_and_exits_2(cli):
    """`status` run by a user who may not run one of the host's commands (here a stand-in whose #! names an
    interpreter in a directory only root may enter; on a real host a tool with a root-only mode): no raw
    PermissionError, the stage it could not re-check says so, an error names the fix, exit 2 (as `up`
    refuses a user that is not root)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to run p2pkit as another user")
    top = Path(tempfile.mkdtemp(prefix="p2pkit-not-root-"))
    try:
        top.chmod(0o755)
        root = make_sim(top / "host")
        assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
        private = top / "root-only"
        private.mkdir(mode=0o700)
        (private / "python").symlink_to(sys.executable)
        modinfo = root / "usr/bin/modinfo"
        modinfo.write_text(f"#!{private}/python -S\n" + modinfo.read_text().split("\n", 1)[1])
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                            "p2pkit", "--root", str(root), "status"], capture_output=True, text=True, cwd=top,
                           env={**os.environ, "HOME": str(top), "COLUMNS": "300"})
        said = r.stdout + r.stderr
        assert r.returncode == 2, said
        assert "PermissionError" not in said and "Errno" not in said and "Traceback" not in said, said
        row = next(ln for ln in r.stdout.splitlines() if ln.startswith("p2p-module"))
        assert "could not re-check: p2pkit may not run" in row and f"{modinfo}" in row, row
        assert "status could not re-check every stage: p2pkit runs as uid 65534" in r.stderr, r.stderr
        assert f"fix: run it as root: `sudo p2pkit --root {root} status`" in r.stderr, r.stderr
        s = cli("--root", str(root), "status")  # root may run it: every stage it reached is done
        assert "could not re-check" not in s.out and "p2p-module  done" in s.out, s.out
    finally:
        shutil.rmtree(top, ignore_errors=True)


# The warnings a healthy simulated host still shows, each one a real healthy host of that kind gets too.
EXPECTED_WARNINGS = {
    # a fresh Ubuntu 24.04 box translates the GPUs' DMA (the kernel's default) until the p2p-module stage puts
    # iommu=pt on its command line: preflight says so before anything changed, as it does on real hardware
    "healthy": {"preflight.iommu"},
    "systemd-boot": {"preflight.iommu"},
    "kernelstub": {"preflight.iommu"},
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["healthy", "iommu-ready", "stock-driver", "systemd-boot", "kernelstub"])
def test_a_healthy_simulated_host_shows_no_warning_but_the_ones_a_real_one_gets(cli, sim, tmp_path, scenario):
    """`up --reboot`, `status`, `doctor` and `report` on a healthy simulated host: no warning but those in
    EXPECTED_WARNINGS (each with why a real healthy host gets it too), and every fact reads (the engine's
    mappings included: /proc/PID/maps of the running engine, as the kernel shows it)."""
    import json
    import re
    import tarfile

    root = sim(scenario)
    said = ""
    for args in (("up", "--reboot"), ("status",), ("doctor",)):
        r = cli("--root", str(root), *args)
        assert r.code == 0, (args, r.err[-3000:])
        said += r.out + r.err
    warned = set(re.findall(r"\bWARN\s+(\S+?):", said)) | set(re.findall(r"warning: (.*)", said))
    assert warned == EXPECTED_WARNINGS.get(scenario, set()), warned
    rep = cli("--root", str(root), "--json", "report", str(tmp_path / "r.tar.gz")).json()
    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        inside = json.loads(tar.extractfile("p2pkit-report/report.json").read())
    # a command that did not answer in time on a loaded test machine is that machine's, not the host's
    unread = {k: v for k, v in inside["facts_not_read"].items() if "did not answer within" not in v}
    assert rep["left_out"] == [] and unread == {} and "engine_nccl" not in inside["facts_not_read"], unread
