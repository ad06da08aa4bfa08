"""The container host against the simulated host, in one run: the time to make the Debian image (cold:
an empty cache; cached: found), to make and boot a host from it, and `p2pkit up --reboot` on it (the
reboot a real one, the resume unit carrying on), then a kernel upgrade (the container host's: a real
apt-get install whose hook builds the module; the simulated host's: `sim upgrade`) and `rollback
p2p-module`, beside the same on a simulated host of the same scenario. Prints a table (markdown with
--markdown) and, with --json F, the figures.

Run by hand, as root: `python3 bench/bench_container.py [--cold] [--runs 1]`. --cold makes the image
in a new empty cache (a few minutes; the cached image is left alone). Not a test: nothing asserts a time."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, no install needed


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def container_up(image: Path, work: Path, wheel: Path) -> dict:
    from p2pkit.sim import container

    h = None
    try:
        t_make, h = timed(lambda: container.ContainerHost.create(work / "ct", image, wheel=wheel))
        t_boot, _ = timed(h.boot)
        boots = h.machine()["boots"]
        t0 = time.monotonic()
        h.p2pkit("--yes", "up", "--reboot", timeout=1800)
        h.wait_reboot(boots)
        while h.run(["systemctl", "is-active", "p2pkit-resume.service"], check=False).stdout.strip() in (
                "active", "activating"):
            time.sleep(0.5)
        t_up = time.monotonic() - t0
        st = json.loads(h.p2pkit("--json", "status").stdout)
        t_upgrade, apt = timed(h.upgrade_kernel)  # apt-get install of the newer kernel, its hooks building for it
        t_rollback, rb = timed(lambda: h.p2pkit("--yes", "rollback", "p2p-module"))
        return {"make_host_s": t_make, "boot_s": t_boot, "up_reboot_s": t_up, "upgrade_s": t_upgrade,
                "rollback_s": t_rollback, "all_done": st.get("all_done") and apt.returncode == 0
                and rb.returncode == 4}
    finally:
        if h is not None:
            h.stop()


def sim_up(work: Path) -> dict:
    exe = [sys.executable, "-c",
           "import sys; from p2pkit.cli.main import main; sys.argv[0] = 'p2pkit'; sys.exit(main())"]
    root = work / "sim"
    t_make, _ = timed(lambda: subprocess.run([*exe, "sim", "init", "--force", str(root)], check=True,
                                             capture_output=True))
    t_up, r = timed(lambda: subprocess.run([*exe, "--root", str(root), "up", "--reboot"], capture_output=True,
                                           text=True))
    t_upgrade, u = timed(lambda: subprocess.run([*exe, "sim", "upgrade", str(root)], capture_output=True))
    t_rollback, rb = timed(lambda: subprocess.run([*exe, "--root", str(root), "--yes", "rollback", "p2p-module"],
                                                  capture_output=True))
    subprocess.run([*exe, "sim", "stop", str(root)], capture_output=True)
    return {"make_host_s": t_make, "boot_s": 0.0, "up_reboot_s": t_up, "upgrade_s": t_upgrade,
            "rollback_s": t_rollback, "all_done": r.returncode == 0 and u.returncode == 0 and rb.returncode == 4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold", action="store_true", help="also make the image in a new, empty cache")
    ap.add_argument("--runs", type=int, default=1, help="host runs of each kind (medians are printed)")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    from p2pkit.sim import container

    why = container.cannot_boot()
    if why:
        print(f"this machine cannot boot a container host: {why}", file=sys.stderr)
        return 2
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="p2pkit-bench-ct-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        if a.cold:
            t, _ = timed(lambda: container.image(work / "cold-cache"))
            rows["image, cold"] = {"s": t}
        t, image = timed(container.image)
        rows["image, cached" if t < 60 else "image (made now)"] = {"s": t}
        wheel = container.build_wheel(work / "wheel")
        runs = [container_up(image, Path(tempfile.mkdtemp(dir=work)), wheel) for _ in range(a.runs)]
        sims = [sim_up(Path(tempfile.mkdtemp(dir=work))) for _ in range(a.runs)]
    fields = ("make_host_s", "boot_s", "up_reboot_s", "upgrade_s", "rollback_s")
    med = {k: {f: statistics.median(r[f] for r in v) for f in fields}
           for k, v in (("container host", runs), ("simulated host", sims))}
    lines = ["| what | container host | simulated host |", "|---|---|---|"]
    for f, label in (("make_host_s", "make a host (s)"), ("boot_s", "boot it (s)"),
                     ("up_reboot_s", "`up --reboot`, all nine stages (s)"),
                     ("upgrade_s", "kernel upgrade, the hook building for it (s)"),
                     ("rollback_s", "`rollback p2p-module` (s)")):
        lines.append(f"| {label} | {med['container host'][f]:.1f} | {med['simulated host'][f]:.1f} |")
    for k, v in rows.items():
        lines.append(f"| {k} (s) | {v['s']:.1f} | - |")
    ok = all(r["all_done"] for r in runs + sims)
    print("\n".join(lines) if a.markdown else "\n".join(ln.strip("|").replace("|", "\t") for ln in lines))
    print(f"all stages done in every run: {ok}")
    if a.json:
        a.json.write_text(json.dumps({"image": rows, "container": runs, "simulated": sims, "medians": med}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
