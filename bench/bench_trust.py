"""The trust campaign (issue 40): what root does with files and values it did not make, stage by stage.

Cases (--cases, comma-separated; all by default):
- links: a full `up --reboot` on a fresh simulated host runs under strace (bench/written.py); every
  file p2pkit's own processes wrote there (not Ansible's, not the host's tools', not the simulated
  machine's own reboot, which `sim reboot` under strace names) whose name could already have been
  there (not made new with O_EXCL, not inside a private directory the run made) gets a symlink to a
  victim file of its own on a second fresh host, and each directory p2pkit made under the state
  directory a symlink to a victim directory. Then `up --reboot` runs until it finishes: each exit 2
  must name a planted path (that link is removed then, a directory's link replaced by a real
  directory holding its files' links, and the run repeated). Per path: refused (exit 2 naming it),
  replaced (p2pkit put its own file where the link was) or not reached; and whether its victim was
  touched (content, mode or, for a directory, its listing).
- artifacts: per stage, a forged artifact (the stage's artifact from a host brought up fully,
  re-signed for this host, its chain and digest recomputed, where this host is brought up to the
  stage before: does `status` call it done, and does `up --to STAGE` do the work?), and vanished
  outputs (on a host brought up fully, every file the stage's run wrote outside the state directory
  removed: does `status` see it, and does `up` put it back?). These only report: the gates'
  re-proofs are another change's work.
- values: every leaf key of the built-in profile set (--set) to odd and oversize values (U+2028,
  U+2029, U+0085, bidi overrides and isolates, zero-width characters, a 1 MB string, a 401-digit
  integer) and checked with `profile validate` in one process; each value that passes is then given
  to `plan` on a fresh simulated host (--plan-per-kind of them per kind). Exit 2 is a refusal, 0 an
  acceptance, 70 an internal error.

Run by hand: `python3 bench/bench_trust.py [--cases links,artifacts,values] [--keys K1,K2] [--json FILE]`
(links ~4 min, artifacts ~10 min, values ~1 min on two cores). Not a test: tests/test_bench_trust.py
runs its argument parsing and the values case on one key; tests/test_safefs.py runs the links case."""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import written
from bench_kill import STATE, fresh_host, p2pkit, stop_host

from p2pkit.core.lock import HOST_LOCK

ENV = {**os.environ, "COLUMNS": "1000"}  # one error paragraph per line: a path is never wrapped
KERNEL = ("proc", "sys", "dev", ".p2pkit-sim")  # the kernel's own filesystems and the simulator's state


