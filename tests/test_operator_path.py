"""What a new operator meets, read from the operator's side (issue 41, items 1-9): the command as typed,
the output as read. The README's two set-up lines work in order on one venv; a simulated host whose
stand-ins cannot run says so whole, once, with the command that lays it out again."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from p2pkit.sim import lifecycle


def _standin_path_line(root: Path, name: str) -> str:
    return next(ln for ln in (root / "usr/bin" / name).read_text().splitlines() if ln.startswith("sys.path.append("))


def test_a_standin_finds_p2pkit_again_after_an_editable_reinstall(sim, tmp_path):
    """`pip install .` then `pip install -e .` (the README's two lines): the folder the stand-ins were laid out
    from keeps only p2pkit/_share (hatchling's editable install puts the playbooks there), which Python
    imports as a namespace package; the stand-in must still reach p2pkit through the interpreter's .pth."""
    root = sim("healthy")
    site = tmp_path / "site-packages"
    (site / "p2pkit/_share/playbooks").mkdir(parents=True)  # what `pip install -e` leaves of the wheel
    for name in ("modinfo", "dmesg"):
        f = root / "usr/bin" / name
        f.write_text(f.read_text().replace(_standin_path_line(root, name), f"sys.path.append({str(site)!r})"))
    r = subprocess.run([str(root / "usr/bin/modinfo"), "-F", "version", "nvidia"], capture_output=True, text=True,
                       cwd="/")
    assert r.returncode in (0, 1) and "no longer finds" not in r.stderr and "cannot run" not in r.stderr, r.stderr
    r = subprocess.run([str(root / "usr/bin/dmesg")], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr


def _python_without_p2pkit(tmp_path: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    return str(tmp_path / "bare/bin/python3")


def test_a_standin_that_cannot_run_stops_the_command_with_its_own_message(cli, sim, tmp_path):
    """p2pkit gone from the Python the stand-ins run on: status, up and doctor each say it once, whole
    (the stand-in's own words, the host's root, the command that lays it out again), exit 6, and
    add nothing that is not so (no 'None', no kernel.dmesg_restrict, no 'rerun as root')."""
    root = sim("gen4-slot")
    assert cli("--root", str(root), "up", "--reboot", "--to", "p2p-module").code == 0
    bare = _python_without_p2pkit(tmp_path)
    # the driver's own programs are left: the driver stage re-proves them by content (issue 48 item 3), which would
    # call the host stale before any stand-in runs
    proved = set(json.loads((root / "var/lib/p2pkit/driver-files.json").read_text()).get("files", {}))
    for f in (root / "usr/bin").iterdir():
        text = f.read_text() if f.is_file() and f"/usr/bin/{f.name}" not in proved else ""
        if text.startswith("#!") and "SIMULATED stand-in" in text:
            rest = text.split("\n", 1)[1]
            laid_out_from = _standin_path_line(root, f.name).removeprefix("sys.path.append(").removesuffix(")")
            f.write_text(f"#!{bare} -S\n" + rest.replace(laid_out_from, repr(str(tmp_path / "gone"))))
    for args in (["status"], ["up"], ["doctor"], ["--json", "status"]):
        r = cli("--root", str(root), *args)
        assert r.code == 6, (args, r.err)
        err = " ".join(r.err.split())
        assert "cannot run" in err and str(tmp_path / "gone") in err and bare in err, err
        assert f"p2pkit sim init --force {root} --scenario gen4-slot" in err, err
        for wrong in ("None", "dmesg_restrict", "rerun as root", "fix the cause named above", "internal error"):
            assert wrong not in err, (wrong, err)
        if "--json" in args:
            assert r.json()["kind"] == "p2pkit-error" and r.json()["exit_code"] == 6
    # the command it names works as printed and the host is whole again
    r = subprocess.run(["p2pkit", "sim", "init", "--force", str(root), "--scenario", "gen4-slot"], capture_output=True,
                       text=True, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0


def _readme_block(title: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text.split(f"## {title}", 1)[1]
    return re.search(r"```sh\n(.+?)\n```", section, re.S).group(1).strip()


@pytest.mark.slow
def test_the_readmes_two_lines_in_order_on_one_venv(tmp_path):
    """A new user's first minutes: the README's try-it line, then its run-the-tests line (its pip part) in the
    same clone and venv, then `status` on the host the first line made: every stage still done."""
    try_it, tests_line = _readme_block("Try it (no GPU box needed)"), _readme_block("Run the tests")
    clone, host = tmp_path / "clone", tmp_path / "p2pkit-sim"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, clone / rel)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith(str(Path(sys.executable).parent)))
    steps = [try_it.replace("/tmp/p2pkit-sim", str(host)),
             " && ".join(p for p in tests_line.split(" && ") if "pytest" not in p)]
    assert "pip install -c constraints.txt ." in steps[0] and "pip install" in steps[1] and "-e" in steps[1], steps
    try:
        for line in steps:
            r = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True)
            assert r.returncode == 0, (line, r.stdout[-3000:], r.stderr[-3000:])
        r = subprocess.run([str(clone / ".venv/bin/p2pkit"), "--root", str(host), "--json", "status"], env=env,
                           capture_output=True, text=True, cwd=tmp_path)
        doc = __import__("json").loads(r.stdout)
        assert r.returncode == 0 and doc["all_done"], [(s["stage"], s["state"], s["reason"]) for s in doc["stages"]]
    finally:
        lifecycle.stop_services(host)


# ------------------------------------------------------------------------- item 2: `sim stop` tells the truth

def _started_engine(root: Path) -> int:
    """A simulated engine unit started through the host's own systemctl stand-in (a real process)."""
    unit = root / "etc/systemd/system/p2pkit-engine.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text("[Service]\nExecStart=/bin/sleep 600\n")
    subprocess.run([str(root / "usr/bin/systemctl"), "start", "p2pkit-engine.service"], check=True)
    return lifecycle.load_state(root)["services"]["p2pkit-engine.service"]["pid"]


def _alive(pid: int) -> bool:
    from p2pkit.sim.standins import _alive as alive

    return alive(pid)


def test_sim_stop_stops_the_engine_even_when_the_hosts_systemctl_cannot(cli, sim):
    root = sim("healthy")
    pid = _started_engine(root)
    (root / "usr/bin/systemctl").write_text("#!/bin/sh\necho 'systemctl: broken' >&2\nexit 1\n")
    r = cli("--json", "sim", "stop", str(root))
    assert r.code == 0, r.err
    assert not _alive(pid)
    assert f"stopped p2pkit-engine.service (pid {pid})" in r.err
    assert r.json()["stopped"] == [f"p2pkit-engine.service (pid {pid})"]
    r = cli("sim", "stop", str(root))
    assert r.code == 0 and "no simulated service was running" in r.err


def test_a_simulated_host_whose_python_is_gone_says_so_and_lays_out_again(cli, sim, tmp_path):
    """Issue 47 item 2: the venv that laid the host out removed, `sim stop` and `sim init --force` exited 70
    (FileNotFoundError on usr/bin/systemctl: the file is there, its interpreter is not) and status blamed
    p2p-module. Now: `sim stop` stops the engine the simulator started all the same; a command on that host says its
    stand-ins cannot run, why, and the command that lays the host out again (exit 6); that command works."""
    root = sim("healthy")
    pid = _started_engine(root)
    gone = tmp_path / "gone-venv/bin/python3"
    for f in (root / "usr/bin").iterdir():
        text = f.read_text() if f.is_file() and not f.is_symlink() else ""
        if text.startswith("#!") and "SIMULATED stand-in" in text:
            f.write_text(f"#!{gone} -S\n" + text.split("\n", 1)[1])
    r = cli("sim", "stop", str(root))
    assert r.code == 0 and f"stopped p2pkit-engine.service (pid {pid})" in r.err and not _alive(pid), r.err
    for args in (["status"], ["doctor"], ["up"], ["--json", "status"]):
        r = cli("--root", str(root), *args)
        err = " ".join(r.err.split())
        assert r.code == 6 and str(gone) in err and "does not exist" in err, (args, err)
        assert f"p2pkit sim init --force {root} --scenario healthy" in err and "internal error" not in err, err
    r = cli("sim", "init", "--force", str(root))
    assert r.code == 0, r.err
    assert (root / "usr/bin/systemctl").read_text().startswith(f"#!{sys.executable} -S\n")
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0


def test_sim_stop_that_fails_says_so_and_names_what_still_runs(cli, sim, monkeypatch):
    """A process that outlives SIGTERM and SIGKILL (stuck in the kernel): `sim stop` says it could not stop
    it, with its pid and the command that ends it, exit 1; never "stopped"."""
    from p2pkit.host import launcher

    root = sim("healthy")
    pid = _started_engine(root)
    try:
        monkeypatch.setattr(launcher, "session_members", lambda sid: [sid] if sid == pid else [])
        monkeypatch.setattr("p2pkit.sim.standins.STOP_TIMEOUT_S", 0.1)
        r = cli("sim", "stop", str(root))
        assert r.code == 1, r.err
        err = " ".join(r.err.split())
        assert f"could not stop p2pkit-engine.service (pid {pid}" in err and "stopped p2pkit" not in err, err
        assert f"`kill -9 {pid}`" in err
    finally:
        monkeypatch.undo()
        lifecycle.stop_services(root)
    assert not _alive(pid)


# ------------------------------------------------------------------ item 6: bench's picture, metrics and title

def _level(shape: str, conc: int, lp: int, lo: int, decode: float) -> dict:
    st = {"median": decode, "min": decode * 0.97, "max": decode * 1.02, "n": 3}
    return {"shape": shape, "concurrency": conc, "prompt_tokens": lp, "output_tokens": lo, "requests": [{}] * 3,
            "summary": {"decode_tps": st, "prefill_tps": {**st, "median": decode * 9},
                        "ttft_ms": {**st, "median": 80.0}, "aggregate_decode_tps": decode * conc * 0.9}}


def _bench_doc(shapes: dict[str, tuple[int, int]], concs: list[int]) -> dict:
    arms = []
    for name, base in (("baseline", 100.0), ("serve.env.NCCL_P2P_DISABLE=1", 80.0)):
        lvs = [_level(s, c, lp, lo, base / c ** 0.3) for s, (lp, lo) in shapes.items() for c in concs]
        arms.append({"arm": name, "levels": lvs, "requests": lvs[0]["requests"], "summary": lvs[0]["summary"]})
    first = next(iter(shapes.values()))
    return {"engine": "llamacpp", "simulated": True, "arms": arms,
            "shape": {"prompt_tokens": first[0], "output_tokens": first[1], "warmup": 1, "requests": 3},
            "levels": [{"shape": s, "prompt_tokens": lp, "output_tokens": lo, "concurrency": c}
                       for s, (lp, lo) in shapes.items() for c in concs]}


def test_bench_prometheus_keeps_every_shape_and_concurrency():
    """`bench --shapes decode,production --concurrency 1,4 --ab ... --prometheus F`: a sample per arm, shape and
    level, labelled with them; the production figures are there."""
    from prometheus_client.parser import text_string_to_metric_families

    from p2pkit.cli import bench_cmd

    doc = _bench_doc({"decode": (128, 512), "production": (2048, 128)}, [1, 4])
    fams = {f.name: f for f in text_string_to_metric_families(bench_cmd.prometheus_text(doc))}
    dec = fams["p2pkit_bench_decode_tokens_per_second"].samples
    keys = {(s.labels["arm"], s.labels["shape"], s.labels["concurrency"]) for s in dec}
    assert len(dec) == len(keys) == 8
    prod = next(s for s in dec if s.labels["arm"] == "baseline" and s.labels["shape"] == "production"
                and s.labels["concurrency"] == "4")
    assert prod.labels["prompt_tokens"] == "2048" and prod.labels["output_tokens"] == "128"
    assert prod.value == pytest.approx(100.0 / 4 ** 0.3, rel=1e-3)
    assert len(fams["p2pkit_bench_aggregate_decode_tokens_per_second"].samples) == 8
    assert bench_cmd.title(doc).startswith("bench: llamacpp, decode prompt 128 / output 512 tokens, production "
                                           "prompt 2048 / output 128 tokens")


def test_bench_plot_with_one_concurrency_level_is_readable(tmp_path):
    """One level: the x axis is that level (one labelled category, not 0.945 to 1.050), the two arms stand
    side by side, and the legend covers no point."""
    pytest.importorskip("matplotlib")
    from p2pkit.cli import bench_cmd

    for concs in ([1], [1, 2, 4, 8]):
        doc = _bench_doc({"decode": (128, 512)}, concs)
        fig = bench_cmd.figure(doc)
        fig.canvas.draw()
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_xticklabels()] == [str(c) for c in concs]
        assert ax.get_xlim() == (-0.5, len(concs) - 0.5)
        per_stream = [line for line in ax.get_lines() if line.get_marker() == "o"]
        xs = [tuple(line.get_xdata()) for line in per_stream]
        assert len(xs) == 2 and all(a != b for a, b in zip(*xs))  # the arms never on top of each other
        legend = fig.legends[0].get_window_extent()
        assert fig.bbox.contains(legend.x0, legend.y0) and fig.bbox.contains(legend.x1, legend.y1)  # not cut
        for line in ax.get_lines():
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                px, py = ax.transData.transform((x, y))
                assert not legend.contains(px, py), (concs, x, y)
        assert ax.get_ylim()[0] == 0
    bench_cmd.plot(doc, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------- item 4: logs of a stage that keeps none; item 7: exit 2

def test_logs_of_a_stage_that_runs_no_command_says_so_and_where_its_findings_are(cli, sim):
    root = sim("healthy")
    for stage in ("preflight", "rebar", "topology"):
        r = cli("--root", str(root), "logs", stage)
        err = " ".join(r.err.split())
        assert r.code == 2 and f"{stage} keeps no log: it runs no command" in err, err
        assert f"`p2pkit --root {root} verify {stage}`" in err and "up --to" not in err  # never the circle
    r = cli("--root", str(root), "logs", "driver")
    assert r.code == 2 and "the stage has not run on this host" in r.err and "up --to driver" in r.err


@pytest.mark.parametrize("args", [["--concurrency", "1,2"], ["--reference"], ["--concurrency", "1,4", "--reference"]])
def test_bench_usage_this_engine_cannot_take_exits_2_before_anything(cli, sim, args):
    """NInfer (the default profile) runs one request at a time and llama-bench measures llama.cpp only:
    refused as usage (exit 2) on a host whose service is not even up, before the gate (3)."""
    root = sim("healthy")
    r = cli("--root", str(root), "bench", *args)
    assert r.code == 2, (r.code, r.err)
    assert "nothing was run" in r.err and not (root / "var/lib/p2pkit/bench.json").exists()
    doc = cli("--root", str(root), "--json", "bench", *args).json()
    assert doc["kind"] == "p2pkit-error" and doc["exit_code"] == 2


# ------------------------------------------------------------- item 5: every command's --json is one document

def command_paths() -> list[str]:
    """Every command the CLI has, read from the CLI itself ("up", "sim init", "serve status", ...)."""
    import typer.main

    from p2pkit.cli.app import build

    out: list[str] = []

    def walk(cmd, path: list[str]) -> None:
        if getattr(cmd, "commands", None):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            out.append(" ".join(path))
    walk(typer.main.get_command(build()), [])
    return sorted(out)


def _one_document(r) -> dict:
    """stdout is exactly one JSON document (json.loads refuses a second one, or text around it), with kind and
    schema, valid against its shipped schema."""
    from conftest import check_document

    assert r.out.strip(), f"nothing on stdout (exit {r.code}): {r.err[-500:]}"
    return check_document(r.out)


@pytest.mark.slow
def test_every_command_prints_one_valid_document_under_json(cli, sim, tmp_path):
    root = sim("healthy")
    R = ["--root", str(root)]
    other = sim("healthy", "other")  # the one sim upgrade and sim reboot change
    installer = next((other / ".p2pkit-sim/downloads").glob("NVIDIA-Linux-*.run"))
    runs = {  # each command: its arguments (on the host brought up first), in this order
        "up": [*R, "up", "--reboot"], "plan": [*R, "plan"], "status": [*R, "status"], "verify": [*R, "verify"],
        "doctor": [*R, "doctor"], "restore": [*R, "restore"], "rollback": [*R, "rollback", "p2p-module"],
        "logs": [*R, "logs", "engine"], "facts record": [*R, "facts", "record", str(tmp_path / "facts.json")],
        "report": [*R, "report", str(tmp_path / "report.tar.gz")],
        "pin": [*R, "pin", "--installer", str(installer), "--out", str(tmp_path / "pinned.toml")],
        "bench": [*R, "bench", "--requests", "1", "--warmup", "0"],
        "serve status": [*R, "serve", "status"], "serve logs": [*R, "serve", "logs"],
        "serve restart": [*R, "serve", "restart"], "serve stop": [*R, "serve", "stop"],
        "net hca": [*R, "net", "hca"], "net rail": [*R, "net", "rail"],
        "profile list": ["profile", "list"], "profile show": [*R, "profile", "show"],
        "profile validate": ["profile", "validate", "dual-5090-llamacpp"], "profile schema": ["profile", "schema"],
        "sim init": ["sim", "init", str(tmp_path / "new")], "sim list": ["sim", "list"],
        "sim upgrade": ["sim", "upgrade", str(other)], "sim reboot": ["sim", "reboot", str(other)],
        "sim stop": ["sim", "stop", str(root)],
    }
    # a new command joins this test; the container host's need root, its image and minutes: their documents
    # are held to their schema in tests/test_container_host.py, and exec prints the inner command's own
    assert sorted(runs) == [c for c in command_paths() if not c.startswith("sim container ")]
    kinds = {}
    for path, args in runs.items():
        r = cli("--json", *args)
        doc = _one_document(r)
        assert doc["kind"] != "p2pkit-error", (path, r.code, doc)
        kinds[path] = (doc["kind"], r.code)
    assert kinds["up"] == ("p2pkit-up", 0) and kinds["status"] == ("p2pkit-status", 0), kinds
    assert kinds["sim stop"][0] == "p2pkit-sim-stop" and kinds["serve restart"] == ("p2pkit-serve-restart", 0)
    # the text form of `profile show` is that document too; `--toml` under --json is one of its keys
    assert _one_document(cli("profile", "show"))["kind"] == "p2pkit-profile-show"
    doc = _one_document(cli("--json", "profile", "show", "--toml"))
    assert doc["toml"].lstrip().startswith("# p2pkit profile") and doc["profile"]["profile"]["name"]


# --------------------------------------------------- item 3: every hint runs as printed on the host it names

HINT = re.compile(r"`((?:sudo )?p2pkit [^`]*)`")


@pytest.mark.slow
def test_every_hint_printed_on_a_simulated_host_runs_there_as_printed(cli, sim, tmp_path):
    """Over every scenario (and one host with its own --state-dir), what an operator reads from doctor, plan,
    status, up, logs and serve; then each p2pkit command found between backticks, copied as printed into a
    shell in another directory: it names its host (--root, and --state-dir where not the default), runs
    there (its output says SIMULATED) and is not refused (exit 2) for want of either."""
    from p2pkit.sim import scenarios

    printed: dict[str, tuple[Path, Path | None, str]] = {}  # hint with its host made ROOT -> a host that printed it

    def read(root: Path, state: Path | None, *args: str) -> None:
        where = ["--root", str(root), *(["--state-dir", str(state)] if state else [])]
        r = cli(*where, *args)
        for h in HINT.findall(r.out + r.err):
            norm = h.replace(str(state), "STATE") if state else h
            printed.setdefault(norm.replace(str(root), "ROOT"), (root, state, h))
    for name in scenarios.SCENARIOS:
        root = sim(name)
        for args in (["doctor"], ["up", "--to", "preflight"]) + ((["--json", "doctor"], ["plan"], ["status"])
                                                                  if name == "healthy" else ()):
            read(root, None, *args)
    root = sim("healthy", "brought-up")  # a whole bring-up: its progress lines, then what a done host says
    for args in (["logs", "driver"], ["logs", "preflight"], ["up", "--from", "rebar"], ["serve", "status"],
                 ["up", "--reboot"], ["status"], ["serve", "status"], ["logs", "engine"], ["bench", "--reference"]):
        read(root, None, *args)
    own = sim("healthy", "own-state")
    for args in (["up", "--to", "driver"], ["logs", "p2p-module"], ["up", "--from", "rebar"], ["doctor"]):
        read(own, tmp_path / "state", *args)
    assert any("--state-dir" in h for _, s, h in printed.values() if s)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "COLUMNS": "200"}
    ran = []
    try:
        for norm, (root, state, hint) in sorted(printed.items()):
            words = hint.split()
            if words[:2] == ["p2pkit", "sim"] or ("--root" in words and words[words.index("--root") + 1] != str(root)):
                continue  # names another host itself (the simulated host's own `sim` command, or a new one)
            assert words[0] == "p2pkit", f"{hint!r}: sudo on a simulated host (its PATH would not find p2pkit)"
            assert f"--root {root}" in hint, f"{hint!r} printed for {root} does not name it"
            if state:
                assert f"--state-dir {state}" in hint, f"{hint!r} printed for --state-dir {state} does not name it"
            if re.search(r"\b[A-Z]{2,}\b", norm.replace("ROOT", "").replace("STATE", "")):
                continue  # a placeholder for the operator to fill (FILE, DIR): not a command as printed
            r = subprocess.run(["bash", "-c", hint], cwd=elsewhere, env=env, capture_output=True, text=True,
                               timeout=600)
            out = r.stdout + r.stderr
            ran.append(norm)
            assert r.returncode not in (2, 6, 70) and "Traceback" not in out, (hint, r.returncode, out[-1500:])
            own_log = "logs" in words and (str(root) in out or str(state) in out)  # the host's own file, as written
            assert "SIMULATED" in out or own_log, (hint, out[-800:])
    finally:
        for h in (root, own):
            lifecycle.stop_services(h)
    assert len(ran) >= 10 and any("logs engine --follow" in h for h in ran), sorted(printed)


# ------------------------------------------ item 8: an inventory's relative report paths, a file per host

@pytest.mark.slow
def test_verify_inventory_writes_relative_reports_where_the_operator_ran_one_per_host(cli, sim, tmp_path, monkeypatch):
    """`verify --inventory hosts.yml --prometheus lab.prom --junit lab.xml` from a working directory: lab.xml
    there (the controller's), and a textfile per host named for it (lab.box-a.prom, lab.box-b.prom: the two
    hosts share this machine's filesystem and overwrite nothing), each with its own host's results; nothing
    in the installed package's folders; the output says where each went."""
    from p2pkit.core.ansible import share_dir

    roots = {"box-a": sim("healthy", "a"), "box-b": sim("no-gpu", "b")}
    work = tmp_path / "work"
    work.mkdir()
    (work / "hosts.yml").write_text("all:\n  hosts:\n" + "".join(
        f"    {h}: {{ansible_connection: local, p2pkit_root: {r}}}\n" for h, r in roots.items()))
    before = {p for p in share_dir().rglob("*.prom")}
    monkeypatch.chdir(work)
    r = cli("--state-dir", str(tmp_path / "controller"), "--json", "verify", "--inventory", "hosts.yml",
            "--prometheus", "lab.prom", "--junit", "lab.xml")
    assert r.code == 1, r.err
    doc = r.json()
    want = {h: work / f"lab.{h}.prom" for h in roots}
    assert doc["prometheus"] == {h: str(p) for h, p in want.items()} and doc["junit"] == str(work / "lab.xml")
    assert (work / "lab.xml").is_file() and not (work / "lab.prom").exists()
    texts = {h: p.read_text() for h, p in want.items()}
    assert re.search(r"p2pkit_stage_ok{[^}]*stage=\"preflight\"} 1.0", texts["box-a"]), texts["box-a"][:2000]
    assert re.search(r"p2pkit_stage_ok{[^}]*stage=\"preflight\"} 0.0", texts["box-b"]), texts["box-b"][:2000]
    assert {p for p in share_dir().rglob("*.prom")} == before
    for h, p in want.items():
        assert f"Prometheus textfile of {h}: {p}" in " ".join(r.err.split())


# ----------------------------- item 9: built-in names on simulated hosts, a failed up records nothing, own profiles

def test_a_builtin_name_on_a_simulated_host_is_its_own_pinned_copy(cli, sim):
    """`--profile dual-spark-vllm` (the documented inventory's p2pkit_profile) on a simulated Spark node:
    the node's own pinned copy, so preflight's pins hold; the run says which file it is."""
    root = sim("spark-head")
    r = cli("--root", str(root), "--profile", "dual-spark-vllm", "up", "--to", "preflight")
    assert r.code == 0, r.err
    assert f"profile dual-spark-vllm ({root}/.p2pkit-sim/profile.toml)" in r.err
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0  # and without the line: the same


def test_an_up_that_stops_at_preflight_records_nothing(cli, sim):
    """A profile that cannot pass preflight here (the built-in llama.cpp one, its pins empty, on a simulated
    NInfer host): the refused run leaves the host's recorded profile as it was, so the next command without
    --profile runs with the host's own and passes."""
    root = sim("healthy")
    state = root / "var/lib/p2pkit"
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0
    before = (state / "profile.json").read_text()
    r = cli("--root", str(root), "--profile", "dual-5090-llamacpp", "up", "--to", "preflight")
    assert r.code == 1 and "preflight.pins" in r.err
    assert (state / "profile.json").read_text() == before
    assert cli("--root", str(root), "up", "--to", "preflight").code == 0
    fresh = sim("healthy", "fresh")  # no record before: none after
    assert cli("--root", str(fresh), "--profile", "dual-5090-llamacpp", "up", "--to", "preflight").code == 1
    assert not (fresh / "var/lib/p2pkit/profile.json").exists()


def test_up_pin_with_a_users_own_profile_takes_the_simulated_hosts_own_sources(cli, sim, tmp_path, monkeypatch):
    """A profile of the user's own (`profile show dual-5090-ninfer --toml`: NVIDIA's URL, GitHub's fork) on a
    simulated host: `up --pin` fetches nothing (exit 2) and names the host's own downloads and repositories
    in a command that runs as printed; a profile whose engine the host has no source for says where to start."""
    from p2pkit.app import pin as pin_mod

    root = sim("healthy")
    mine = tmp_path / "mine.toml"
    mine.write_text(cli("--root", str(root), "profile", "show", "dual-5090-ninfer", "--toml").out)
    assert "https://" in mine.read_text()
    fetched = []
    monkeypatch.setattr(pin_mod, "installer_pin", lambda *a: fetched.append(a) or {})
    monkeypatch.setattr(pin_mod, "remote_commit", lambda *a: fetched.append(a) or {})
    r = cli("--root", str(root), "--profile", str(mine), "up", "--pin")
    assert r.code == 2 and not fetched, r.err
    err = " ".join(r.err.split())
    own = root / ".p2pkit-sim"
    for src in (f"file://{own}/downloads/NVIDIA-Linux-x86_64-615.71.09.run", f"file://{own}/git/ninfer.git",
                f"file://{own}/git/open-gpu-kernel-modules.git"):
        assert src in err, (src, err)
    assert "nothing was fetched or written" in err and not (root / "var/lib/p2pkit/preflight.json").exists()
    # preflight's other way, `pin` with the profile's own URL and remote (its hint names them): refused alike
    url = "https://us.download.nvidia.com/XFree86/Linux-x86_64/615.71.09/NVIDIA-Linux-x86_64-615.71.09.run"
    p = cli("--root", str(root), "--profile", str(mine), "pin", "--installer", url, "--fork-remote", "--yes")
    assert p.code == 2 and not fetched and HINT.findall(p.err)[-1] == HINT.findall(r.err)[-1], p.err
    monkeypatch.undo()
    hint = HINT.findall(r.err)[-1]
    assert hint.startswith(f"p2pkit --root {root} --profile {mine} --set driver.installer_url=file://"), hint
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", hint.replace("up --pin", "up --pin --to preflight")], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pinned driver.installer_sha256" in done.stderr and "https://" not in done.stderr
    # the llama.cpp profile (its engine archive pinned by sha256): the host's installer and fork, nothing else
    other = tmp_path / "llama.toml"
    other.write_text(cli("--root", str(root), "profile", "show", "dual-5090-llamacpp", "--toml").out)
    r = cli("--root", str(root), "--profile", str(other), "up", "--pin")
    hint = HINT.findall(r.err)[-1]
    assert r.code == 2 and "https://" not in hint and "engine.repo" not in hint, r.err
    assert f"--set driver.installer_url=file://{own}/downloads/" in hint and "--set p2p_module.repo=file://" in hint
    # a Spark node (vLLM) asked to pin a built engine it has no source for: where to start instead
    spark = sim("spark-head")
    third = tmp_path / "third.toml"
    third.write_text(cli("--root", str(spark), "profile", "show", "dual-5090-ninfer", "--toml").out)
    r = cli("--root", str(spark), "--profile", str(third), "up", "--pin")
    err = " ".join(r.err.split())
    assert r.code == 2 and "has no ninfer engine source" in err, err
    assert f"`p2pkit --root {spark} profile show --toml > mine.toml`" in err


@pytest.mark.slow
def test_the_documented_spark_inventory_on_simulated_nodes(cli, sim, tmp_path):
    """docs/inventory.md's inventory for the pair, its host vars as written (p2pkit_profile: dual-spark-vllm),
    each node a simulated one reached locally: preflight passes on both (it stopped at preflight.pins); and
    with the p2pkit_profile lines removed, the same."""
    import yaml

    from tests.test_inventory import controller

    text = (REPO / "docs/inventory.md").read_text().split("An inventory for the pair", 1)[1]
    doc = yaml.safe_load(re.search(r"```yaml\n(.+?)\n```", text, re.S).group(1))
    roots = {"spark-1": sim("spark-head", "head"), "spark-2": sim("spark-worker", "worker")}
    hosts = doc["all"]["hosts"]
    assert set(hosts) == set(roots) and all(v["p2pkit_profile"] == "dual-spark-vllm" for v in hosts.values())
    for h, v in hosts.items():
        v.pop("ansible_host")
        v.update(ansible_connection="local", p2pkit_root=str(roots[h]))
    inv = tmp_path / "hosts.yml"
    for step in ("as documented", "without p2pkit_profile"):
        inv.write_text(yaml.safe_dump(doc))
        r = cli(*controller(tmp_path), "--json", "up", "--inventory", str(inv), "--to", "preflight")
        got = {h: (v["exit_code"], v["stages"].get("preflight"), v.get("message"))
               for h, v in r.json()["hosts"].items()}
        assert r.code == 0 and all(g[:2] == (0, "done") for g in got.values()), (step, got)
        for v in hosts.values():
            v.pop("p2pkit_profile", None)
