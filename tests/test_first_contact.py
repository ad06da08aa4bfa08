"""What a new user and an operator hit outside the demo path (issue 17): nothing is lost and
every refusal names its fix, with its exit code."""

import os
from pathlib import Path

import pytest

from p2pkit.core import config, lock
from p2pkit.host import SIM_MARKER


def test_sim_init_force_with_a_mistyped_scenario_keeps_the_host(cli, sim):
    root = sim("healthy")
    (root / "var/lib/p2pkit").mkdir(parents=True)
    (root / "var/lib/p2pkit/keep.json").write_text("{}")
    r = cli("sim", "init", "--force", str(root), "--scenario", "helthy")
    assert r.code == 2 and "no simulated scenario named 'helthy'" in r.err
    assert (root / SIM_MARKER).is_file() and (root / "var/lib/p2pkit/keep.json").is_file()


def test_up_as_a_user_that_is_not_root_says_what_to_do(cli, monkeypatch, tmp_path):
    """As a user that is not root, the kernel refuses to make the state directory (EACCES). The
    tests run as root, so the refusal is the kernel's own error raised at that one mkdir."""
    state = tmp_path / "var/lib/p2pkit"
    real_mkdir = os.mkdir

    def mkdir(name, *a, dir_fd=None, **kw):  # safefs makes each directory with mkdirat from its parent's fd
        if os.fspath(name) in (state.name, str(state)) and not (state.exists()):
            raise PermissionError(13, "Permission denied", str(state))
        return real_mkdir(name, *a, dir_fd=dir_fd, **kw) if dir_fd is not None else real_mkdir(name, *a, **kw)
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    # the host's lock, taken first, in the test's directory: never this machine's /run
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(lock, "host_lock_path", lambda root: tmp_path / lock.HOST_LOCK)
    # --from driver: a plain `up` where nothing is recorded proves preflight first and stops there on this
    # machine without GPUs, writing nothing (issue 47 item 11; tests/test_small_things.py has that case)
    r = cli("--state-dir", str(state), "up", "--from", "driver")
    assert r.code == 2, r.err
    assert f"cannot write the state directory {state}: Permission denied (p2pkit is not running as root)" in r.err
    assert "sudo p2pkit" in r.err and "--state-dir" in r.err and "internal error" not in r.err


