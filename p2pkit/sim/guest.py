"""SIMULATED hardware inside a container host's real root (p2pkit/sim/container.py).

Everything here runs inside the container, with the root's own Python and p2pkit, and stands in only
for what needs a GPU, its firmware or the running kernel. What it states is its own (the simulator's
rules: p2pkit/sim/rules.py, model.py); the tools around it are the root's real ones:

- provision: lays out what the box's owner would have to hand (NVIDIA's .run installer, the fork's
  repository, the NInfer source, a model to convert, the profile that pins them) and the stand-ins
  below, and records the simulated GPUs' state in /.p2pkit-sim/state.json.
- boot (p2pkit-sim-machine.service, before sysinit.target): what firmware, GRUB and the kernel do at
  each boot. The kernel release and command line come from the real /boot/grub/grub.cfg's default
  entry (as GRUB boots it); queued machine owner keys become enrolled (MokManager); the GPUs' PCI
  functions appear in sysfs (overlays on /sys, this boot's changes in /run); the nvidia module is
  loaded the way udev's coldplug would, if the real modprobe resolves one that this kernel accepts.
- modprobe and rmmod (/usr/sbin, where kmod's are; those diverted to .distrib): resolution, options and
  blacklists are the real kmod's (`modprobe -S RELEASE --show-depends`), the module's fields the real
  modinfo's; only the last step, the kernel accepting the module, is stood in: its vermagic against
  the running release, its signature against the enrolled keys with Secure Boot on, its GSP firmware
  on disk; then /sys/module, /proc/driver/nvidia and /dev/nvidia* appear as the loaded driver makes them.
- uname (/usr/bin, coreutils' diverted): the running kernel's release is the one booted from grub.cfg.
- nvidia-smi, NVML, the GPUs under load, mokutil, dmesg, nvcc: p2pkit/sim/standins.py's, over this state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from p2pkit.host import SIM_MARKER
from p2pkit.sim.guest_state import ROOT, load_state, save, standin_text, write_state

RUN = Path("/run/p2pkit-sim")  # this boot's own: the overlays' upper layers, /proc's replacements
UNIT = "p2pkit-sim-machine.service"
# sysfs directories the simulated devices appear in: an overlay each, the real sysfs below
SYS_OVERLAYS = ("/sys/bus/pci/devices", "/sys/devices", "/sys/module", "/sys/class", "/sys/firmware",
                "/sys/kernel/iommu_groups")
# The stand-ins and where they lie. An OS tool's stand-in lies where the real tool is (every PATH finds it,
# apt's hook PATH "/usr/sbin:/usr/bin:/sbin:/bin" too: apt's DPkg::Path, apt-pkg/deb/dpkgpm.cc), the package's
# file moved aside by dpkg-divert as Debian's own tools do it (dpkg-divert(1): --rename, to FILE.distrib), so
# that dpkg and apt know it: kmod's /sbin/modprobe and /sbin/rmmod, coreutils' /bin/uname, util-linux's
# /bin/dmesg (the package paths of bookworm, whose /sbin and /bin are links into /usr). mokutil is not in the
# image: its stand-in is where Debian's mokutil package puts it. The CUDA toolkit's (no OS tool: NVIDIA's
# own, in /usr/local) stay in /usr/local/bin.
STANDINS = {"modprobe": "usr/sbin", "rmmod": "usr/sbin", "mokutil": "usr/bin", "dmesg": "usr/bin", "uname": "usr/bin",
            "nvcc": "usr/local/bin", "cuobjdump": "usr/local/bin"}
DIVERTED = {"modprobe": "/sbin/modprobe", "rmmod": "/sbin/rmmod", "uname": "/bin/uname", "dmesg": "/bin/dmesg"}
REAL_UNAME = "/usr/bin/uname.distrib"  # coreutils' uname, moved aside for the stand-in
KMOD = "/usr/bin/kmod"  # modprobe, rmmod and modinfo are links to it; it acts as the name it is called by
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
# what a module built from the P2P fork carries in its code (p2pkit/sim/fork_tree.py puts it there): the
# simulated driver enables GeForce P2P exactly when the loaded module has it
P2P_MARK = b"P2PKIT-SIM-P2P-BAR1"


def in_container() -> bool:
    """Whether this runs in a container: systemd-nspawn leaves /run/host/container-manager, and sets
    $container for PID 1 and what it runs without a booted system."""
    return Path("/run/host/container-manager").exists() or bool(os.environ.get("container"))  # noqa: SIM112


def require_inside() -> None:
    if not (ROOT / SIM_MARKER).is_file():
        raise SystemExit(f"SIMULATED container host: no {SIM_MARKER} here: this is not a container host")
    if not in_container():
        raise SystemExit("SIMULATED container host: refusing to act outside a container (no "
                         "/run/host/container-manager): this would change the machine itself")


# ------------------------------------------------------------------------------------------- kmod

def kmod(name: str, args: list[str], **kw) -> subprocess.CompletedProcess:
    """The real kmod tool `name` (modprobe, rmmod, modinfo, depmod) with these arguments."""
    return subprocess.run([name, *args], executable=KMOD, capture_output=True, text=True, **kw)


def modinfo(path: str) -> dict[str, str]:
    """The real modinfo's fields of one module file (the simulator's own reading of its output: `key:`
    at the line start, a value that continues on indented lines, as kmod prints a signature)."""
    r = kmod("modinfo", [path])
    fields: dict[str, str] = {}
    key = None
    for line in r.stdout.splitlines():
        m = re.match(r"^([a-z_]+):\s*(.*)$", line)
        if m:
            key = m.group(1)
            fields[key] = (fields[key] + "," + m.group(2)) if key in fields and key in ("alias", "depends") \
                else m.group(2)
        elif key and line.startswith((" ", "\t")):
            fields[key] += line.strip()
    return fields


def resolve(state: dict, name: str = "nvidia") -> tuple[str | None, str, str]:
    """What the real modprobe would insert for `name` under the running kernel: (path, options, error)."""
    r = kmod("modprobe", ["-S", state["kernel"], "--show-depends", name])
    if r.returncode != 0:
        return None, "", (r.stderr.strip() or f"modprobe exit {r.returncode}")
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("insmod ")]
    if not last:
        return None, "", f"modprobe: {name} is built into the kernel"
    _, path, *opts = [*last[-1].split(" ", 2), ""]
    return path, " ".join(opts).strip(), ""


def load(state: dict, name: str = "nvidia") -> str | None:
    """The kernel loading `name`: None when it loaded, else the error modprobe prints."""
    from p2pkit.sim.model import loaded
    from p2pkit.sim.standins import signature_trusted

    if loaded(state) is not None:
        return None
    path, opts, err = resolve(state, name)
    state["module"]["load_error"] = None
    if path is None:
        state["module"]["load_error"] = err
        return err
    info = modinfo(path)
    magic = info.get("vermagic", "").split(" ")[0]
    fw = ROOT / "lib/firmware/nvidia" / info.get("version", "?")
    signed = {"signed": "1" if info.get("sig_id") else "0", "sig_key": info.get("sig_key", "") or "x"}
    if magic != state["kernel"]:
        err = (f"could not insert '{name}': Exec format error (the module's vermagic {magic!r} is not the running "
               f"kernel {state['kernel']!r})")
    elif state["secure_boot"] and not signature_trusted(state, signed):
        err = f"could not insert '{name}': Key was rejected by service"
    elif not any(fw.glob("gsp_*.bin")):
        err = f"could not insert '{name}': No such device (RmFetchGspRmImages: No firmware image found (error -2))"
    if err:
        state["module"]["load_error"] = err
        state.setdefault("dmesg", []).append(f"[   12.345678] {name}: {err}")
        return err
    code = Path(path).read_bytes()
    m = re.search(r'NVreg_RegistryDwords=("[^"]*"|\S+)', opts)
    state["module"]["loaded"] = {
        "version": info.get("version", ""), "srcversion": info.get("srcversion", ""), "path": path,
        "patched": P2P_MARK in code, "open": "MIT" in info.get("license", ""),
        "registry_dwords": m.group(1).strip('"') if m else "", "builder": "root@" + os.uname().nodename,
        "compiler": compiler()}
    return None


def compiler() -> str:
    """The compiler the module was built with, as NVIDIA's /proc/driver/nvidia/version names it (the last line
    of `gcc -v`: "gcc version 12.2.0 (Debian 12.2.0-14)"): this root's gcc, which kbuild ran."""
    try:
        said = subprocess.run(["gcc", "-v"], capture_output=True, text=True, timeout=30).stderr.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return next((ln.strip() for ln in reversed(said) if ln.startswith("gcc version")), "")


