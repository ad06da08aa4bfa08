"""Stand-in commands of the simulated host. Each prints what the real tool prints, in the real
format, from the simulated state, and fails the way the real one fails."""

from __future__ import annotations

import sys
from pathlib import Path

from p2pkit.sim import model
from p2pkit.sim.render import load_state

LEGEND_P2P = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""


def sim_root() -> Path:
    # <root>/usr/bin/<name>
    return Path(sys.argv[0]).resolve().parents[2]


def main(name: str, args: list[str]) -> int:
    root = sim_root()
    state = load_state(root)
    fn = {"nvidia-smi": nvidia_smi, "modinfo": modinfo}[name]
    return fn(root, state, args)


def nvidia_smi(root: Path, state: dict, args: list[str]) -> int:
    err = model.nvml_error(state)
    if err:
        if err == "Driver/library version mismatch":
            print("Failed to initialize NVML: Driver/library version mismatch")
            return 18
        if state["driver"].get("userspace") is None:
            print("nvidia-smi: command not found", file=sys.stderr)
            return 127
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    gpus = state["gpus"]
    if args[:2] == ["topo", "-p2p"] and len(args) == 3:
        st = model.p2p_status(state)
        n = len(gpus)
        head = " \t\x1b[4m" + "\t".join(f"GPU{i}" for i in range(n)) + "\t\x1b[0m\n"
        rows = "".join(f" GPU{i}\t" + "\t".join("X" if i == j else st for j in range(n)) + "\t\n"
                       for i in range(n))
        sys.stdout.write(head + rows + LEGEND_P2P)
        return 0
    if args == ["-q"]:
        mod = model.loaded(state)
        out = [f"\n==============NVSMI LOG==============\n\nDriver Version{' ' * 41}: {mod['version']}",
               f"CUDA Version{' ' * 43}: 13.2\n", f"Attached GPUs{' ' * 42}: {len(gpus)}"]
        for g in gpus:
            gen, width = model.link_max(g)
            out += [f"GPU 0000{g['bdf'].upper()}",
                    f"    Product Name{' ' * 39}: NVIDIA GeForce RTX 5090",
                    "    PCI", "        GPU Link Info", "            PCIe Generation",
                    f"                Max{' ' * 36}: {gen}", f"                Current{' ' * 32}: 1",
                    f"                Device Current{' ' * 25}: 1",
                    f"                Device Max{' ' * 29}: {g['gpu_max_gen']}",
                    f"                Host Max{' ' * 31}: {g['slot_gen']}",
                    "            Link Width", f"                Max{' ' * 36}: {width}x",
                    f"                Current{' ' * 32}: {width}x",
                    f"        Replays Since Reset{' ' * 24}: 0",
                    "    FB Memory Usage", f"        Total{' ' * 38}: {g['vram_gib'] * 1024 - 375} MiB",
                    "    BAR1 Memory Usage", f"        Total{' ' * 38}: {g['bar1_bytes'] >> 20} MiB"]
        print("\n".join(out))
        return 0
    if args and args[0] == "--version":
        print(f"NVIDIA-SMI version  : {state['driver']['userspace']}")
        return 0
    print(f"SIMULATED nvidia-smi: arguments not simulated: {' '.join(args)}", file=sys.stderr)
    return 2


def modinfo(root: Path, state: dict, args: list[str]) -> int:
    """modinfo [-k KVER] -F filename|srcversion|version nvidia: the module modprobe would load."""
    kver, field, names = state["kernel"], None, []
    it = iter(args)
    for a in it:
        if a == "-k":
            kver = next(it)
        elif a == "-F":
            field = next(it)
        else:
            names.append(a)
    mods = state["module"].get("installed_by_kernel", {}).get(kver)
    if not mods or names != ["nvidia"]:
        print(f"modinfo: ERROR: Module {' '.join(names)} not found.", file=sys.stderr)
        return 1
    # depmod prefers updates/dkms over kernel/drivers/video
    best = sorted(mods, key=lambda m: 0 if "/updates/" in m["filename"] else 1)[0]
    if field is None:
        print(f"filename:       {best['filename']}\nversion:        {best['version']}\n"
              f"srcversion:     {best['srcversion']}")
    else:
        print(best.get(field, ""))
    return 0