def test_sim_init_on_a_file_is_refused_and_the_sim_commands_take_root(cli, sim, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    r = cli("sim", "init", str(f))
    assert r.code == 2 and "is a file, not a directory" in r.err and "internal error" not in r.err, r.err
    assert f.read_text() == "mine"
    root = sim("healthy")
    r = cli("sim", "init", str(tmp_path / "new"))
    assert r.code == 0 and f"next: p2pkit --root {tmp_path / 'new'} up --reboot" in r.err, r.err
    # the directory given as every other command takes the host: --root before the command
    r = cli("--root", str(root), "sim", "stop")
    assert r.code == 0 and "no simulated service was running" in r.err, r.err
    r = cli("sim", "stop")
    assert r.code == 2 and "name the simulated host" in r.err, r.err


def test_status_says_reboot_needed_with_its_own_exit_code(cli, sim):
    """status: 1 on a host where stages are not run yet, 4 where the next stage waits for a reboot (the README's
    exit code for it), 0 once every stage is done."""
    root = sim("healthy")
    assert cli("--root", str(root), "status").code == 1  # nothing run yet
    assert cli("--root", str(root), "up", "--to", "p2p-module").code == 4
    r = cli("--root", str(root), "status")
    assert r.code == 4 and "reboot" in r.err, r.err


def test_doctor_on_a_box_without_gpus_ends_with_that_and_its_fix(cli, sim):
    """Sixteen failures follow from having no GPU; the last line says so, with the fix (issue: a new operator
    found the advice only in the first row's fix column)."""
    r = cli("--root", str(sim("no-gpu")), "doctor")
    assert r.code == 1
    last = [ln for ln in r.out.splitlines() if ln.strip()][-1]
    assert "preflight.gpu_count: 0 (expected == 2); no NVIDIA GPU was found" in last, last
    r = cli("--root", str(sim("healthy")), "doctor")
    assert "preflight.gpu_count:" not in r.out  # a box with its GPUs: no such line


def test_a_mistyped_root_is_refused(cli, sim, tmp_path):
    root = sim("healthy")
    r = cli("--root", str(root) + "x", "plan")
    assert r.code == 2 and "does not exist" in r.err and "typo" in r.err
    (tmp_path / "empty").mkdir()
    r = cli("--root", str(tmp_path / "empty"), "up")
    assert r.code == 2 and "neither a simulated host nor a host's root filesystem" in r.err
    assert cli("--root", str(root), "--json", "plan").code == 0


def test_the_gate_error_suggests_a_command_the_gate_lets_through(cli, sim, tmp_path):
    root = sim("healthy")
    state = tmp_path / "state"
    assert cli("--root", str(root), "--state-dir", str(state), "up", "--to", "preflight").code == 0
    r = cli("--root", str(root), "--state-dir", str(state), "up", "--from", "rebar", "--to", "topology")
    assert r.code == 3 and "rebar needs p2p-module to have passed; p2p-module is not run" in r.err
    fix = f"p2pkit --root {root} --state-dir {state} up --from driver --to topology"
    assert f"run `{fix}`: driver is the first stage that is not done" in r.err
    doc = cli("--root", str(root), "--state-dir", str(state), "--json", "plan").json()
    plan = {s["stage"]: s for s in doc["stages"]}
    assert plan["preflight"]["state"] == "done" and plan["driver"]["action"] == "run"  # the gate lets it through


def test_status_shows_the_stage_a_locked_run_is_acting_on(cli, sim, monkeypatch):
    """The lock message says `p2pkit status` shows progress: while a run acts on a stage (its
    artifact deleted), status names that stage as running, with the run's pid."""
    from p2pkit.app import pipeline

    root = sim("healthy")
    seen = {}
    real = pipeline.prove

    def prove(ctx, st, acted=None):  # mid-stage, as another process would look: a status in between
        seen[st.name] = cli("--root", str(root), "--json", "status").json()["stages"]
        return real(ctx, st, acted)
    monkeypatch.setattr(pipeline, "prove", prove)
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0
    first = seen["preflight"][0]
    assert first["state"] == "running" and f"(pid {os.getpid()})" in first["reason"], first
    assert seen["preflight"][1]["state"] == "not run"
    # after the run (the lock released) a marker left behind is a killed run's: that stage was interrupted
    # (issue 41; `up` runs it again, as it does a stage that was not run)
    (root / "var/lib/p2pkit/running.json").write_text('{"stage": "driver", "started": "x"}')
    driver = cli("--root", str(root), "--json", "status").json()["stages"][1]
    assert driver["state"] == "interrupted" and "killed while acting on it" in driver["reason"], driver


def test_verify_without_torch_keeps_every_other_stage_and_writes_every_report(cli, sim, tmp_path):
    """A host without torch (this one): the link stage could not run; the other stages' results,
    the JSON, the JUnit file and the Prometheus file are all still there, with exit 6 of its own."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the link stage can run")
    root = sim("healthy")
    (root / SIM_MARKER).rename(root / "not-simulated.json")  # the same tree, read as a real host
    try:
        verify_without_torch(cli, root, tmp_path)
    finally:
        (root / "not-simulated.json").rename(root / SIM_MARKER)


def verify_without_torch(cli, root, tmp_path):
    import xml.etree.ElementTree as ET

    junit, prom = tmp_path / "v.xml", tmp_path / "v.prom"
    r = cli("--root", str(root), "--json", "verify", "link", "--junit", str(junit), "--prometheus", str(prom))
    assert r.code == 6, r.err
    doc = r.json()
    assert doc["exit_code"] == 6 and doc["stages"][0]["status"] == "could-not-run"
    assert "needs torch" in doc["stages"][0]["checks"][0]["measured"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("errors") == "1" and suite.get("failures") == "0"
    assert suite.find("testcase/error") is not None
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert [(s.labels, s.value) for s in fams["p2pkit_stage_could_not_run"].samples] == \
        [({"profile": "dual-5090-ninfer", "simulated": "false", "stage": "link"}, 1)]
    r = cli("--root", str(root), "--json", "verify", "--junit", str(junit))
    stages = {s["stage"]: s["status"] for s in r.json()["stages"]}
    # rebar's P31 check reads the kernel log, which this tree read as a real host cannot give: a warning
    # that says so (could not check), never a pass and never a failure
    assert len(stages) == 9 and stages["link"] == "could-not-run" and stages["rebar"] == "warn"
    rebar = {c["id"]: c for s in r.json()["stages"] if s["stage"] == "rebar" for c in s["checks"]}
    assert all(c["status"] == "pass" for i, c in rebar.items() if i.startswith("rebar.bar1"))
    assert rebar["field.bar_assign"]["measured"].startswith("could not check")
    assert r.code == 1  # other stages failed here: a failure outranks a proof that could not run


def test_overrides_are_the_hosts_state_and_status_names_them(cli, sim, tmp_path):
    import tomllib

    root = sim("healthy")
    r = cli("--root", str(root), "--set", "host.min_free_disk_gib=10", "up", "--to", "preflight")
    assert r.code == 0, r.err

    def plan(*args):
        return cli("--root", str(root), *args, "--json", "plan").json()["stages"][0]
    assert plan()["state"] == "done"  # the recorded override is in force without repeating it
    gone = plan("--unset", "host.min_free_disk_gib")
    assert gone["state"] == "stale"
    assert gone["reason"] == ("profile changed: host (--set host.min_free_disk_gib=10 when it ran, "
                              "not overridden now)")
    other = plan("--set", "host.min_free_disk_gib=20")
    assert "--set host.min_free_disk_gib=10 when it ran, --set host.min_free_disk_gib=20 now" in other["reason"]
    assert plan()["state"] == "done"  # plan records nothing: the state still holds =10
    shown = cli("--root", str(root), "--json", "profile", "show").json()
    assert shown["overrides"] == ["host.min_free_disk_gib=10"] and shown["profile"]["host"]["min_free_disk_gib"] == 10
    toml = cli("--root", str(root), "profile", "show", "--toml").out
    exported = tmp_path / "mine.toml"
    exported.write_text(toml)
    assert "#   --set host.min_free_disk_gib=10" in toml
    assert tomllib.loads(toml)["host"]["min_free_disk_gib"] == 10
    assert cli("profile", "validate", str(exported)).code == 0


def test_doctor_judges_facts_with_the_profile_they_were_recorded_under(cli, sim, tmp_path):
    root = sim("healthy")
    facts = tmp_path / "facts.json"
    assert cli("--root", str(root), "--set", "gpus.count=3", "facts", "record", str(facts)).code == 0
    doc = cli("--json", "doctor", "--facts", str(facts)).json()
    gpu = next(c for g in doc["groups"] for c in g["checks"] if c["id"] == "preflight.gpu_count")
    assert gpu["status"] == "fail" and "3" in str(gpu["expected"]), gpu  # judged with count = 3, as recorded
    assert "(as recorded)" in doc["profile_source"]
    doc = cli("--json", "--profile", "dual-5090-ninfer", "doctor", "--facts", str(facts)).json()
    gpu = next(c for g in doc["groups"] for c in g["checks"] if c["id"] == "preflight.gpu_count")
    assert gpu["status"] == "pass"  # a profile named on the command line is the one used


def test_the_toml_writer_round_trips_every_builtin_profile_and_hostile_strings():
    import tomllib

    from p2pkit.core import config, tomlwrite

    for name in config.builtin_names():
        d = config.load(name).as_dict()
        assert tomllib.loads(tomlwrite.dumps(d)) == d, name
    odd = {"serve": {"flags": {"a.b": "x\"y\\z\n[host]\u007f\u0001é"}, "port": 1}, "profile": {"name": "n"}}
    assert tomllib.loads(tomlwrite.dumps(odd)) == odd
    assert "\n" not in tomlwrite.comment("a\nhost.require_root = false")


@pytest.mark.slow
def test_the_reboot_budget_survives_reboots_and_stops_a_reboot_loop(cli, sim):
    """A loader p2pkit cannot see boots the box, so the kernel command line update-grub writes never
    takes effect (the stage itself fails after one such reboot: tests/test_bootloaders.py): with no
    reboot left in the budget `up --reboot` stops and says why; the resume unit's run after a boot
    spends the same budget, disables the unit and says why; `status` says it too."""
    import json
    import subprocess

    from p2pkit.app.reboot import UNIT, render_resume_unit

    root = sim("other-bootloader")
    boot = (root / "proc/sys/kernel/random/boot_id").read_text().strip()
    r = cli("--root", str(root), "up", "--reboot", "--max-reboots", "0", "--to", "p2p-module")
    assert r.code == 1, r.err
    assert "reboot budget spent: p2pkit rebooted this host 0 time(s)" in r.err
    assert "a bootloader other than GRUB" in r.err and "--yes up --reboot" in r.err
    budget = json.loads((root / "var/lib/p2pkit/reboots.json").read_text())
    assert budget["limit"] == 0 and not budget["boots"] and budget["exhausted"]
    assert budget["exhausted"]["boot_id"] == boot
    assert (root / "proc/sys/kernel/random/boot_id").read_text().strip() == boot
    # the resume unit as a real host has it, enabled; its command line is the one the run below uses
    unit = render_resume_unit(config.load(json.loads((root / SIM_MARKER).read_text())["profile"]),
                              Path("/var/lib/p2pkit"))
    assert "--yes up --reboot --resumed" in unit
    (root / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/system" / UNIT).write_text(unit)
    subprocess.run(["systemctl", f"--root={root}", "enable", UNIT], check=True, capture_output=True)
    wants = root / "etc/systemd/system/multi-user.target.wants" / UNIT
    assert wants.is_symlink()
    r = cli("--root", str(root), "--yes", "up", "--reboot", "--resumed", "--to", "p2p-module")
    assert r.code == 1 and "reboot budget spent" in r.err and f"{UNIT} is disabled" in r.err
    assert not wants.is_symlink()
    assert (root / "proc/sys/kernel/random/boot_id").read_text().strip() == boot  # it did not reboot
    doc = cli("--root", str(root), "--json", "status").json()
    assert doc["reboot_budget"]["exhausted"]["why"].startswith("reboot budget spent")
    assert "reboot budget spent" in cli("--root", str(root), "status").err


def test_an_edited_artifact_is_named_by_status_the_last_stages_too(cli, sim):
    import json

    root = sim("healthy")
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0
    path = root / "var/lib/p2pkit/preflight.json"  # the last artifact: no later stage's chain covers it
    doc = json.loads(path.read_text())
    doc["checks"][0]["measured"] = "edited by hand"
    path.write_text(json.dumps(doc, indent=2))
    r = cli("--root", str(root), "--json", "status")
    first = r.json()["stages"][0]
    assert r.code == 1 and first["state"] == "stale"
    assert f"artifact {path} was edited after p2pkit wrote it" in first["reason"]
    doc.pop("digest")
    path.write_text(json.dumps(doc, indent=2))
    again = cli("--root", str(root), "--json", "status").json()["stages"][0]
    assert "the digest it carries is missing" in again["reason"]
    assert "was edited" in cli("--root", str(root), "status").out


def test_preflight_names_every_missing_tool_with_the_apt_line(cli, sim, monkeypatch):
    from p2pkit.stages.preflight import checks as preflight

    prof = config.load(None)
    c = preflight._tools({"tools": {"make": "/usr/bin/make"}}, prof)
    assert c.status == "fail"
    for tool in ("cc", "systemd-analyze", "cmake", "ninja", "pkg-config", "git", "c++"):
        assert f"{tool} (" in c.measured, tool
    assert "; make (" not in c.measured and not c.measured.startswith("missing: make")
    assert c.hint.endswith("`sudo apt-get install -y gcc systemd cmake ninja-build pkg-config git g++`")
    spark = preflight._tools({"tools": {}}, config.load("dual-spark-vllm"))
    assert "cmake" not in spark.measured and spark.measured.startswith("missing: make (")  # vLLM is not built here
    # on a host whose PATH has none of them: refused first
    root = sim("healthy")
    monkeypatch.setenv("PATH", str(Path(os.__file__).parent))  # a directory with no commands in it
    r = cli("--root", str(root), "up")
    # exit 6, the README's "a tool ... p2pkit needs is missing", where that is the only failure
    assert r.code == 6 and "preflight failed: preflight.tools: missing: make (p2p-module: make modules); cc (" in r.err
    # as root (these tests run as root): the command without sudo, which root needs not and a box may lack
    assert "`apt-get install -y make gcc systemd cmake ninja-build pkg-config git g++`" in r.err, r.err
    assert not (root / "var/lib/p2pkit/driver.json").exists()  # nothing ran


def test_a_secret_override_is_never_written_where_others_read_it(cli, sim, tmp_path):
    import json

    root = sim("healthy")
    token = "hf_s3cr3t_value"
    r = cli("--root", str(root), "--set", f"serve.env.HF_TOKEN={token}", "--set", "host.min_free_disk_gib=10",
            "up", "--to", "preflight")
    assert r.code == 0, r.err
    state = root / "var/lib/p2pkit"
    assert json.loads((state / "profile.json").read_text())["overrides"] == ["host.min_free_disk_gib=10"]
    assert token not in (state / "preflight.json").read_text()
    facts = tmp_path / "f.json"
    assert cli("--root", str(root), "--set", f"serve.env.HF_TOKEN={token}", "facts", "record", str(facts)).code == 0
    assert token not in facts.read_text() and "<redacted>" in facts.read_text()