def unload(state: dict) -> str | None:
    """modprobe -r nvidia (and its companions): refused while a process holds a GPU."""
    from p2pkit.sim.model import loaded

    if loaded(state) is None:
        return None
    holders = gpu_holders()
    if holders:
        return "FATAL: Module nvidia is in use."
    state["module"]["loaded"] = None
    return None


def gpu_holders() -> list[int]:
    """Processes with a /dev/nvidia* open, read from /proc as fuser reads it."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd).startswith("/dev/nvidia"):
                    out.append(int(d.name))
                    break
        except OSError:
            continue
    return out


# ------------------------------------------------------------------------------------------- stand-ins

def main(name: str, args: list[str]) -> int:
    require_inside()
    if name in ("modprobe", "rmmod"):
        return modprobe_cmd(name, args)
    if name == "uname":
        return uname_cmd(args)
    from p2pkit.sim import standins

    return standins.main(name, args)


def _real(name: str, args: list[str]) -> int:
    sys.stdout.flush()
    os.execv(KMOD, [name, *args])
    return 127  # not reached


def modprobe_cmd(name: str, args: list[str]) -> int:
    """modprobe [-r] MODULE... / rmmod MODULE...: the nvidia modules are loaded and unloaded by the
    simulated kernel; everything else (and every query: -n, -c, --show-depends, -R) is the real kmod's,
    told the running kernel's release."""
    state = load_state()
    mods = [a for a in args if not a.startswith("-")]
    flags = [a for a in args if a.startswith("-")]
    remove = name == "rmmod" or bool({"-r", "--remove"} & set(flags))
    ours = mods and all(m.replace("-", "_") in NVIDIA_MODULES for m in mods)
    queries = {"-n", "--dry-run", "-c", "--showconfig", "--show-depends", "-D", "-R", "--resolve-alias"}
    if not ours or set(flags) & queries or (flags and not set(flags) <= {"-r", "--remove", "-q", "-v"}):
        if name == "modprobe" and "-S" not in args and "--set-version" not in " ".join(args):
            args = ["-S", state["kernel"], *args]
        return _real(name, args)
    if remove:
        err = unload(state)
        save(ROOT, state)
        if err:
            print(f"{name}: {err}" if name == "modprobe" else "rmmod: ERROR: Module nvidia is in use",
                  file=sys.stderr)
            return 1
        return 0
    if "nvidia" not in [m.replace("-", "_") for m in mods]:
        return 0  # the companions come with nvidia (its load makes them appear)
    err = load(state)
    save(ROOT, state)
    if err:
        print(f"modprobe: ERROR: {err}", file=sys.stderr)
        return 1
    return 0


