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


def p2pkit_file() -> str:
    import p2pkit

    return p2pkit.__file__


@pytest.mark.slow
def test_status_as_a_user_that_is_not_root_says_so_and_exits_2(cli):
    """`status` run by a user who may not run one of the host's commands (here a stand-in whose #! names an
    interpreter in a directory only root may enter; on a real host a tool with a root-only mode): no raw
    PermissionError, the stage it could not re-check says so, an error names the fix, exit 2 (as `up`
    refuses a user that is not root)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to run p2pkit as another user")
    probe = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            "import p2pkit"], capture_output=True, text=True, cwd="/")
    if probe.returncode != 0:  # a checkout under a 0700 directory (`mktemp -d`): no other user can read p2pkit
        pytest.skip(f"another user cannot import p2pkit from this checkout ({Path(p2pkit_file()).parent}): "
                    f"{probe.stderr.strip()[-200:]}; clone it where others may read it")
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


def test_shell_completion_offers_the_scenarios_of_sim_init():
    for words, cword, want in (("p2pkit sim init /tmp/x --scenario spark-h", 5, ["spark-head"]),
                               ("p2pkit sim init /tmp/x -s no-sys", 5, ["no-systemd", "no-systemd-capped-root"])):
        env = {**os.environ, "_P2PKIT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        r = subprocess.run([sys.executable, "-m", "p2pkit"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split() == want, (words, r.stdout, r.stderr)


def test_a_bad_set_value_is_blamed_on_the_set_not_on_the_profile_file(cli, sim):
    root = sim("healthy")
    r = cli("--root", str(root), "--set", "pcie.min_gen=banana", "status")
    assert r.code == 2 and 'pcie.min_gen: expected an integer, got "banana"' in r.err, r.err
    fix = r.err.split("fix: ", 1)[1]
    assert fix.startswith("the value given with --set for pcie.min_gen is what is wrong, not "
                          f"{root}/.p2pkit-sim/profile.toml: give a valid one"), fix
    assert "fix the keys named above in" not in fix
    # a problem in the file itself is still the file's, and the two together are each named where they are
    bad = root / "bad.toml"
    bad.write_text((root / ".p2pkit-sim/profile.toml").read_text().replace("min_width = 8", 'min_width = "eight"'))
    r = cli("--root", str(root), "--profile", str(bad), "--set", "pcie.min_gen=banana", "plan")
    assert r.code == 2 and f"fix: fix the keys named above: pcie.min_gen in your --set, the others in {bad}" in r.err


def test_a_mistyped_set_key_is_called_a_key_with_the_nearest_one_and_the_unset_that_drops_it(cli, sim):
    root = sim("healthy")
    r = cli("--root", str(root), "--set", "serve.portt=8080", "plan")
    assert r.code == 2 and "serve.portt: unknown key (did you mean port?)" in r.err, r.err
    fix = r.err.split("fix: ", 1)[1]
    assert fix.startswith("--set serve.portt names no key of a profile: correct the key"), fix
    assert "what is wrong" not in fix and "profile validate" not in fix  # no check that fails the same way
    assert f"p2pkit --root {root} --unset serve.portt ..." in fix, fix
    r = cli("--root", str(root), "--set", "serv.port=1", "plan")
    assert "serv: unknown section (did you mean serve?)" in r.err and "--unset serv.port ..." in r.err, r.err
    r = cli("--root", str(root), "--set", "zzz.key=1", "plan")  # nothing near: no guess
    assert "zzz: unknown section; expected one of" in r.err, r.err


def test_an_unknown_engine_flag_given_with_set_is_refused_before_up_records_it(cli, sim):
    """`up` records its --set for the host's later commands: a flag the service stage would refuse is refused
    at once (exit 2, as `profile validate` refuses it), nothing recorded, and `plan` shows no run for it."""
    root = sim("healthy")
    for cmd in ("plan", "up"):
        r = cli("--root", str(root), "--set", "serve.flags.nosuchflag=1", cmd)
        assert r.code == 2 and "serve.flags.nosuchflag: ninfer has no flag --nosuchflag" in r.err, (cmd, r.err)
        fix = r.err.split("fix: ", 1)[1]
        assert fix.startswith("correct or drop it on the command line") and "profile validate" not in fix, fix
    r = cli("--root", str(root), "--set", "serve.flags={nosuchflag=1}", "up")  # the whole table given at once
    assert r.code == 2 and "serve.flags.nosuchflag: ninfer has no flag" in r.err, r.err
    assert not (root / "var/lib/p2pkit/profile.json").exists()
    assert not (root / "var/lib/p2pkit/preflight.json").exists()  # no stage ran
    # a flag the host kept from an earlier run: the service stage's refusal names the --unset that drops it
    from p2pkit.core import config
    from p2pkit.rules import engine_cmd

    kept = config.load("dual-5090-ninfer", ("serve.flags.nosuchflag=1",))
    (known,) = [c for c in engine_cmd.validate(kept) if c.id == "service.flags_known"]
    assert known.status == "fail" and "`p2pkit --unset serve.flags.nosuchflag up` takes them out" in known.hint


def test_an_engine_flag_value_the_start_refuses_given_with_set_is_refused_before_up_records_it(cli, sim):
    """Issue 47 item 5: `--set serve.flags.tp=3 up` ran, recorded tp=3 for the host, and every later `up` failed
    at the service stage with no word of the --unset; `plan` showed a run. A value the engine's start refuses
    (where the profile without that --set passes) is refused at once, exit 2, nothing recorded; a good value
    goes through; a flag kept from an earlier run is the service stage's, whose fix names the --unset."""
    root = sim("healthy")
    for cmd in ("plan", "up"):
        r = cli("--root", str(root), "--set", "serve.flags.tp=3", cmd)
        assert r.code == 2 and "serve.flags.tp: service.tp (--tp is 1 or 2): 3 (expected 1 or 2)" in r.err, (cmd, r.err)
        fix = r.err.split("fix: ", 1)[1]
        assert fix.startswith("correct or drop it on the command line") and "nothing was run or recorded" in fix, fix
    assert not (root / "var/lib/p2pkit").exists()
    assert cli("--root", str(root), "--set", "serve.flags.tp=2", "plan").code == 0
    from p2pkit.core import config
    from p2pkit.rules import engine_cmd

    kept = config.load("dual-5090-ninfer", ("serve.flags.tp=3",))
    (tp,) = [c for c in engine_cmd.validate(kept) if c.id == "service.tp"]
    assert tp.status == "fail" and "`p2pkit --unset serve.flags.tp up` takes it out" in tp.hint, tp.hint
    (tp,) = [c for c in engine_cmd.validate(config.load("dual-5090-ninfer", ("serve.flags.tp=2",)))
             if c.id == "service.tp"]
    assert tp.status == "pass" and tp.hint == ""


