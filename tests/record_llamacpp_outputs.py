"""Record what the real llama.cpp prints into tests/fixtures/llamacpp/ (bench/, server-start/, build/):
llama-bench's four formats and its errors, llama-server's start failures, and the build's own log,
a re-configure with a no-op rebuild, Ninja's dry run and CMakeCache.txt. Run by hand, once, after
tests/llama_real.py has built llama.cpp: `.venv/bin/python tests/record_llamacpp_outputs.py`.
What it ran is in tests/fixtures/llamacpp/README.md and in each JSON record (argv, exit code)."""

from __future__ import annotations

import fcntl
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import llama_real  # noqa: E402
import tiny_checkpoint  # noqa: E402

FIX = HERE / "fixtures/llamacpp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(argv: list[str], timeout: int = 600) -> dict:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return {"argv": argv, "rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr}


def bench(exe: Path, model: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llama-bench-help.txt").write_text(record([str(exe), "--help"])["stdout"])
    runs = {"plain": ["-p", "32", "-n", "16", "-r", "2"], "depth": ["-p", "32", "-n", "16", "-r", "2", "-d", "32"],
            "pg": ["-p", "32", "-n", "16", "-r", "2", "-pg", "32,16"]}
    for name, args in runs.items():
        for fmt in ("md", "json", "jsonl", "csv"):
            rec = record([str(exe), "-m", str(model), *args, "-o", fmt])
            (out / f"{name}.{fmt}.json").write_text(json.dumps(rec, indent=1) + "\n")
    # a batch size other than the default adds an n_batch column before the test: md's columns move
    rec = record([str(exe), "-m", str(model), *runs["plain"], "-b", "64", "-o", "md"])
    (out / "batch.md.json").write_text(json.dumps(rec, indent=1) + "\n")
    not_gguf = model.with_name("not-a-model.gguf")
    not_gguf.write_text("this is not a GGUF file\n")
    errors = {"missing-model": ["-m", str(model.with_name("no-such-model.gguf")), "-p", "32", "-n", "16", "-r", "2"],
              "invalid-argument": ["-m", str(model), "--no-such-flag", "-r", "2"],
              "not-gguf": ["-m", str(not_gguf), "-p", "32", "-n", "16", "-r", "2"]}
    for name, args in errors.items():
        for fmt in ("md", "json"):
            rec = record([str(exe), *args, "-o", fmt])
            (out / f"error-{name}.{fmt}.json").write_text(json.dumps(rec, indent=1) + "\n")


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status
    except OSError as e:
        return getattr(e, "code", None)


def server(exe: Path, model: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    not_gguf = model.with_name("not-a-model.gguf")
    base = ["--host", "127.0.0.1", "--threads", "2", "--ctx-size", "2048"]
    cases = {"not-gguf": ["-m", str(not_gguf), *base, "--port", str(free_port())],
             "missing-model": ["-m", str(model.with_name("no-such-model.gguf")), *base, "--port", str(free_port())],
             "unknown-flag": ["-m", str(model), *base, "--port", str(free_port()), "--no-such-flag"],
             "removed-flag": ["-m", str(model), *base, "--port", str(free_port()), "--draft-max", "4"]}
    for name, args in cases.items():
        (out / f"{name}.json").write_text(json.dumps(record([str(exe), *args], 120), indent=1) + "\n")
    port = free_port()
    first = subprocess.Popen([str(exe), "-m", str(model), *base, "--port", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if health(port) == 200:
                break
            time.sleep(0.1)
        rec = record([str(exe), "-m", str(model), *base, "--port", str(port)], 120)
        rec["first_server_health"] = health(port)
        (out / "port-in-use.json").write_text(json.dumps(rec, indent=1) + "\n")
    finally:
        first.terminate()
        first.wait(30)


def build_logs(out: Path) -> None:
    """The first build's log (the one llama_real's build kept), then p2pkit's own recipe again over the
    built tree (a re-configure and a no-op rebuild, in a fresh state directory), Ninja's dry run of the
    targets, and CMakeCache.txt."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import act as engine

    out.mkdir(parents=True, exist_ok=True)
    rec = llama_real.built()
    shutil.copy(rec["log"], out / "cpu-first-build.log")
    with tempfile.TemporaryDirectory() as tmp, open(llama_real.CACHE / "llama-up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the tests' `up` over the shared build dir takes it too
        store = Store(Path(tmp) / "state")
        store.ensure()
        p = config.load(llama_real.PROFILE, llama_real.overrides())
        ctx = pipeline.Ctx(profile=p, host=Host.at("/"), store=store, out=Output())
        res = engine.build(ctx)
        assert res.get("build_rc") == 0, res
        shutil.copy(res["log"], out / "cpu-rebuild.log")
    b = llama_real.build_dir() / "build"
    dry = ["cmake", "--build", str(b), "--target"]
    for name, argv in {"cpu-noop-dry-run": [*dry, "llama-server", "llama-bench", "--", "-n"],
                       "cpu-noop-dry-run-explain": [*dry, "llama-server", "llama-bench", "--", "-n", "-d", "explain"],
                       "cpu-unbuilt-target-dry-run-explain": [*dry, "llama-cli", "--", "-n", "-d", "explain"]}.items():
        (out / f"{name}.json").write_text(json.dumps(record(argv), indent=1) + "\n")
    shutil.copy(b / "CMakeCache.txt", out / "cpu.CMakeCache.txt")


def main() -> int:
    llama_real.wait()
    src = llama_real.build_dir()
    bin_dir = src / "build/bin"
    with tempfile.TemporaryDirectory(prefix="p2pkit-record-") as tmp:
        ckpt = tiny_checkpoint.make(Path(tmp) / "tiny")
        model = Path(tmp) / "tiny.gguf"
        subprocess.run([sys.executable, "-m", "convert_hf_to_gguf", str(ckpt), "--outfile", str(model), "--outtype",
                        "f16"], cwd=src, check=True, capture_output=True)
        which = sys.argv[1:] or ["bench", "server", "build"]
        if "bench" in which:
            bench(bin_dir / "llama-bench", model, FIX / "bench")
        if "server" in which:
            server(bin_dir / "llama-server", model, FIX / "server-start")
    if "build" in which:
        build_logs(FIX / "build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
