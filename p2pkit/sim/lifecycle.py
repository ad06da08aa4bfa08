"""Simulated host life: lay it out, and boot it again."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from p2pkit.core.errors import P2pkitError
from p2pkit.sim import provision, rules
from p2pkit.sim.render import load_state, render
from p2pkit.sim.standins import (
    daemon_reload,
    load_module,
    loader_next_cmdline,
    systemctl,
    write_grub_cfg,
    write_initramfs,
    write_loader,
    write_modules_dep,
)


def init(root: Path, state: dict) -> None:
    driver_version = state.get("driver_pin", "615.71.09")
    installer, sha = provision.make_installer(root, driver_version, gsp=state.get("installer_gsp", True),
                                              machine=state.get("arch", "x86_64"))
    import tomllib

    from p2pkit.core import config

    base = tomllib.loads(config.builtin_path(state["profile"]).read_text())
    fork, commit = provision.make_fork(root, driver_version, patched=base["p2p_module"].get("patched", True))
    provision.make_headers(root, state["kernel"])
    engine = provision.make_ninfer(root, dflash2_tp2=state.get("engine_dflash2_tp2", True))
    provision.make_ffmpeg(root, state.get("ffmpeg_modules", ("libavformat", "libavcodec", "libavutil",
                                                            "libswscale", "libcurl")))
    state["profile"] = str(provision.write_profile(root, state["profile"], installer, sha, fork, commit,
                                                   driver_version, engine,
                                                   vllm_patched=state.get("vllm_sm121_patch", True),
                                                   vllm_sass=tuple(state.get("vllm_sass", ("sm_120a", "sm_121a")))))

    prof = config.load(state["profile"])
    if prof.engine.recipe == "vllm" and not prof.engine.package:
        provision.make_vllm_wheels(root, prof.engine.wheels, state.get("flashinfer_version", "0.6.18"))
        # the running vLLM maps the NCCL of its environment's wheel (its workers run NCCL; P37)
        state.setdefault("engine_nccl", [f"{provision.engine_site(prof.engine.python)}/{provision.VLLM_NCCL}"])
    if prof.model.source:
        provision.make_hf_model(root, prof.model.source)
    for d in prof.model.nvme_paths:  # the n-gram table's local copy (SIMULATED: a few bytes)
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / d.lstrip("/") / "ple-table.bin").write_bytes(b"SIMULATED PLE n-gram table\n")
    if prof.model.draft_source:
        provision.make_hf_model(root, prof.model.draft_source, layers=2, shards=1)
    for d in ("etc/modprobe.d", "etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/default/grub.d",
              "etc/kernel/postinst.d", "etc/systemd/system", "var/cache", "lib/firmware"):
        (root / d).mkdir(parents=True, exist_ok=True)  # present on every Ubuntu 24.04 install
    user = state["driver"].get("userspace")
    if user and not state.get("stock_driver"):  # a box the scenario says was brought up: its installer's files
        lib = root / "usr/lib/x86_64-linux-gnu"
        lib.mkdir(parents=True, exist_ok=True)
        (lib / f"libnvidia-ml.so.{user}").write_text(f"SIMULATED libnvidia-ml {user}\n")
        (lib / "libnvidia-ml.so.1").unlink(missing_ok=True)
        (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{user}")
        fw = root / "lib/firmware/nvidia" / user
        fw.mkdir(parents=True, exist_ok=True)
        (fw / "gsp_ga10x.bin").write_text(f"SIMULATED GSP firmware {user}\n")
    stock = state.get("stock_driver")
    if stock:  # a stock DKMS driver installed from Ubuntu's packages, loaded at boot
        dkms = root / "lib/modules" / state["kernel"] / "updates/dkms"
        dkms.mkdir(parents=True, exist_ok=True)
        (dkms / "nvidia.ko").write_text(STOCK_KO.format(kernel=state["kernel"]).replace("580.95.05", stock))
        fw = root / "lib/firmware/nvidia" / stock
        fw.mkdir(parents=True, exist_ok=True)
        (fw / "gsp_ga10x.bin").write_text(f"stock GSP firmware {stock}\n")
        lib = root / rules.MULTIARCH_LIBDIR[state.get("arch", "x86_64")].lstrip("/")
        lib.mkdir(parents=True, exist_ok=True)
        (lib / f"libnvidia-ml.so.{stock}").write_text(f"stock libnvidia-ml {stock}\n")
        (lib / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{stock}")
        state["packages"]["nvidia-dkms-580"] = "ii"
        load_module(root, state)
    write_modules_dep(root, state["kernel"])
    write_initramfs(root, state["kernel"])  # every install has one; it holds whatever nvidia.ko resolves now
    if state.get("bootloader", "grub") == "grub":
        write_grub_cfg(root, state["cmdline"])  # what the installer's update-grub wrote for this boot
        etc_grub = root / "etc/default/grub"
        etc_grub.parent.mkdir(parents=True, exist_ok=True)
        # the options the running command line has beyond the image, root and ro came from here (a scenario
        # booted with iommu=pt already has it in its GRUB defaults): update-grub then writes this same grub.cfg
        extra = " ".join(w for w in state["cmdline"].split() if not w.startswith(("BOOT_IMAGE=", "root="))
                         and w != "ro") or "quiet splash"
        etc_grub.write_text(f'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="{extra}"\nGRUB_CMDLINE_LINUX=""\n')
    elif state["bootloader"] in ("systemd-boot", "kernelstub"):
        write_loader(root, state)
    render(root, state)


def reboot(root: Path) -> dict:
    """New boot id; the next kernel and command line; load whatever modprobe resolves, if it can load;
    every process of the old boot is gone, and systemd starts the enabled services again."""
    stop_services(root)
    shutil.rmtree(root / "run", ignore_errors=True)  # a tmpfs: nothing of the old boot's /run is left
    state = load_state(root)
    state["boot_id"] = str(uuid.uuid4())
    state["boots"] = state.get("boots", 1) + 1
    if state.get("next_kernel"):
        state["kernel"] = state.pop("next_kernel")
    # GRUB boots what update-grub wrote; systemd-boot (kernelstub's too) the default loader entry's
    # options; a loader the host cannot see (`cmdline_frozen`, or none p2pkit knows) what it had
    cmdline = state.pop("next_cmdline", None)
    loader = state.get("bootloader", "grub")
    if loader in ("systemd-boot", "kernelstub"):
        cmdline = loader_next_cmdline(root, state)
    if cmdline and loader in ("grub", "systemd-boot", "kernelstub") and not state.get("cmdline_frozen"):
        state["cmdline"] = cmdline
    enrol_queued_keys(state)
    state["module"]["loaded"] = None
    load_module(root, state)
    for svc in state.get("services", {}).values():
        svc["started"] = False
    # the manager of the new boot: every unit file read as it is now, the enabled timers started
    state["timers"] = {}
    daemon_reload(root, state)
    timers = root / "etc/systemd/system/timers.target.wants"
    for unit in sorted(p.name for p in timers.iterdir()) if timers.is_dir() else []:  # links into the root
        state["timers"][unit] = True
    render(root, state)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    for unit in sorted(p.name for p in wants.iterdir()) if wants.is_dir() else []:
        systemctl(root, load_state(root), ["start", unit])
    return load_state(root)


def enrol_queued_keys(state: dict) -> None:
    """MokManager at boot: the keys mokutil --import queued become enrolled (the operator typed the
    password); with Secure Boot off shim's MokManager still runs for a queued request."""
    mok = state.get("mok")
    if mok and mok.get("new"):
        mok["enrolled"] = [*mok.get("enrolled", []), *mok["new"]]
        mok["new"] = []