def uname_cmd(args: list[str]) -> int:
    """The real uname, with the running kernel's release being the one booted from grub.cfg."""
    state = load_state()
    real = subprocess.run([REAL_UNAME, *args], capture_output=True, text=True)
    if real.returncode != 0:
        sys.stderr.write(real.stderr)
        return real.returncode
    release = os.uname().release
    sys.stdout.write(real.stdout.replace(release, state["kernel"]))
    return 0


# ------------------------------------------------------------------------------------------- boot

def grub_default() -> tuple[str, str] | None:
    """The kernel release and command line GRUB boots: the default entry of the real /boot/grub/grub.cfg
    (`set default="..."`: an index, a title or an id, or a "submenu>entry" path of them, as GRUB_DEFAULT
    names it; entry 0 when it names nothing there), its `linux` line as GRUB hands it to the kernel
    (BOOT_IMAGE= first). The simulator's own reading of grub-mkconfig's output."""
    try:
        text = (ROOT / "boot/grub/grub.cfg").read_text()
    except OSError:
        return None
    # 00_header sets default="${next_entry}" for a one-time boot (grub-reboot) and else GRUB_DEFAULT's value
    wanted = [v for v in re.findall(r'^\s*set default="([^"]*)"', text, re.M) if not v.startswith("${")]
    tree: list[dict] = []  # top-level menuentries and submenus, each {title, id, linux, children}
    stack: list[list[dict]] = [tree]
    depth_of: list[int] = []
    depth = 0
    current = None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"(menuentry|submenu)\s+'([^']*)'.*?(?:\$menuentry_id_option\s+'([^']*)')?\s*\{$", s)
        if m:
            node = {"title": m.group(2), "id": m.group(3) or "", "linux": None, "children": []}
            stack[-1].append(node)
            if m.group(1) == "submenu":
                stack.append(node["children"])
                depth_of.append(depth)
            else:
                current = node
        elif s.startswith("linux") and current is not None and current["linux"] is None:
            current["linux"] = s
        depth += s.count("{") - s.count("}")
        if current is not None and depth <= (depth_of[-1] + 1 if depth_of else 0):
            current = None
        while depth_of and depth <= depth_of[-1]:
            depth_of.pop()
            stack.pop()

    def pick(nodes: list[dict], want: str) -> dict | None:
        if want.isdigit():
            return nodes[int(want)] if int(want) < len(nodes) else None
        return next((n for n in nodes if want in (n["title"], n["id"])), None)

    chosen = None
    nodes = tree
    for part in (wanted[-1] if wanted else "0").split(">"):
        chosen = pick(nodes, part)
        if chosen is None:
            break
        nodes = chosen["children"]
    if chosen is None or chosen["children"]:
        chosen = tree[0] if tree else None
    if not chosen or not chosen["linux"]:
        return None
    _, image, *rest = chosen["linux"].split()
    m = re.search(r"vmlinuz-(\S+)$", image)
    if not m:
        return None
    return m.group(1), " ".join([f"BOOT_IMAGE={image}", *rest])


