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


def batched(exe: Path, model: Path, out: Path) -> None:
    """llama-batched-bench (issue 38): its table and its JSONL, a -c too small for the largest level (skipped
    without a word), a missing model and an unknown flag; each record holds argv, exit code, stdout, stderr."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "llama-batched-bench-help.txt").write_text(record([str(exe), "--help"])["stdout"])
    base = [str(exe), "-m", str(model), "-t", "2", "-c", "2048", "-npp", "32", "-ntg", "16", "-npl", "1,2"]
    runs = {"md": base, "jsonl": [*base, "--output-format", "jsonl"],
            "too-small-c": [str(exe), "-m", str(model), "-t", "2", "-c", "96", "-npp", "32", "-ntg", "16", "-npl",
                            "1,2,4"],
            "missing-model": [str(exe), "-m", str(model.with_name("no-such-model.gguf")), "-npp", "32", "-ntg", "16",
                              "-npl", "1"],
            "invalid-argument": [*base, "--no-such-flag"]}
    for name, argv in runs.items():
        (out / f"{name}.json").write_text(json.dumps(record(argv), indent=1) + "\n")


def get(url: str) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except OSError as e:
        return getattr(e, "code", None), str(e)


def complete(port: int, n_prompt: int, n_out: int, token: int = 5) -> dict:
    """One /completion as bench sends it, with the client's own clock (time to the answer's first byte)."""
    body = json.dumps({"prompt": [token] * n_prompt, "n_predict": n_out, "temperature": 0, "cache_prompt": False,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        first = time.monotonic() - t0
        doc = json.loads(r.read())
    return {"client_first_byte_s": round(first, 4), "client_s": round(time.monotonic() - t0, 4),
            "timings": doc.get("timings"), "id_slot": doc.get("id_slot")}


def start(exe: Path, argv: list[str], port: int, log: Path) -> subprocess.Popen:
    fh = open(log, "wb")  # noqa: SIM115 - the server's own log, kept as it writes it
    proc = subprocess.Popen([str(exe), *argv, "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    for _ in range(600):
        if health(port) == 200:
            return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"llama-server did not answer /health (log {log})")


def proc_start(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 1:].split()[19])


def restart(exe: Path, model: Path, out: Path) -> None:
    """The real /metrics pair across a restart (issue 38, 1): two requests, /metrics, the server stopped and
    started again on the same port, /metrics again; with each process's PID and start time."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = ["-m", str(model), "--host", "127.0.0.1", "--threads", "2", "--ctx-size", "2048", "--metrics"]
    with tempfile.TemporaryDirectory() as tmp:
        first = start(exe, argv, port, Path(tmp) / "1.log")
        try:
            responses = [complete(port, 32, 16) for _ in range(2)]
            before = get(f"http://127.0.0.1:{port}/metrics")
            id_before = {"pid": first.pid, "start_ticks": proc_start(first.pid)}
        finally:
            first.terminate()
            first.wait(30)
        second = start(exe, argv, port, Path(tmp) / "2.log")
        try:
            after = get(f"http://127.0.0.1:{port}/metrics")
            id_after = {"pid": second.pid, "start_ticks": proc_start(second.pid)}
        finally:
            second.terminate()
            second.wait(30)
    (out / "metrics-across-restart.json").write_text(json.dumps({
        "argv": ["llama-server", *argv, "--port", str(port)], "responses": responses,
        "metrics_before_status": before[0], "metrics_before": before[1], "engine_before": id_before,
        "metrics_after_status": after[0], "metrics_after": after[1], "engine_after": id_after}, indent=1) + "\n")


def stall(exe: Path, model: Path, out: Path) -> None:
    """The first request of a new shape after a level at 8 streams (issue 38, 2): llama-server with 8 slots and
    a unified KV, trace logging; 8 requests at once (128/64 tokens), then a long-prompt request (1536/32) alone
    and another; with the prompt cache in RAM (the default) and without it (--cache-ram 0)."""
    from concurrent.futures import ThreadPoolExecutor

    out.mkdir(parents=True, exist_ok=True)
    for name, extra in (("default", []), ("cache-ram-0", ["--cache-ram", "0"])):
        port = free_port()
        argv = ["-m", str(model), "--host", "127.0.0.1", "--threads", "2", "--ctx-size", "32768", "--parallel", "8",
                "--kv-unified", "--metrics", "--log-verbosity", "4", "--log-timestamps", "--log-prefix", *extra]
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "server.log"
            proc = start(exe, argv, port, log)
            try:
                complete(port, 128, 64)
                with ThreadPoolExecutor(8) as pool:
                    fill = list(pool.map(lambda _i: complete(port, 128, 64), range(8)))  # noqa: B023
                first, second = complete(port, 1536, 32), complete(port, 1536, 32)  # the tiny model: 2048 context
            finally:
                proc.terminate()
                proc.wait(30)
            lines = log.read_text(errors="replace").splitlines()
        keep = [ln for ln in lines if any(w in ln for w in ("prompt cache", "saving idle slot", "prompt_save",
                                                              "cache update took", "selected slot", "launch_slot"))]
        (out / f"stall-{name}.json").write_text(json.dumps({
            "argv": ["llama-server", *argv, "--port", str(port)], "fill": fill, "first": first, "second": second,
            "log_lines": keep[-120:]}, indent=1) + "\n")


def build_logs(out: Path) -> None:
    """The first build's log (the one llama_real's build kept), then p2pkit's own recipe again over the
    built tree (a re-configure and a no-op rebuild, in a fresh state directory), Ninja's dry run of the
    targets, and CMakeCache.txt."""
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host
    from p2pkit.stages.engine import cmake as engine

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
        which = sys.argv[1:] or ["bench", "server", "build", "batched", "restart", "stall"]
        if "bench" in which:
            bench(bin_dir / "llama-bench", model, FIX / "bench")
        if "server" in which:
            server(bin_dir / "llama-server", model, FIX / "server-start")
        if "batched" in which:
            batched(bin_dir / "llama-batched-bench", model, FIX / "batched-bench")
        if "restart" in which:
            restart(bin_dir / "llama-server", model, FIX / "metrics")
        if "stall" in which:
            stall(bin_dir / "llama-server", model, FIX / "stall")
    if "build" in which:
        build_logs(FIX / "build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