def run(args: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(p2pkit(*args), capture_output=True, text=True, cwd=cwd, env=ENV, timeout=timeout)


# ------------------------------------------------------------------------------------------------ links

def discover(base: Path, scenario: str = "healthy") -> dict:
    """A full `up --reboot` under strace; the paths p2pkit itself wrote, as targets to plant at."""
    root = fresh_host(base, "discover", scenario)
    code, trace = written.record(p2pkit("--root", str(root), "up", "--reboot"), base / "up.trace",
                                 after=lambda: stop_host(root), cwd=base, env=ENV)
    if code != 0:
        raise SystemExit(f"the unplanted run failed (exit {code}); see {base / 'up.trace'}")
    machine = machine_files(base, root)
    own = written.by_program(trace, "p2pkit", root, KERNEL)
    private = written.private_dirs(trace)
    state = str(root / STATE)
    files, dirs, skipped = [], [], {}
    for path, w in sorted(own.items()):
        rel = os.path.relpath(path, root)
        if path in machine:
            skipped[rel] = "the simulated machine's own file (its reboot writes it)"
        elif any(path.startswith(d + "/") for d in private):
            skipped[rel] = "inside a private directory the run made new (0700)"
        elif w.plantable():
            files.append(rel)
        elif w.by["p2pkit"] & {"mkdir", "mkdir-private"} and path.startswith(state + "/"):
            dirs.append(rel)
        else:
            skipped[rel] = "made new (" + ", ".join(sorted(w.by["p2pkit"])) + ")"
    others = sorted({p for w in trace.writes.values() for p in w.by} - {"p2pkit"})
    stop_host(root)
    return {"root": root, "files": files, "dirs": _shallowest(dirs), "skipped": skipped, "trace": trace,
            "writers": others}


def machine_files(base: Path, root: Path) -> set[str]:
    """What the simulated machine itself writes (its /etc/os-release, machine-id, dpkg status: a real
    host's kernel and package manager keep those): the paths a `sim reboot` under strace writes."""
    _, reboot = written.record(p2pkit("sim", "reboot", str(root)), base / "reboot.trace",
                               after=lambda: stop_host(root), cwd=base, env=ENV)
    return set(written.by_program(reboot, "p2pkit", root))


def _shallowest(dirs: list[str]) -> list[str]:
    return [d for d in dirs if not any(d.startswith(o + "/") for o in dirs)]


def _victim(victims: Path, i: int, directory: bool) -> Path:
    v = victims / (f"dir-{i}" if directory else f"file-{i}")
    if directory:
        v.mkdir()
        (v / "kept").write_text(f"victim directory {i}\n")
    else:
        v.write_text(f"victim {i}: p2pkit must never write here\n")
        v.chmod(0o640)
    return v


def _fingerprint(v: Path) -> str:
    if v.is_dir():  # what is in it, at any depth
        return json.dumps(sorted((str(p.relative_to(v)), p.read_text(errors="replace") if p.is_file() else "")
                                 for p in v.rglob("*")))
    st = v.stat()
    return f"{stat.filemode(st.st_mode)} {st.st_uid} {hashlib.sha256(v.read_bytes()).hexdigest()}"


def plant_campaign(base: Path, found: dict, scenario: str = "healthy") -> dict:
    """Plant at every target on a fresh host and run `up --reboot` until it finishes."""
    root = fresh_host(base, "planted", scenario)
    victims = base / "victims"
    victims.mkdir()
    planted: dict[str, dict] = {}
    files = list(found["files"])
    in_dirs = {d: [f for f in files if f.startswith(d + "/")] for d in found["dirs"]}

    def plant(rel: str, directory: bool) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        v = _victim(victims, len(planted), directory)
        p.symlink_to(v)
        planted[rel] = {"path": rel, "kind": "directory" if directory else "file", "victim": str(v),
                        "before": _fingerprint(v), "outcome": None}
    for d in found["dirs"]:
        plant(d, True)
    for f in files:
        if not any(f in fs for fs in in_dirs.values()):
            plant(f, False)
    runs = []
    for _ in range(len(planted) + 3):
        r = run(["--root", str(root), "up", "--reboot"], base)
        named = [rel for rel, e in planted.items() if e["outcome"] is None and (root / rel).is_symlink()
                 and _named(r.stderr, root, rel)]
        runs.append({"exit": r.returncode, "named": named, "tail": r.stderr.strip().splitlines()[-2:]})
        if r.returncode != 2 or not named:
            break
        rel = max(named, key=len)
        planted[rel]["outcome"] = "refused"
        planted[rel]["message"] = next((x for x in r.stderr.splitlines() if _named(x, root, rel)), "")[:400]
        (root / rel).unlink()
        if planted[rel]["kind"] == "directory":  # a real directory now, with its files' links in it
            (root / rel).mkdir()
            for f in in_dirs[rel]:
                plant(f, False)
    stop_host(root)
    for rel, e in planted.items():
        p = root / rel
        if e["outcome"] is None:
            e["outcome"] = "not reached" if p.is_symlink() else "replaced"
        e["victim_touched"] = _fingerprint(Path(e["victim"])) != e["before"]
    last = runs[-1] if runs else {"exit": None}
    return {"planted": list(planted.values()), "runs": runs, "finished": last["exit"] == 0}


def _named(text: str, root: Path, rel: str) -> bool:
    """The refusal names the path: as this machine sees it, or as the host does (/var/lib/...)."""
    return str(root / rel) in text or f"/{rel}" in text


def links(base: Path, scenario: str) -> dict:
    for sub in ("d", "p"):
        (base / sub).mkdir()
    found = discover(base / "d", scenario)
    result = plant_campaign(base / "p", found, scenario)
    rows = {}
    for e in result["planted"]:
        k = (e["kind"], e["outcome"])
        rows.setdefault(k, {"kind": e["kind"], "outcome": e["outcome"], "paths": 0, "victims_touched": 0})
        rows[k]["paths"] += 1
        rows[k]["victims_touched"] += e["victim_touched"]
    return {"targets": {"files": found["files"], "dirs": found["dirs"]}, "skipped": found["skipped"],
            "other_writers": found["writers"], **result, "table": list(rows.values())}


# -------------------------------------------------------------------------------------------- artifacts

def _stages() -> list[str]:
    from p2pkit.stages import registry

    return [s.name for s in registry()]


def _states(root: Path, base: Path) -> dict[str, tuple[str, str]]:
    """stage -> (state, reason) as `status --json` says."""
    r = run(["--root", str(root), "--json", "status"], base)
    try:
        return {s["stage"]: (s["state"], s.get("reason") or "") for s in json.loads(r.stdout)["stages"]}
    except (ValueError, KeyError, TypeError):
        return {}


def _forge(genuine: dict, root: Path, state: Path, stage: str, prev: str | None) -> dict:
    """The reference host's artifact made to pass for this host's: its identity and the digests of
    this host's profile (as p2pkit computes them), the chain to this host's artifact of the stage
    before, the digest recomputed."""
    from p2pkit.app.pipeline import section_digests
    from p2pkit.cli import common
    from p2pkit.core.artifacts import self_digest
    from p2pkit.host import Host
    from p2pkit.host.system import identity
    from p2pkit.stages import get

    host = Host.at(root)
    common.OPTS.root, common.OPTS.state_dir, common.OPTS.profile = root, None, None
    common.OPTS.overrides = common.OPTS.unset = ()
    doc = copy.deepcopy(genuine)
    doc["host"] = identity(host)
    doc["inputs"] = section_digests(common.profile(host), get(stage))
    if prev is not None:
        doc["previous"] = {"stage": prev, "digest": hashlib.sha256((state / f"{prev}.json").read_bytes()).hexdigest()}
    doc.pop("digest", None)
    doc["digest"] = self_digest(doc)
    return doc


def artifacts(base: Path) -> dict:
    """Forged artifacts stage by stage on one host brought up a stage at a time; then vanished
    outputs stage by stage on a host brought up fully."""
    stages = _stages()
    ref = fresh_host(base, "reference")
    code, trace = written.record(p2pkit("--root", str(ref), "up", "--reboot"), base / "up.trace",
                                 after=lambda: stop_host(ref), cwd=base, env=ENV)
    if code != 0:
        raise SystemExit(f"the reference run failed (exit {code})")
    genuine = {s: json.loads((ref / STATE / f"{s}.json").read_text()) for s in stages}
    forged = []
    host = fresh_host(base, "forged")
    state = host / STATE
    for i, st in enumerate(stages):
        prev = stages[i - 1] if i else None
        if prev is not None:
            r = run(["--root", str(host), "up", "--reboot", "--to", prev], base)
            if r.returncode != 0:
                forged.append({"stage": st, "error": f"up --to {prev} exited {r.returncode}"})
                break
        state.mkdir(parents=True, exist_ok=True)
        fake = json.dumps(_forge(genuine[st], host, state, st, prev), indent=2)
        (state / f"{st}.json").write_text(fake)
        seen, why = _states(host, base).get(st, ("?", ""))
        r = run(["--root", str(host), "up", "--reboot", "--to", st], base)
        try:  # the stage's work done: its artifact written anew
            did = (state / f"{st}.json").read_text() != fake
        except OSError:
            did = True
        forged.append({"stage": st, "status_says": seen, "up_exit": r.returncode, "up_did_the_work": did,
                       "caught": seen != "done" or did, "reason": why[:300]})
        if not did:  # trusted: take the forgery out, do the stage for real
            (state / f"{st}.json").unlink(missing_ok=True)
            run(["--root", str(host), "up", "--reboot", "--to", st], base)
    stop_host(host)
    vanished = []
    groups = written.by_stage(trace, ref / STATE, stages)
    lock = str(ref / HOST_LOCK)
    machine = machine_files(base, ref)  # the simulated machine's own files are no stage's output
    for st in stages:
        outs = sorted({os.path.relpath(p, ref) for prog, how, p in groups[st]
                       if how in ("open", "rename", "open-new", "link") and p != lock and p not in machine
                       and Path(p).is_relative_to(ref) and not Path(p).is_relative_to(ref / STATE)
                       and Path(p).relative_to(ref).parts[0] not in KERNEL and Path(p).is_file()})
        if not outs:
            vanished.append({"stage": st, "outputs_removed": 0})
            continue
        host = fresh_host(base, f"vanished-{st}")  # a host of its own, brought up fully
        r = run(["--root", str(host), "up", "--reboot"], base)
        if r.returncode != 0:
            vanished.append({"stage": st, "error": f"up exited {r.returncode} before anything was removed"})
            continue
        for rel in outs:
            (host / rel).unlink(missing_ok=True)
        seen, why = _states(host, base).get(st, ("?", ""))
        r = run(["--root", str(host), "up", "--reboot"], base)
        back = sum((host / rel).exists() for rel in outs)
        vanished.append({"stage": st, "outputs_removed": len(outs), "status_says": seen, "up_exit": r.returncode,
                         "outputs_back": back, "caught": seen != "done", "reason": why[:300],
                         "up_tail": r.stderr.strip().splitlines()[-1][:300] if r.stderr.strip() else ""})
        stop_host(host)
        shutil.rmtree(host, ignore_errors=True)
    return {"forged": forged, "vanished": vanished}


# ----------------------------------------------------------------------------------------------- values

KINDS = {
    "U+2028 line separator": "a\u2028NCCL_P2P_DISABLE=1",
    "U+2029 paragraph separator": "a\u2029b",
    "U+0085 next line": "a\u0085b",
    "U+202E bidi override": "safe\u202etxt.exe",
    "U+2066 bidi isolate": "\u2066a\u2069",
    "U+200B zero-width space": "a\u200bb",
    "1 MB string": "x" * (1 << 20),
    "401-digit integer": "9" * 401,
}


def leaf_keys(profile: str = "dual-5090-ninfer") -> list[str]:
    from p2pkit.core import config

    data = tomllib.loads(config.builtin_path(profile).read_text())
    out = []

    def walk(d: dict, prefix: list[str]) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and len(prefix) < 2:
                walk(v, [*prefix, k])
            elif prefix:
                out.append(".".join([*prefix, k]))
    walk(data, [])
    return [*out, *(k for k in ("serve.env.P2PKIT_PROBE",) if k not in out)]  # an env value: the engine's environment


def _in_process(argv: list[str]) -> tuple[int, str]:
    """The CLI run in this process (a 1 MB value never meets execve's limits here): exit code, stderr."""
    from p2pkit.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["p2pkit", *argv]
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return code, err.getvalue()


def values(base: Path, keys: list[str] | None, plan_per_kind: int) -> dict:
    keys = keys or leaf_keys()
    rows = []
    for key in keys:
        for kind, value in KINDS.items():
            v = value if kind.endswith("integer") else json.dumps(value)
            code, err = _in_process(["--set", f"{key}={v}", "profile", "validate", "dual-5090-ninfer"])
            rows.append({"key": key, "kind": kind, "validate_exit": code, "message": err.strip()[:200]})
    host = None
    for kind in KINDS:
        passed = [r for r in rows if r["kind"] == kind and r["validate_exit"] == 0]
        # the values that reach the engine first (its environment, its flags), then the rest
        passed.sort(key=lambda r: (0 if r["key"].startswith("serve.env.") else 1 if r["key"].startswith("serve.flags.")
                                   else 2))
        for row in passed[:plan_per_kind]:
            if host is None:
                host = fresh_host(base, "values")
            v = KINDS[kind] if kind.endswith("integer") else json.dumps(KINDS[kind])
            code, err = _in_process(["--root", str(host), "--set", f"{row['key']}={v}", "plan"])
            row["plan_exit"] = code
            row["plan_message"] = err.strip()[-200:]
    table = {}
    for r in rows:
        t = table.setdefault(r["kind"], {"kind": r["kind"], "keys": 0, "refused": 0, "accepted": 0, "internal": 0,
                                         "plan_tried": 0, "plan_internal": 0})
        t["keys"] += 1
        t["refused"] += r["validate_exit"] == 2
        t["accepted"] += r["validate_exit"] == 0
        t["internal"] += r["validate_exit"] == 70
        if "plan_exit" in r:
            t["plan_tried"] += 1
            t["plan_internal"] += r["plan_exit"] == 70
    return {"rows": rows, "table": list(table.values())}


# ------------------------------------------------------------------------------------------------- main

def print_table(title: str, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], list | dict)
                              and k not in ("reason", "up_tail", "message")))  # those in --json
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths, strict=True)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="links,artifacts,values", help="links, artifacts, values (comma-separated)")
    ap.add_argument("--scenario", default="healthy", help="the simulated host's scenario (links)")
    ap.add_argument("--keys", default=None, help="values: only these profile keys (comma-separated)")
    ap.add_argument("--plan-per-kind", type=int, default=3, help="values: accepted values tried with `plan`, per kind")
    ap.add_argument("--json", type=Path, default=None, help="write every case and its table here")
    a = ap.parse_args()
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = set(cases) - {"links", "artifacts", "values"}
    if bad:
        ap.error(f"unknown case(s): {', '.join(sorted(bad))}")
    if "links" in cases and not written.available():
        ap.error("the links case needs strace (apt-get install strace)")
    base = Path(tempfile.mkdtemp(prefix="bench-trust-"))
    out: dict = {"kind": "p2pkit-bench-trust"}
    t0 = time.monotonic()
    try:
        if "values" in cases:
            (base / "v").mkdir()
            out["values"] = values(base / "v", a.keys.split(",") if a.keys else None, a.plan_per_kind)
            print_table("values: profile validate (and plan where it passed), per kind", out["values"]["table"])
        if "links" in cases:
            (base / "l").mkdir()
            lk = links(base / "l", a.scenario)
            out["links"] = lk
            print_table(f"links: {len(lk['targets']['files'])} files and {len(lk['targets']['dirs'])} directories "
                        f"p2pkit wrote, a link planted at each ({len(lk['runs'])} runs, finished: {lk['finished']})",
                        lk["table"])
        if "artifacts" in cases:
            (base / "a").mkdir()
            out["artifacts"] = artifacts(base / "a")
            print_table("artifacts: a forged artifact per stage on a host brought up to the stage before",
                        out["artifacts"]["forged"])
            print_table("artifacts: every output of a stage removed on a host brought up fully",
                        out["artifacts"]["vanished"])
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - t0, 1)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    bad = False
    if "links" in out:
        bad |= any(e["victim_touched"] or e["outcome"] == "not reached" for e in out["links"]["planted"])
        bad |= not out["links"]["finished"]
    if "values" in out:
        bad |= any(r["validate_exit"] == 70 or r.get("plan_exit") == 70 for r in out["values"]["rows"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