def boot() -> int:
    """This boot's firmware, GRUB and kernel, before systemd's sysinit (the unit p2pkit-sim-machine)."""
    from p2pkit.sim import render
    from p2pkit.sim.lifecycle import enrol_queued_keys

    require_inside()
    state = load_state()
    booted = grub_default()
    if booted:
        state["kernel"], state["cmdline"] = booted
    enrol_queued_keys(state)
    state["boots"] = state.get("boots", 0) + 1
    state["module"]["loaded"] = None
    state["dmesg"] = []
    RUN.mkdir(parents=True, exist_ok=True)
    for target in SYS_OVERLAYS:
        _overlay(target)
    (RUN / "proc-driver").mkdir(exist_ok=True)
    _bind(RUN / "proc-driver", "/proc/driver")
    (RUN / "cmdline").write_text(state["cmdline"] + "\n")
    _bind(RUN / "cmdline", "/proc/cmdline")
    (RUN / "osrelease").write_text(state["kernel"] + "\n")
    _bind(RUN / "osrelease", "/proc/sys/kernel/osrelease")
    render.gpu_files(ROOT, state)
    if resolve(state)[0] is not None:  # udev's coldplug: the GPUs' modalias loads nvidia when it resolves
        load(state)
    write_state(state)
    render.module_files(ROOT, state, clear=True)
    mod = state["module"]["loaded"]
    print(f"SIMULATED boot {state['boots']}: kernel {state['kernel']}, cmdline {state['cmdline']!r}, nvidia "
          + (f"{mod['version']} from {mod['path']}" if mod else f"not loaded ({state['module'].get('load_error')})"))
    return 0


def _mounted(target: str) -> bool:
    return any(line.split()[4] == target for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _overlay(target: str) -> None:
    if _mounted(target) and "overlay" in _fstype(target):
        return
    name = target.strip("/").replace("/", "-")
    upper, work = RUN / "ov" / name / "upper", RUN / "ov" / name / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={target},upperdir={upper},workdir={work}",
                    target], check=True)


def _fstype(target: str) -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == target:
            last = right.split()[0]
    return locals().get("last", "")


def _bind(source: Path, target: str) -> None:
    if not _mounted(target):
        subprocess.run(["mount", "--bind", str(source), target], check=True)


# ------------------------------------------------------------------------------------------- provision

UNIT_TEXT = """[Unit]
Description=SIMULATED firmware, GRUB and kernel of the p2pkit container host (GPUs, module loading)
Documentation=file:///usr/share/doc/p2pkit-sim/README
DefaultDependencies=no
Before=sysinit.target systemd-modules-load.service
ConditionPathExists=/.p2pkit-sim/state.json

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={python} -m p2pkit.sim.guest boot

[Install]
WantedBy=sysinit.target
"""