def test_report_with_a_profile_that_does_not_load_takes_its_file_and_says_so(cli, sim, tmp_path):
    root = sim("healthy")
    bad = tmp_path / "mine.toml"
    bad.write_text('[driver]\nversion = 5\n[serve.env]\nHF_TOKEN = "hf_abcdef123456"\n')
    r = cli("--root", str(root), "--profile", str(bad), "--json", "report", str(tmp_path / "r.tar.gz"))
    assert r.code == 0, r.err
    doc = r.json()
    assert "profile-given.toml" in doc["members"]
    left = {x["what"]: x["why"] for x in doc["left_out"]}
    assert "the profile in force" in left and "(its file is in the archive as profile-given.toml)" in \
        left["the profile in force"], left
    import tarfile

    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        given = tar.extractfile("p2pkit-report/profile-given.toml").read().decode()
    assert given.startswith("[driver]\nversion = 5\n") and 'HF_TOKEN = "<redacted>"' in given
    assert "hf_abcdef123456" not in given


@pytest.mark.slow
def test_status_after_a_run_killed_mid_stage_says_interrupted(sim):
    import signal
    import time

    from tests.conftest import p2pkit_proc

    root = sim("healthy")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "p2pkit"), "--root", str(root), "up"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    started = root / "var/lib/p2pkit/logs/driver.vars.json"  # written just before ansible-playbook starts
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    r = p2pkit_proc("--root", str(root), "status")
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("driver"))
    assert r.returncode == 1 and row.split()[1] == "interrupted", r.stdout
    assert "a p2pkit run was killed while acting on it" in row and "not run" not in row, row
    assert f"next: run `p2pkit --root {root} up --from driver`" in r.stderr, r.stderr
    r = p2pkit_proc("--root", str(root), "up", "--to", "driver")
    assert r.returncode == 0 and "[driver] running: pinned userspace driver (was interrupted:" in r.stderr, r.stderr


@pytest.mark.slow
def test_a_forced_rebuild_that_changed_nothing_says_why_model_and_service_are_stale(cli, sim):
    """`up --from engine --to engine --force` rebuilds an engine that is up to date: the stages after it
    were proven on the earlier engine artifact. `up` says so at once and names the command; status says
    why (not a bare "chain broken"); the command, as printed, proves them again without acting."""
    import re
    import shlex

    root = sim("healthy")
    assert cli("--root", str(root), "up", "--reboot").code == 0
    r = cli("--root", str(root), "up", "--from", "engine", "--to", "engine", "--force")
    assert r.code == 0, r.err
    assert r.out.strip().endswith(f"; model and service were proven on engine's earlier artifact: `p2pkit --root "
                                  f"{root} up` proves them again"), r.out
    s = cli("--root", str(root), "status")
    model = next(ln for ln in s.out.splitlines() if ln.startswith("model"))
    assert re.search(r"chain broken: engine ran again at \S+ \S+, after this stage was proven on its earlier "
                     r"artifact \(\S+ \S+\)", model), model
    named = re.findall(r"`(p2pkit [^`]*)`", r.out)[-1]
    r = cli(*shlex.split(named)[1:])
    assert r.code == 0 and "[model] not acting: its proof holds" in r.err and \
        "[service] not acting: its proof holds" in r.err, r.err
    assert cli("--root", str(root), "status").code == 0


def test_skipped_tests_say_why_under_q(tmp_path):
    """The project's pytest settings show each skip's reason in the summary, under -q too."""
    (tmp_path / "test_one.py").write_text("import pytest\n\n\ndef test_x():\n    pytest.skip('needs a GPU here')\n")
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-c",
                        str(repo / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SKIPPED [1]" in r.stdout and "needs a GPU here" in r.stdout, r.stdout


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
