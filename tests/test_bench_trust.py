"""bench/bench_trust.py, the trust campaign (issue 40): its argument parsing, and one small case (the
values case on two keys, `plan` once per kind), in a real process. The links case is
tests/test_safefs.py's campaign test (a cut of it: the fresh `up --reboot`'s first round)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_trust.py"


def test_an_unknown_case_is_refused_by_the_argument_parser(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--cases", "links,nonsense"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 2 and "unknown case(s): nonsense" in r.stderr, r.stderr


def test_an_unknown_command_of_the_links_case_is_refused_by_the_argument_parser(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--cases", "links", "--commands", "up --reboot,reboot twice"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "unknown command(s): reboot twice" in r.stderr, r.stderr


def test_the_values_case_on_two_keys_tables_every_kind(tmp_path):
    out = tmp_path / "trust.json"
    r = subprocess.run([sys.executable, str(BENCH), "--cases", "values", "--keys", "serve.port,serve.env.FOO",
                        "--plan-per-kind", "1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=600)
    doc = json.loads(out.read_text())
    rows, table = doc["values"]["rows"], doc["values"]["table"]
    assert len(rows) == 2 * 8 and {t["kind"] for t in table} == {r["kind"] for r in rows} and len(table) == 8
    port = {r["kind"]: r for r in rows if r["key"] == "serve.port"}
    assert all(r["validate_exit"] == 2 for r in port.values()), port  # a port is an integer in range
    assert "expected at most 65535" in port["401-digit integer"]["message"]
    for t in table:
        assert t["keys"] == 2 and t["refused"] + t["accepted"] + t["internal"] <= 2, t
    assert "values: profile validate" in r.stdout and "401-digit integer" in r.stdout, r.stdout
    assert r.returncode in (0, 1), r.stderr[-1000:]