STOCK_KO = ("P2PKIT-SIM-KO\nname=nvidia\nversion=580.95.05\nsrcversion=5A1B2C3D4E5F60718293A4B5\npatched=0\n"
            "vermagic={kernel}\nsigned=1\nbuilder=buildd@lcy02-amd64-048\n")


def upgrade(root: Path, kernel: str, stock_module: bool, run_hooks: bool) -> list[str]:
    """An unattended upgrade: a new kernel (with headers), maybe a stock DKMS nvidia for it, the
    kernel's postinst hooks run with the new version (as the kernel package does). Boots into the
    new kernel at the next reboot. Returns what the hooks printed."""
    import subprocess

    state = load_state(root)
    provision.make_headers(root, kernel)
    state.setdefault("packages", {})[f"linux-image-{kernel}"] = "ii"
    if stock_module:
        dkms = root / "lib/modules" / kernel / "updates/dkms"
        dkms.mkdir(parents=True, exist_ok=True)
        (dkms / "nvidia.ko").write_text(STOCK_KO.format(kernel=kernel))
        state["packages"]["nvidia-dkms-580"] = "ii"
        # nvidia-dkms-580 depends on its version's GSP firmware package (nvidia-firmware-580-<version>):
        # apt installs the firmware with it, where the module finds it at load
        fw = root / "lib/firmware/nvidia/580.95.05"
        if not any(fw.glob("gsp_*.bin")):
            fw.mkdir(parents=True, exist_ok=True)
            (fw / "gsp_ga10x.bin").write_text("stock GSP firmware 580.95.05\n")
        state["packages"]["nvidia-firmware-580-580.95.05"] = "ii"
    state["next_kernel"] = kernel
    cmd = state.get("next_cmdline") or state["cmdline"]
    state["next_cmdline"] = cmd.replace(f"vmlinuz-{state['kernel']}", f"vmlinuz-{kernel}")
    render(root, state)
    write_modules_dep(root, kernel)  # the kernel package's postinst runs depmod and update-grub
    write_grub_cfg(root, state["next_cmdline"])
    out = []
    if run_hooks:
        hooks = sorted((root / "etc/kernel/postinst.d").glob("*"))
        for hook in hooks:
            if hook.is_file() and hook.stat().st_mode & 0o111:
                r = subprocess.run([str(hook), kernel, f"/boot/vmlinuz-{kernel}"], capture_output=True, text=True)
                out.append(f"{hook.name}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return out


def place_engine(root: Path, profile) -> None:
    """Stand in for the engine and model stages (not built yet): a SIMULATED engine binary where the
    engine stage would build it, and a small NInfer v3 container where the model stage would write it."""
    import json
    import struct
    import sys

    e = profile.engine
    exe = root / (e.python if e.recipe == "vllm" else f"{e.build_dir}/{rules.ENGINE_SERVER[e.recipe]}").lstrip("/")
    exe.parent.mkdir(parents=True, exist_ok=True)
    from p2pkit.sim.provision import P2PKIT_TREE

    exe.write_text(f"#!{sys.executable}\n# SIMULATED engine\nimport sys\nsys.path.append({P2PKIT_TREE!r})\n"
                   "from p2pkit.sim.engine import main\nmain()\n")
    exe.chmod(0o755)
    model = root / profile.model.output.lstrip("/")
    model.parent.mkdir(parents=True, exist_ok=True)
    header = json.dumps({"simulated": True, "components": profile.model.components}).encode()
    model.write_bytes(b"NINFER\0\x03" + struct.pack("<Q", len(header)) + header + bytes(16))


def stop_services(root: Path) -> list[str]:
    """Stop every simulated service that runs (the simulated engine really listens on loopback), as
    `systemctl stop` does through the host's stand-in; what that leaves running (the stand-in could not
    run, or the engine outlived it) the simulator stops itself: it started those processes. Returns
    what was running and is stopped now ("UNIT (pid N)"); raises SimStopFailed naming what still runs."""
    import subprocess

    from p2pkit.host import launcher  # an engine p2pkit's launcher started (a host without systemd)
    from p2pkit.sim.standins import STOP_TIMEOUT_S, _alive

    state = load_state(root)
    stopped, left, pids = [], [], []
    for unit, svc in state.get("services", {}).items():
        pid = svc.get("pid")
        running = bool(svc.get("started")) and _alive(pid)
        if not svc.get("started"):
            continue
        try:
            r = subprocess.run([str(root / "usr/bin/systemctl"), "stop", unit], check=False, capture_output=True,
                               text=True)
            why = (r.stderr or r.stdout).strip() or f"systemctl stop exited {r.returncode}"
        except OSError as e:  # the stand-in cannot start (the Python it was laid out with is gone): stopped here
            why = f"its systemctl cannot run: {e.strerror or e}"
        if running and launcher.session_members(pid):  # the stand-in did not stop it
            still = launcher.stop_session(pid, STOP_TIMEOUT_S)
            if still:
                left.append(f"{unit} (pid {', '.join(map(str, still))}; systemctl stop said: {why})")
                pids += still
                continue
        if running:
            stopped.append(f"{unit} (pid {pid})")
    res = launcher.stop(root / launcher.RECORD.lstrip("/"))
    if res.get("stopped"):
        still = launcher.session_members(res["pid"])
        (left if still else stopped).append(f"the launcher's engine (pid {res['pid']})")
        pids += still
    if left:
        raise SimStopFailed(root, stopped, left, pids)
    return stopped


class SimStopFailed(P2pkitError):
    """A simulated service that could not be stopped: it still runs (and listens)."""

    def __init__(self, root: Path, stopped: list[str], left: list[str], pids: list[int]):
        listed = " ".join(map(str, pids))
        super().__init__(f"could not stop {'; '.join(left)} on the simulated host at {root}: it survived SIGTERM "
                         "and SIGKILL" + (f" (stopped: {', '.join(stopped)})" if stopped else ""),
                         hint=f"see what holds it (`ps -o pid,stat,wchan:32,cmd -p {listed.replace(' ', ',')}`); it "
                              f"is a process of this machine: end it with `kill -9 {listed}`")
        self.stopped, self.left = stopped, left


class Machine:
    """The simulated host's machine, as its host object asks for it (`Host.reboot_in_place`)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def reboot(self) -> dict:
        return reboot(self.root)


def open(root: Path) -> Machine:
    return Machine(root)
