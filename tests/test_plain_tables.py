"""Piped (a CI log, `| grep`), a table is plain text that is never wrapped or cut at the console's
width: ids, host names and values stay whole on their row (issue 29)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from rich.console import Console

from p2pkit.core.output import Output, plain_table


def piped(*args: str, columns: int = 30) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    return subprocess.run([sys.executable, "-m", "p2pkit", *args], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def test_piped_status_keeps_long_ids_whole_at_narrow_columns(cli, sim):
    root = sim("one-gpu")
    (root / "var/lib/p2pkit").mkdir(parents=True)  # state recorded here: preflight's failure is its artifact
    assert cli("--root", str(root), "up", "--to", "preflight").code == 1
    r = piped("--root", str(root), "status")
    doc = json.loads(piped("--root", str(root), "--json", "status").stdout)
    lines = r.stdout.splitlines()
    assert lines[0] == "SIMULATED status (dual-5090-ninfer)"
    for st in doc["stages"]:
        row = next(ln for ln in lines if ln.startswith(st["stage"] + " "))
        assert st["state"] in row and st["reason"] in row, (row, st)  # compared whole, on one line
    reason = doc["stages"][0]["reason"]
    assert reason.startswith("preflight.gpu_count: 1 (0000:01:00.0)") and len(reason) > 30
    assert len(lines) == 3 + len(doc["stages"])  # title, header, rule, one line per stage: nothing wrapped


def test_a_table_to_a_narrow_file_keeps_host_names_and_ids_whole():
    buf = io.StringIO()
    out = Output(out=Console(file=buf, width=20, highlight=False, soft_wrap=True))
    out.table("status on 2 host(s)", ["host", "rebar", "result"],
              [["spark-1", "failed", "rebar failed: rebar.bar1.0000:01:00.0"],
               ["gpu-box-with-a-long-name", "done", "ok"]],
              status_col=1)
    lines = buf.getvalue().splitlines()
    assert lines[3].split() == ["spark-1", "failed", "rebar", "failed:", "rebar.bar1.0000:01:00.0"]
    assert lines[4].split() == ["gpu-box-with-a-long-name", "done", "ok"]
    assert len(lines) == 5


def test_plain_table_pads_columns_and_keeps_cells_whole():
    text = plain_table("t", ["a", "bb"], [["x" * 50, "y"], ["z", "two\nlines"]])
    assert text.splitlines() == ["t", "a" + " " * 51 + "bb", "-" * 50 + "  " + "-" * 9,
                                 "x" * 50 + "  y", "z" + " " * 51 + "two lines"]
