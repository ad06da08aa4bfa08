"""The trust campaign (issue 40): what root does with files and values it did not make, stage by stage.

Cases (--cases, comma-separated; all by default):
- links (issue 48 items 1 and 7): the whole process tree of each of COMMANDS (a fresh `up --reboot`, then
  on the done host a second `up`, `serve restart`, `restore`, `rollback p2p-module`) runs under strace
  (bench/written.py) on one simulated host. Every path under the host's root that any program of the tree
  wrote (p2pkit, its Ansible modules, Ansible's own modules, the host's stand-in tools, git, CMake, the
  compilers) and every directory written into on the way is a target, less only what cannot hold a link
  planted before the run, each skip with its reason: the kernel's filesystems (the simulated host's proc,
  sys, dev), the simulator's own state (.p2pkit-sim) and the files its machine writes as it boots (what
  `sim reboot` under strace writes), the directories that hold its stand-in programs (they find the host
  from their own path), names made new with O_EXCL and whatever lies inside a directory the run itself
  made. Then on another host a link to a victim outside the host's root is planted at each target
  (shallowest first; a directory's content moved into its victim, so the host reads what it read before)
  and the command runs until it finishes: each exit 2 must name a planted path (that link is taken out
  and the targets below it planted, and the command runs again). Per target: refused (exit 2 naming it),
  replaced (a file of the run's own where the link was), written through (the run stopped otherwise and a
  victim changed), not reached; and whether its victim was touched (content, mode, owner or listing), by
  which programs (from the recording). `up --reboot` goes in rounds, each on a fresh host, until every
  target was planted; the later commands run once each on the host the last round brought up. A victim
  touched by p2pkit or its modules fails the run (exit 1); one touched by another program is reported.
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

Run by hand: `python3 bench/bench_trust.py [--cases links,artifacts,values] [--commands up --reboot,second up]
[--rounds N] [--keys K1,K2] [--json FILE]` (links ~15 min, artifacts ~10 min, values ~1 min on two shared
cores). Not a test: tests/test_bench_trust.py runs its argument parsing and the values case on two keys;
tests/test_safefs.py runs a cut of the links case (the fresh `up --reboot`, its first round)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import os
import re
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


def run(args: list[str], cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(p2pkit(*args), capture_output=True, text=True, cwd=cwd, env=ENV, timeout=timeout)


# ------------------------------------------------------------------------------------------------ links

# What the campaign leaves out of the recorded writes, each for its reason: the kernel's own filesystems (the
# simulated host's /proc, /sys and /dev stand for them) and the simulator's own state (the test's machinery).
KERNEL = ("proc", "sys", "dev", ".p2pkit-sim")
# The commands recorded and planted, in order, on one host: a fresh `up --reboot`, then on the done host a
# second `up`, `serve restart`, `restore` and `rollback p2p-module` (issue 48 item 1).
COMMANDS = (("up --reboot", ("up", "--reboot")), ("second up", ("up",)), ("serve restart", ("serve", "restart")),
            ("restore", ("--yes", "restore")), ("rollback", ("rollback", "p2p-module", "--yes")))
DONE = {"rollback": 4}  # the exit a command ends with when it did its work (rollback: a reboot puts it in force)
OURS = ("p2pkit", "p2pkit module")  # p2pkit's own processes and its own Ansible modules (p2pkit_files, p2pkit_user)


def by_design(profile: str = "dual-5090-ninfer") -> dict[str, str]:
    """The links p2pkit follows on purpose, relative to the host's root, each with where the product says so:
    the models directory (config.models_dir: it may be a link, the models on another disk; a link above it
    or below it that leads out is refused). A victim written through one of these is reported apart."""
    from p2pkit.core import config

    p = config.load(profile)
    return {config.models_dir(p).strip("/"): "the models directory may itself be a link (the models on another "
            "disk: p2pkit.core.config.models_dir; a link above or below it that leads out is refused)"}


def _rel(root: Path, path: str) -> str | None:
    top = str(root).rstrip("/") + "/"
    if not path.startswith(top):
        return None
    rel = path[len(top):]
    return None if not rel or rel.split("/")[0] in KERNEL else rel


def standin_dirs(root: Path) -> set[str]:
    """The directories of a fresh simulated host that hold its stand-in programs (nvidia-smi, dpkg-query,
    systemctl: scripts that find the host's root from their own path, `readlink -f "$0"`), and those above them:
    a link there makes the simulator lose its host, not p2pkit write through it (the test's own machinery)."""
    out = set()
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink() and os.access(f, os.X_OK) and f.stat().st_size < 65536:
            with open(f, "rb") as fh:
                if b"SIMULATED host" in fh.read(400):
                    parts = f.relative_to(root).parts[:-1]
                    out |= {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return out


def targets(trace: written.Trace, root: Path, machine: set[str], sim: set[str] = frozenset()) -> dict:
    """Every path under the host's root the command's whole process tree wrote (any program: p2pkit, its
    modules, Ansible's, the host's tools), and every directory it wrote into (each directory on the way from the
    root), as plantable targets; what cannot be planted is skipped with its reason: a name made new by the run
    itself (O_EXCL, a private mkdtemp directory, or inside a directory the run made: nothing can be there
    before it is made), the simulated machine's own files (`machine`: relative paths). Writers: path -> the
    programs that wrote there."""
    files: set[str] = set()
    dirs: set[str] = set()
    skipped: dict[str, str] = {}
    writers: dict[str, list[str]] = {}
    made = {rel for p, w in trace.writes.items() if (rel := _rel(root, p))
            and any(h & {"mkdir", "mkdir-private"} for h in w.by.values())}
    for path, w in trace.writes.items():
        rel = _rel(root, path)
        if rel is None:
            continue
        writers[rel] = sorted(w.by)
        if rel in machine:
            skipped[rel] = "the simulated machine's own file (its reboot writes it)"
            continue
        inside = next((d for d in made if rel.startswith(d + "/")), None)
        if inside:
            skipped[rel] = f"inside {inside}, a directory the run made"
        elif rel in made:
            dirs.add(rel)
        elif all(h <= {"mkdir-there"} for h in w.by.values()):
            dirs.add(rel)  # an existing directory a tool made sure of (mkdir -p): one it writes into
        elif all(w.first.get(prog) in ("open-new", "link") for prog in w.by):
            skipped[rel] = "a name made new by the run (O_EXCL)"
        else:
            files.add(rel)
        parts = rel.split("/")
        for i in range(1, len(parts)):  # every directory on the way is one the run writes into
            d = "/".join(parts[:i])
            if not any(d.startswith(m + "/") for m in made):
                dirs.add(d)
    files -= dirs
    for rel in list(skipped):  # a directory the machine made sure of is still one the run writes into
        if rel in dirs or rel in files:
            del skipped[rel]
    for d in sorted(dirs & set(sim)):
        dirs.discard(d)
        skipped[d] = "holds the simulated host's stand-in programs (they find the host from their own path)"
    for rel in machine:  # the simulated machine's own writes (its boot, run inside `up --reboot`) are no one's
        if rel in writers:
            writers[rel] = [w for w in writers[rel] if w != "p2pkit"]
    return {"files": sorted(files), "dirs": sorted(dirs), "skipped": skipped, "writers": writers}


def discover(base: Path, scenario: str = "healthy", names: tuple[str, ...] | None = None) -> dict:
    """The whole process tree of each command (strace -f; a service it leaves running goes on untraced) on one
    simulated host: a fresh `up --reboot`, then the other COMMANDS on the done host; each command's targets.
    `names`: only these commands are recorded (a fresh `up --reboot` runs all the same, untraced when not)."""
    root = fresh_host(base, "discover", scenario)
    machine = machine_files(base, scenario)
    sim = standin_dirs(root)
    found = {}
    for name, args in COMMANDS:
        if names is not None and name not in names:
            if name == "up --reboot":  # the host the later commands find: brought up, its engine running
                r = run(["--root", str(root), *args], base)
                if r.returncode != 0:
                    raise SystemExit(f"the unplanted `{name}` exited {r.returncode}: {r.stderr[-800:]}")
            continue
        # the engine a command leaves running keeps strace waiting: it is stopped once the command has exited,
        # and started again untraced (serve restart) for the next command, as the command left it
        code, trace = written.record(p2pkit("--root", str(root), *args), base / f"{name.replace(' ', '-')}.trace",
                                     after=lambda: stop_host(root), settle=5, cwd=base, env=ENV)
        if code != DONE.get(name, 0):
            raise SystemExit(f"the unplanted `{name}` exited {code}; see {base}")
        found[name] = targets(trace, root, machine, sim)
        if name != "rollback":
            run(["--root", str(root), "serve", "restart"], base)
    stop_host(root)
    return found


def machine_files(base: Path, scenario: str) -> set[str]:
    """What the simulated machine itself writes (its /etc/os-release, machine-id, dpkg status: a real
    host's kernel and package manager keep those): the paths a `sim reboot` under strace writes."""
    root = fresh_host(base, "machine", scenario)
    _, reboot = written.record(p2pkit("sim", "reboot", str(root)), base / "reboot.trace", settle=3, cwd=base,
                               env=ENV)
    stop_host(root)
    return {rel for p in written.by_program(reboot, "p2pkit", root) if (rel := _rel(root, p))}


def _fingerprint(v: Path) -> dict[str, str]:
    """relative path -> mode, owner and content digest of everything in v (v itself "."), links not followed."""
    out = {}
    if not os.path.lexists(v):
        return out  # a dangling link's victim, not (yet) made
    for p in [v, *sorted(v.rglob("*"))] if v.is_dir() and not v.is_symlink() else [v]:
        st = p.lstat()
        what = os.readlink(p) if stat.S_ISLNK(st.st_mode) else hashlib.sha256(p.read_bytes()).hexdigest() \
            if stat.S_ISREG(st.st_mode) else ""
        out[str(p.relative_to(v)) if p != v else "."] = f"{stat.filemode(st.st_mode)} {st.st_uid} {what}"
    return out


class Planter:
    """Links planted on one host at the targets of a command, each taken out when a run refuses it. A directory's
    link leads to its own content, moved aside (or to an empty victim directory where none was); a file's to a
    copy of it, or, where none was, to a victim name not there (a dangling link: a reader finds nothing, as
    before, and a write that follows it makes the victim). The host reads what it read before."""

    def __init__(self, root: Path, victims: Path, writers: dict[str, list[str]], design: dict[str, str] | None = None):
        self.root, self.victims, self.writers = root, victims, writers
        self.design = design or {}
        self.planted: dict[str, dict] = {}
        self.n = 0

    def plant(self, rel: str, directory: bool) -> None:
        p = self.root / rel
        self.n += 1
        v = self.victims / f"{self.n:03d}-{rel.replace('/', '_')}"
        moved = p.is_dir() and not p.is_symlink() if directory else p.is_file() and not p.is_symlink()
        if directory and moved:
            os.rename(p, v)
        elif directory:
            v.mkdir()
        elif moved:
            shutil.copy2(p, v)
            p.unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(v)
        self.planted[rel] = {"path": rel, "kind": "directory" if directory else "file", "victim": str(v),
                             "moved": moved, "before": _fingerprint(v)}

    def resolve(self, rel: str, outcome: str) -> dict:
        """The link taken out (a directory's content moved back: the host as it was, with what a run wrote
        there), its victim judged: what changed there, and which programs wrote those names in the recording."""
        e = self.planted.pop(rel)
        p, v = self.root / rel, Path(e["victim"])
        before, after = e.pop("before"), _fingerprint(v)
        e["outcome"] = "followed by design" if outcome in ("not reached", "written through") and rel in self.design \
            else outcome
        if rel in self.design:
            e["by_design"] = self.design[rel]
        e["changed"] = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))[:20]
        e["victim_touched"] = bool(e["changed"])
        names = [rel if k == "." else f"{rel}/{k}" for k in e["changed"]]
        e["written_by"] = sorted({w for n in names for w in self.writers.get(n, ())})
        if p.is_symlink():
            p.unlink()
            if e["kind"] == "directory":
                if e["moved"]:
                    os.rename(v, p)
                else:
                    p.mkdir()
            elif e["moved"]:
                shutil.copy2(v, p)
        return e


def _named_in(text: str, root: Path, rel: str) -> bool:
    """A refusal names the planted path, as this machine sees it or as the host does (a profile's path), whole."""
    return any(re.search(rf"(^|[\s(`'\"]){re.escape(path)}($|[\s):,`'\";])", text, re.M)
               for path in (str(root / rel), f"/{rel}"))


def plant_and_run(base: Path, root: Path, victims: Path, found: dict, args: tuple[str, ...],
                  todo: dict[str, bool], limit: int = 400, done: int = 0, design: dict[str, str] | None = None) -> dict:
    """Plant a link at the shallowest of `todo` (rel -> is a directory), run the command until it finishes; each
    exit 2 must name planted links, which are then taken out and the targets below them planted, and the
    command runs again. Returns the outcomes; what stays in `todo` was never planted (a directory above it was
    not refused: a next round plants it)."""
    planter = Planter(root, victims, found["writers"], design)
    results, runs = [], []

    def plant_below(top: str | None) -> None:
        below = [t for t in todo if top is None or t.startswith(top + "/")]
        for t in [t for t in below if not any(t.startswith(o + "/") for o in below if o != t)]:
            planter.plant(t, todo.pop(t))
    plant_below(None)
    for _ in range(limit):
        r = run(["--root", str(root), *args], base)
        named = [rel for rel in planter.planted if _named_in(r.stderr, root, rel)]
        runs.append({"exit": r.returncode, "named": named, "tail": r.stderr.strip().splitlines()[-4:]})
        if r.returncode == done:
            break
        if r.returncode == 2 and named:
            for rel in named:
                results.append(planter.resolve(rel, "refused"))
                plant_below(rel)
            continue
        # stopped some other way: a tool wrote through a link (its victim holds what it wrote, and the host
        # misses it): those links are taken out, what was written put in place, and the command runs again
        through = [rel for rel, e in planter.planted.items() if _fingerprint(Path(e["victim"])) != e["before"]]
        if not through:
            break
        runs[-1]["written_through"] = through
        for rel in through:
            results.append(planter.resolve(rel, "written through"))
    for rel in list(planter.planted):  # a link still there: written through when its victim changed (a tool
        # followed it and the run went on), else not reached
        e = planter.planted[rel]
        through = _fingerprint(Path(e["victim"])) != e["before"]
        results.append(planter.resolve(rel, ("written through" if through else "not reached")
                                       if (root / rel).is_symlink() else "replaced"))
    return {"planted": results, "runs": runs, "finished": bool(runs) and runs[-1]["exit"] == done}


def links(base: Path, scenario: str = "healthy", names: tuple[str, ...] | None = None,
          rounds: int = 100) -> dict:
    """The links case: every command of COMMANDS (or of `names`) recorded on one host, then planted on another:
    a fresh `up --reboot` in rounds (each round a fresh host: the targets below a directory whose link no run
    refused go into the next), then each later command on the host the last round brought up, in rounds too
    (before each round after its first, `up --reboot` brings that host back where the command found it: a
    rollback undone). At most `rounds` rounds a command: what a cut leaves is listed as not planted."""
    t0 = time.monotonic()
    (base / "d").mkdir()
    (base / "p").mkdir()
    found = discover(base / "d", scenario, names)
    t_discover = time.monotonic() - t0
    design = by_design()
    out: dict = {"by_design": design, "commands": {},
                 "writers": sorted({w for f in found.values() for ws in f["writers"].values() for w in ws})}
    root = None
    for name, args in COMMANDS:
        if name not in found:
            if name == "up --reboot":  # the later commands' host, brought up unplanted
                root = fresh_host(base / "p", "planted", scenario)
                r = run(["--root", str(root), *args], base / "p")
                if r.returncode != 0:
                    raise SystemExit(f"the unplanted `{name}` exited {r.returncode}: {r.stderr[-800:]}")
            continue
        f = found[name]
        todo = {**{d: True for d in f["dirs"]}, **{x: False for x in f["files"]}}
        got: dict = {"planted": [], "runs": [], "finished": True, "rounds": 0}
        t_cmd = time.monotonic()
        while todo and got["finished"] and got["rounds"] < rounds:
            got["rounds"] += 1
            if name == "up --reboot":
                if root is not None:
                    stop_host(root)
                root = fresh_host(base / "p", "planted", scenario)
            elif got["rounds"] > 1:  # the host as the command found it: done, its engine running
                r = run(["--root", str(root), "up", "--reboot"], base / "p")
                if r.returncode != 0:
                    got["finished"] = False
                    got["runs"].append({"exit": r.returncode, "named": [], "before_round": got["rounds"],
                                        "tail": r.stderr.strip().splitlines()[-4:]})
                    break
            victims = base / "p" / f"victims-{name.replace(' ', '-')}-{got['rounds']}"
            victims.mkdir()
            r = plant_and_run(base / "p", root, victims, f, args, todo, done=DONE.get(name, 0), design=design)
            got["planted"] += r["planted"]
            got["runs"] += r["runs"]
            got["finished"] = r["finished"]
        out["commands"][name] = {"targets": {"files": f["files"], "dirs": f["dirs"]}, "skipped": f["skipped"],
                                 **got, "not_planted": sorted(todo), "table": _table(got["planted"]),
                                 "seconds": round(time.monotonic() - t_cmd, 1)}
        if not got["finished"]:
            break
    if root is not None:
        stop_host(root)
    out["seconds"] = {"discover": round(t_discover, 1), "total": round(time.monotonic() - t0, 1)}
    return out


def ours_touched(e: dict) -> bool:
    """A victim p2pkit or its modules wrote (or one no recorded program wrote: counted as p2pkit's)."""
    return e["victim_touched"] and (bool(set(e["written_by"]) & set(OURS)) or not e["written_by"])


def _table(planted: list[dict]) -> list[dict]:
    rows: dict = {}
    for e in planted:
        k = (e["kind"], e["outcome"])
        row = rows.setdefault(k, {"kind": e["kind"], "outcome": e["outcome"], "paths": 0, "victims": 0,
                                  "victims_p2pkit": 0, "victims_by_design": 0, "victims_others": 0})
        row["paths"] += 1
        if e["victim_touched"]:
            row["victims"] += 1
            row["victims_by_design" if "by_design" in e else "victims_p2pkit" if ours_touched(e)
                else "victims_others"] += 1
    return list(rows.values())


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
    ap.add_argument("--commands", default=None,
                    help="links: only these of " + ", ".join(n for n, _ in COMMANDS) + " (comma-separated; a cut)")
    ap.add_argument("--rounds", type=int, default=100, help="links: at most this many rounds a command (a cut)")
    ap.add_argument("--keys", default=None, help="values: only these profile keys (comma-separated)")
    ap.add_argument("--plan-per-kind", type=int, default=3, help="values: accepted values tried with `plan`, per kind")
    ap.add_argument("--json", type=Path, default=None, help="write every case and its table here")
    a = ap.parse_args()
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = set(cases) - {"links", "artifacts", "values"}
    if bad:
        ap.error(f"unknown case(s): {', '.join(sorted(bad))}")
    names = tuple(n.strip() for n in a.commands.split(",") if n.strip()) if a.commands else None
    unknown = set(names or ()) - {n for n, _ in COMMANDS}
    if unknown:
        ap.error(f"unknown command(s): {', '.join(sorted(unknown))}")
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
            lk = links(base / "l", a.scenario, names, a.rounds)
            out["links"] = lk
            for name, c in lk["commands"].items():
                print_table(f"links, {name}: {len(c['targets']['files'])} files and {len(c['targets']['dirs'])} "
                            f"directories written (every program), a link planted at each ({len(c['runs'])} runs, "
                            f"{c['rounds']} round(s), finished: {c['finished']}, not planted: {len(c['not_planted'])})",
                            c["table"])
            print(f"links: {lk['seconds']}")
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
        for c in out["links"]["commands"].values():
            bad |= any(t["victims_p2pkit"] for t in c["table"]) or not c["finished"]
        bad |= len(out["links"]["commands"]) < len(names or COMMANDS)
    if "values" in out:
        bad |= any(r["validate_exit"] == 70 or r.get("plan_exit") == 70 for r in out["values"]["rows"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
