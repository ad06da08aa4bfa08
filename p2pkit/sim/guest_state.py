"""A container host's simulated state, as its stand-ins save it (p2pkit/sim/guest.py has the rest):
/.p2pkit-sim/state.json and the files the loaded nvidia module shows in /sys, /proc and /dev."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from p2pkit.host import SIM_MARKER

ROOT = Path("/")


def load_state() -> dict:
    doc = json.loads((ROOT / SIM_MARKER).read_text())
    doc.pop("libraries", None)
    doc.pop("lends", None)
    return doc


def save(root: Path, state: dict) -> None:
    """The state written back, and what the loaded module shows in /sys, /proc and /dev made anew."""
    from p2pkit.sim import render

    in_container = Path("/run/host/container-manager").exists() or os.environ.get("container")  # noqa: SIM112
    if Path(root) != ROOT or not in_container or not (ROOT / SIM_MARKER).is_file():
        raise SystemExit(f"SIMULATED container host: the state of {root} is saved only inside its container")
    write_state(state)
    render.module_files(ROOT, state, clear=True)


def write_state(state: dict) -> None:
    from p2pkit.sim import render

    state["driver"]["userspace"] = render.userspace_on_disk(ROOT)  # what NVML would load: the files decide
    doc = {**state, "libraries": CONTAINER_LIBRARIES}
    path = ROOT / SIM_MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(".state.json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


# NVML and the GPUs under load answer from the state as on the simulated host; the machine reboots for
# real (systemctl reboot: the container's supervisor boots it again), so there is no machine library
CONTAINER_LIBRARIES = {"nvml": "p2pkit.sim.nvml", "devices": "p2pkit.sim.devices"}


def standin_text(name: str) -> str:
    return (f"#!{sys.executable}\n# SIMULATED stand-in for {name} (p2pkit container host: p2pkit/sim/guest.py)\n"
            f"import sys\nfrom p2pkit.sim.guest import main\nsys.exit(main({name!r}, sys.argv[1:]))\n")


def userspace_tools(install: bool) -> None:
    """The .run installer's /usr/bin/nvidia-smi (the GPU-facing tool it installs), or its removal."""
    smi = ROOT / "usr/bin/nvidia-smi"
    if install:
        smi.write_text(standin_text("nvidia-smi"))
        smi.chmod(0o755)
    else:
        smi.unlink(missing_ok=True)


