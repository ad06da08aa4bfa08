"""Every script in bench/ still runs against the code as it is, as `python3 bench/NAME.py` from a checkout
without an install (issue 38: on the H200 bench_link.py died on an API that had moved, and bench_startup.py
on a console script it assumed was installed). Each parses its arguments, and each runs every step that
needs no GPU and no server: bench_link on a simulated host's devices, bench_doctor with a stand-in for
nvidia-smi, bench_hash on a small file, the simulated-host benches (slow) at their smallest sizes, the
checkpoint maker of the GPU run making its draft.

"Without an install": the base interpreter of this virtual environment with its site-packages on
PYTHONPATH, so every dependency is there but the editable install's .pth (which puts this checkout on
sys.path) is not read: only the script itself can bring p2pkit in."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))
PLAIN = getattr(sys, "_base_executable", sys.executable)


def bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # the dependencies; .pth files there are not read
    env["PATH"] = os.pathsep.join([str(dependency_commands()), env.get("PATH", "")])
    return env


DEPS: list[Path] = []  # the directory of links below, under pytest's own temporary directory (none in /tmp left)


@pytest.fixture(autouse=True, scope="module")
def _deps_dir(tmp_path_factory):
    DEPS[:] = [tmp_path_factory.mktemp("deps")]
    yield


def dependency_commands() -> Path:
    """The commands the dependencies install (ansible-playbook and its kin), and not p2pkit's own: a directory
    of links to them, as a host where the dependencies are installed and p2pkit is not has them."""
    d = DEPS[0]
    for exe in Path(sys.executable).parent.glob("ansible*"):
        link = d / exe.name
        if not link.exists():
            link.symlink_to(exe)
    return d


def run(name: str, *args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PLAIN, str(BENCH / name), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=bare_env(), stdin=subprocess.DEVNULL)


def test_without_the_scripts_own_path_p2pkit_is_not_importable(tmp_path):
    """The harness is what it claims: this interpreter and environment alone cannot import p2pkit."""
    r = subprocess.run([PLAIN, "-c", "import p2pkit.cli.main"], capture_output=True, text=True, cwd=tmp_path,
                       env=bare_env())
    assert r.returncode != 0 and "No module named 'p2pkit" in r.stderr, r.stderr[-600:]


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_bench_script_answers_help_from_a_checkout(name, tmp_path):
    r = run(name, "--help", cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), (name, r.stdout[-500:], r.stderr[-1500:])


def test_bench_link_runs_p2pkits_side_on_a_simulated_hosts_devices(tmp_path):
    """Every step but the GPU's: the link stage's device backend (the simulated host's, where the H200 had
    torch's), host_bandwidth over it, NVML's link reading and the ceiling; the CUDA reference is not run
    and says so; the result is labelled SIMULATED."""
    root = tmp_path / "sim"
    init = subprocess.run([sys.executable, "-m", "p2pkit", "sim", "init", "-s", "stock-driver", str(root)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    r = run("bench_link.py", "--root", str(root), "--mib", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    doc = json.loads(r.stdout)
    assert doc["label"] == "SIMULATED" and doc["reference"].startswith("not run")
    assert doc["link"] == "Gen5 x8" and 0.5 < doc["summary"]["h2d_gbps"]["p2pkit_of_ceiling"] < 1
    assert all(x["reference"] is None and x["p2pkit"]["h2d_gbps"] > 0 for x in doc["runs"])
    bare = run("bench_link.py", "--root", str(tmp_path), cwd=tmp_path)  # not a simulated host: said, not a traceback
    assert bare.returncode != 0 and "not a simulated host" in bare.stderr and "Traceback" not in bare.stderr


def test_bench_doctor_times_every_command_with_a_stand_in_for_nvidia_smi(tmp_path):
    """doctor, --help and --version from this checkout, beside a bare interpreter and the reference
    command, each ratio in the same document; a reference command that is not installed is exit 2."""
    r = run("bench_doctor.py", "--runs", "1", "--smi", f"{PLAIN} -c pass", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    doc = json.loads(r.stdout)
    assert doc["exit_codes"]["p2pkit --help"] == [0] and doc["exit_codes"]["p2pkit --version"] == [0]
    assert doc["exit_codes"]["doctor"] != [] and 2 not in doc["exit_codes"]["doctor"]  # doctor ran, judged
    for k in ("ratio", "help_vs_python", "version_vs_python"):
        assert doc[k] > 0, k
    missing = run("bench_doctor.py", "--runs", "1", "--smi", "no-such-smi -q", cwd=tmp_path)
    assert missing.returncode == 2 and "no-such-smi is not installed" in missing.stderr


def test_doctor_timeline_times_doctor_on_a_simulated_host(tmp_path):
    """bench/doctor_timeline.py: doctor run as the command runs it, its facts started early, the imports, every
    fact and the end in order, on a simulated host (doctor exits 1 there: the sim's 5090s are not this box's)."""
    host = tmp_path / "host"
    made = subprocess.run([sys.executable, "-m", "p2pkit", "sim", "init", str(host)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert made.returncode == 0, made.stderr[-1500:]
    r = run("doctor_timeline.py", "--runs", "1", "--", "--root", str(host), "doctor", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    t = json.loads(r.stdout)
    assert 0 < t["facts_started_s"] < t["imports_done_s"] < t["facts_done_s"] <= t["end_s"], t
    assert t["exit"] == 1, t  # doctor judged (the sim's GPUs fail this profile's checks), it did not crash (70)
    names = [f[0] for f in t["facts"]]
    assert {"nvml", "smi_topo_m", "engine_live", "vram_fit"} <= set(names) and len(names) == len(set(names))
    assert all(t["facts_started_s"] <= s <= e <= t["facts_done_s"] for _, s, e in t["facts"])
    bad = run("doctor_timeline.py", "--runs", "x", cwd=tmp_path)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_bench_hash_hashes_and_compares(tmp_path):
    r = run("bench_hash.py", "--mib", "2", "--runs", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    assert json.loads(r.stdout)["ratio"] > 0


@pytest.mark.slow
def test_the_simulated_host_benches_run_from_a_checkout(tmp_path):
    """bench_startup brings up its own done host through the launcher (it assumed an installed console
    script), bench_up and bench_inventory at their smallest sizes: p2pkit and its stand-ins from this tree."""
    r = run("bench_startup.py", "--runs", "1", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]
    doc = json.loads(r.stdout)
    assert doc["help"]["after"]["exit"] == [0] and doc["status"]["after"]["exit"] == [0]
    # the host it made is gone, and its engine with it (it was left running, and its directory, in every run)
    left = subprocess.run(["pgrep", "-f", f"p2pkit.sim.engine {doc['host']}/"], capture_output=True, text=True)
    assert left.returncode == 1 and not Path(doc["host"]).exists(), left.stdout
    r = run("bench_up.py", "--runs", "1", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]
    r = run("bench_inventory.py", "--sizes", "1", "--runs", "1", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-1500:]


def test_the_gpu_runs_checkpoint_maker_makes_its_draft(tmp_path):
    """bench/gpu_model.py draft: the same vocabulary as the main model, a 32K context, and it never
    writes into a directory that holds something."""
    pytest.importorskip("safetensors")
    out = tmp_path / "draft"
    r = run("gpu_model.py", "draft", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    made = json.loads(r.stdout)
    cfg = json.loads((out / "config.json").read_text())
    assert made["parameters"] > 1_000_000 and cfg["max_position_embeddings"] == 32768
    assert cfg["vocab_size"] == made["vocab"] and (out / "tokenizer.json").is_file()
    again = run("gpu_model.py", "draft", str(out), cwd=tmp_path)
    assert again.returncode == 2 and "not overwritten" in again.stderr
    assert subprocess.run(["bash", "-n", str(BENCH / "gpu_engine_run.sh")]).returncode == 0