def provision(scenario: str, profile: str | None = None) -> int:
    """Lay the simulated GPUs and what their owner would have to hand into this root (not booted yet)."""
    import tomllib

    from p2pkit.core import config, tomlwrite
    from p2pkit.sim import fork_tree, scenarios
    from p2pkit.sim import provision as prov

    if not in_container():
        raise SystemExit("SIMULATED container host: provision runs only inside the container host's root")
    state = scenarios.build(scenario)
    if profile:  # another built-in profile on the same simulated box (vllm-cpu: the real vLLM's CPU build)
        state["profile"] = profile
    if scenario not in CONTAINER_SCENARIOS:
        raise SystemExit(f"SIMULATED container host: scenario {scenario!r} is the simulated host's only; the "
                         f"container host runs {', '.join(CONTAINER_SCENARIOS)}")
    image = json.loads(Path("/var/lib/p2pkit-sim/image.json").read_text())
    state.update(layout="container", kernel=image["running_kernel"], upgrade_kernel=image["upgrade_kernel"],
                 cpu_vendor=_cpu_vendor(), boots=0)
    for key in ("facts", "os", "packages", "grub_dropins"):
        state.pop(key, None)
    booted = grub_default()
    if booted:
        state["kernel"], state["cmdline"] = booted
    version = state.get("driver_pin", "615.71.09")
    installer, sha = prov.make_installer(ROOT, version, gsp=state.get("installer_gsp", True))
    base = tomllib.loads(config.builtin_path(state["profile"]).read_text())
    # the fork's shape with real modules; with resize_bar1, the fork's own pci_resize_resource() call, so the
    # tree builds on the image's running 6.1 kernel and fails, as 570.86.16-p2p does, where a stable update
    # gave that function a fourth argument (issue 37: the fork recorded on 6.1.0-47 and 6.1.0-57)
    fork, commit = fork_tree.make_fork_tree(ROOT / ".p2pkit-sim/git", version,
                                            patched=base["p2p_module"].get("patched", True),
                                            resize_bar1=state.get("fork_resize_bar1", False))
    engine = prov.make_ninfer(ROOT, dflash2_tp2=state.get("engine_dflash2_tp2", True))
    prov.make_ffmpeg(ROOT)
    path = prov.write_profile(ROOT, state["profile"], installer, sha, fork, commit, version, engine)
    data = tomllib.loads(path.read_text())
    # the container host's OS is Debian 12 with its 6.1 kernel, not the reference box's Ubuntu 24.04:
    # the profile says so, and preflight judges the real /etc/os-release and release against it
    # (its 6.1 kernel; the model it converts is a few MB, and its disk is this machine's)
    data["host"].update(os_id="debian", os_version="12", min_kernel="6.1", min_free_disk_gib=5)
    data["profile"]["description"] = data["profile"]["description"].replace(
        "SIMULATED host", "SIMULATED GPUs on a real Debian 12 (container host)")
    path.write_text(tomlwrite.dumps(data))
    state["profile"] = str(path)
    prof = config.load(str(path))
    if prof.model.source:
        prov.make_hf_model(ROOT, prof.model.source)
    for d in prof.model.nvme_paths:
        p = ROOT / d.lstrip("/")
        p.mkdir(parents=True, exist_ok=True)
        (p / "ple-table.bin").write_bytes(b"SIMULATED PLE n-gram table\n")
    if prof.model.draft_source:
        prov.make_hf_model(ROOT, prof.model.draft_source, layers=2, shards=1)
    for name, where in STANDINS.items():
        if name in DIVERTED:  # the package's own file moved aside, as dpkg knows it
            subprocess.run(["dpkg-divert", "--local", "--rename", "--add", DIVERTED[name]], check=True,
                           stdout=subprocess.DEVNULL)
        p = ROOT / where / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.unlink(missing_ok=True)  # never written through a link (kmod's tools are links to /bin/kmod)
        p.write_text(standin_text(name))
        p.chmod(0o755)
    unit = ROOT / "etc/systemd/system" / UNIT
    unit.write_text(UNIT_TEXT.format(python=sys.executable))
    wants = ROOT / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / UNIT).unlink(missing_ok=True)
    (wants / UNIT).symlink_to(f"../{UNIT}")
    doc = ROOT / "usr/share/doc/p2pkit-sim/README"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(__doc__)
    write_state(state)
    print(f"SIMULATED GPUs ({scenario}) provisioned: kernel {state['kernel']}, profile {path}")
    return 0


# the scenarios whose whole difference is in the GPUs, firmware and boot (the others change packages or
# files of a simulated Ubuntu that this real Debian root does not have)
CONTAINER_SCENARIOS = ("healthy", "small-bar", "secure-boot-on")


def _cpu_vendor() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "AuthenticAMD"


if __name__ == "__main__":
    cmd = sys.argv[1:2]
    if cmd == ["boot"]:
        sys.exit(boot())
    if cmd == ["provision"]:
        sc = sys.argv[sys.argv.index("--scenario") + 1] if "--scenario" in sys.argv else "healthy"
        prof = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None
        sys.exit(provision(sc, prof))
    sys.exit("usage: python -m p2pkit.sim.guest boot | provision [--scenario NAME] [--profile NAME]")
