"""Stand-in commands of the simulated host. Each prints what the real tool prints, in the real
format, from the simulated state, changes the simulated host the way the real one changes a
real host, and fails the way the real one fails."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

STATE = ".p2pkit-sim/state.json"  # p2pkit.host.SIM_MARKER
# a file naming stand-ins (one a line) that hang as a wedged driver makes nvidia-smi hang: they
# sleep until they are killed (a test of every caller's limit); "NAME SECONDS" makes one only slow, as a
# machine under load makes every command slow: it answers after that many seconds
HANG = ".p2pkit-sim/hang"

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


def legend_topo() -> str:
    from p2pkit.sim.rules import SMI_TOPO_LEGEND

    return "\nLegend:\n\n  X    = Self\n" + "".join(f"  {k:<4} = {v}\n" for k, v in SMI_TOPO_LEGEND)


def sim_root() -> Path:
    """The simulated host this stand-in belongs to: the nearest parent holding the state file."""
    here = Path(sys.argv[0]).resolve()
    for d in here.parents:
        if (d / STATE).is_file():
            return d
    raise SystemExit(f"SIMULATED stand-in {here} is not inside a simulated host")


def load_state(root: Path) -> dict:
    """The state as p2pkit.sim.render.load_state reads it, without importing the renderer: a stand-in
    imports only what it prints (each runs in a Python of its own)."""
    doc = json.loads((root / STATE).read_text())
    doc.pop("libraries", None)
    doc.pop("lends", None)
    return doc


def save(root: Path, state: dict) -> None:
    """A stand-in's change written back: a simulated host laid out anew; on a container host its state
    file and the loaded module's files (p2pkit.sim.guest_state), never a layout over a real root."""
    if state.get("layout") == "container":
        from p2pkit.sim.guest_state import save as container_save

        container_save(root, state)
        return
    from p2pkit.sim.render import save as render_save

    render_save(root, state)


def main(name: str, args: list[str]) -> int:
    fn = {"nvidia-smi": nvidia_smi, "modinfo": modinfo,
          "update-initramfs": update_initramfs, "depmod": depmod, "update-grub": update_grub,
          "fuser": fuser, "modprobe": modprobe, "systemctl": systemctl, "journalctl": journalctl,
          "nvcc": nvcc, "uname": uname, "dmesg": dmesg, "lsinitramfs": lsinitramfs, "cuobjdump": cuobjdump,
          "kernelstub": kernelstub, "useradd": useradd, "usermod": usermod, "mokutil": mokutil,
          "sign-file": sign_file}.get(name)
    root = sim_root()
    if fn is None:  # a package tool's launcher from before it became a shell script
        from p2pkit.core.errors import STANDIN_CANNOT_RUN, STANDIN_EXIT

        scenario = load_state(root).get("scenario") or "healthy"
        sys.stderr.write(f"{STANDIN_CANNOT_RUN}the simulated host at {root} has a stand-in for {name} from an older "
                         f"p2pkit\nfix: lay it out again (its stages start anew): `p2pkit sim init --force {root} "
                         f"--scenario {scenario}`\n")
        return STANDIN_EXIT
    hang(root, name)
    return fn(root, load_state(root), args)


def hang(root: Path, name: str) -> None:
    """Sleep until killed when <root>/.p2pkit-sim/hang names this stand-in; sleep SECONDS first where its line
    says "NAME SECONDS"."""
    import time

    try:
        lines = [ln.split() for ln in (root / HANG).read_text().splitlines()]
    except OSError:
        return
    for words in lines:
        if words[:1] == [name] and len(words) == 2:
            time.sleep(float(words[1]))
            return
        while words == [name]:
            time.sleep(3600)


# ---------------------------------------------------------------------------------------- modules

def read_ko(path: Path) -> dict | None:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("P2PKIT-SIM-KO"):
        return None
    return dict(line.split("=", 1) for line in text.splitlines()[1:] if "=" in line)


def resolve_module(root: Path, kver: str, name: str = "nvidia") -> tuple[str, dict] | None:
    """What modprobe would load: depmod prefers updates/ (DKMS) over kernel/."""
    base = root / "lib/modules" / kver
    found = [p for p in base.rglob(f"{name}.ko") if read_ko(p)] if base.is_dir() else []
    if not found:
        return None
    best = sorted(found, key=lambda p: (0 if "/updates/" in str(p) else 1, str(p)))[0]
    return "/" + str(best.relative_to(root)), read_ko(best)


def modprobe_option(root: Path, name: str) -> str:
    """The value modprobe.d gives the nvidia module's option `name` when it loads (the last one wins)."""
    value = ""
    for conf in sorted((root / "etc/modprobe.d").glob("*.conf")):
        for line in conf.read_text().splitlines():
            m = re.match(rf'^\s*options\s+nvidia\s+.*\b{name}=("[^"]*"|\S+)', line)
            if m:
                value = m.group(1).strip('"')
    return value


def load_module(root: Path, state: dict) -> str | None:
    """What `modprobe nvidia` does: load the module depmod resolves, or fail the way the kernel does."""
    state["module"]["load_error"] = None
    hit = resolve_module(root, state["kernel"])
    if hit is None:
        state["module"]["load_error"] = "Module nvidia not found in directory /lib/modules/" + state["kernel"]
        return state["module"]["load_error"]
    path, info = hit
    fw = root / "lib/firmware/nvidia" / info["version"]
    if state["secure_boot"] and not signature_trusted(state, info):
        state["module"]["load_error"] = "Key was rejected by service (Secure Boot: module not signed)"
    elif not any(fw.glob("gsp_*.bin")):
        state["module"]["load_error"] = f"RmFetchGspRmImages: No firmware image found (error -2) in {fw}"
    else:
        state["module"]["loaded"] = {"version": info["version"], "srcversion": info["srcversion"],
                                     "patched": info.get("patched") == "1", "builder": info.get("builder"),
                                     "path": path, "registry_dwords": modprobe_option(root, "NVreg_RegistryDwords")}
    return state["module"]["load_error"]


def modinfo(root: Path, state: dict, args: list[str]) -> int:
    """modinfo [-k KVER] [-F FIELD] nvidia|/path/to/nvidia.ko"""
    kver, field, names = state["kernel"], None, []
    it = iter(args)
    for a in it:
        if a == "-k":
            kver = next(it)
        elif a == "-F":
            field = next(it)
        else:
            names.append(a)
    if len(names) != 1:
        print("modinfo: ERROR: missing module or filename.", file=sys.stderr)
        return 1
    if "/" in names[0]:
        info = read_ko(Path(names[0]))
        filename = names[0]
    else:
        hit = resolve_module(root, kver, names[0])
        filename, info = hit if hit else (None, None)
    if info is None:
        print(f"modinfo: ERROR: Module {names[0]} not found.", file=sys.stderr)
        return 1
    info = {**info, "filename": filename}
    if field is None:
        for k in ("filename", "version", "srcversion", "vermagic"):
            print(f"{k + ':':<16}{info.get(k, '')}")
        if info.get("signed") == "1":  # kmod prints a PKCS#7 signature's fields after vermagic
            print(f"{'sig_id:':<16}PKCS#7")
            for k in ("signer", "sig_key", "sig_hashalgo"):
                print(f"{k + ':':<16}{info.get(k, '')}")
    else:
        print(info.get(field, ""))
    return 0


def fuser(root: Path, state: dict, args: list[str]) -> int:
    """fuser -v FILE...: the processes holding the GPU device nodes (to stderr, as the real one)."""
    from p2pkit.sim import model

    if state.get("fuser_broken"):  # a test's host whose fuser gives no answer (psmisc half-removed, say)
        print("fuser: error while loading shared libraries: libc.so.6", file=sys.stderr)
        return 127
    holders = state.get("gpu_holders", []) if model.loaded(state) else []
    if not holders:
        return 1
    print(f"{'USER':>25} {'PID':>9} ACCESS COMMAND", file=sys.stderr)
    for h in holders:
        print(f"/dev/nvidia0:{'root':>13} {h['pid']:>9} F...m {h['command']}", file=sys.stderr)
    return 0


def modprobe(root: Path, state: dict, args: list[str]) -> int:
    """modprobe -r MODULES... (fails while something holds the GPU) and modprobe nvidia."""
    from p2pkit.sim import model

    if args and args[0] == "-r":
        if model.loaded(state) is None:
            return 0
        if state.get("gpu_holders"):
            print("modprobe: FATAL: Module nvidia is in use.", file=sys.stderr)
            return 1
        state["module"]["loaded"] = None
        save(root, state)
        return 0
    if args == ["nvidia"]:
        if model.loaded(state) is not None:
            return 0
        err = load_module(root, state)
        save(root, state)
        if err:
            print(f"modprobe: ERROR: could not insert 'nvidia': {err}", file=sys.stderr)
            return 1
        return 0
    print(f"SIMULATED modprobe: arguments not simulated: {' '.join(args)}", file=sys.stderr)
    return 1


def depmod(root: Path, state: dict, args: list[str]) -> int:
    """depmod [-b ROOT] [KVER]: modules.dep lists every module under /lib/modules/KVER, as depmod's map does."""
    state.setdefault("log", []).append("depmod " + " ".join(args))
    save(root, state)
    kver = next((a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-b")),
                state["kernel"])
    write_modules_dep(root, kver)
    return 0


def write_modules_dep(root: Path, kver: str) -> None:
    """/lib/modules/KVER/modules.dep: one `path:` line per module (the simulated modules need none)."""
    base = root / "lib/modules" / kver
    if base.is_dir():
        mods = sorted(str(p.relative_to(base)) for p in base.rglob("*.ko*") if p.is_file())
        (base / "modules.dep").write_text("".join(f"{m}:\n" for m in mods))


def update_initramfs(root: Path, state: dict, args: list[str]) -> int:
    """update-initramfs -u [-k KVER]: the image holds the nvidia.ko modprobe resolves now, and modprobe.d."""
    kver = args[args.index("-k") + 1] if "-k" in args else state["kernel"]
    mods = root / "lib/modules"
    kernels = sorted(p.name for p in mods.iterdir() if p.is_dir()) if kver == "all" and mods.is_dir() else [kver]
    state["initramfs_updates"] = state.get("initramfs_updates", 0) + 1
    save(root, state)
    for k in kernels:
        write_initramfs(root, k)
        print(f"update-initramfs: Generating /boot/initrd.img-{k} (SIMULATED)")
    return 0


def write_initramfs(root: Path, kver: str) -> None:
    """/boot/initrd.img-KVER as a SIMULATED image: the listing lsinitramfs prints."""
    files = ["usr/lib/modprobe.d/blacklist_linux_" + kver + ".conf", "usr/lib/modules/" + kver + "/modules.dep"]
    hit = resolve_module(root, kver)
    if hit is not None:
        files.append("usr" + hit[0])
    files += [f"etc/modprobe.d/{c.name}" for c in sorted((root / "etc/modprobe.d").glob("*.conf"))]
    img = root / "boot" / f"initrd.img-{kver}"
    img.parent.mkdir(parents=True, exist_ok=True)
    img.write_text("P2PKIT-SIM-INITRAMFS\n" + "\n".join(files) + "\n")


def lsinitramfs(root: Path, state: dict, args: list[str]) -> int:
    img = Path(args[-1]) if args else None
    if img is None or not img.is_file():
        print(f"lsinitramfs: {img}: No such file or directory", file=sys.stderr)
        return 1
    lines = img.read_text().splitlines()
    print("\n".join(lines[1:] if lines[:1] == ["P2PKIT-SIM-INITRAMFS"] else []))
    return 0


def dmesg(root: Path, state: dict, args: list[str]) -> int:
    """The kernel ring buffer: the scenario's lines; refused as the real one is under dmesg_restrict=1."""
    if state.get("dmesg_restrict"):
        print("dmesg: read kernel buffer failed: Operation not permitted", file=sys.stderr)
        return 1
    lines = ["[    0.000000] Linux version " + state["kernel"] + " (SIMULATED)", *state.get("dmesg", [])]
    print("\n".join(lines))
    return 0


def cuobjdump(root: Path, state: dict, args: list[str]) -> int:
    """cuobjdump --list-elf LIB: the simulated library names its architectures on lines `sass=sm_NNN`."""
    lib = Path(args[-1]) if args else None
    if args[:1] != ["--list-elf"] or lib is None or not lib.is_file():
        print(f"cuobjdump fatal   : Could not open input file '{lib}'", file=sys.stderr)
        return 1
    archs = [ln[5:] for ln in lib.read_text(errors="replace").splitlines() if ln.startswith("sass=")]
    stem = lib.name.split(".so")[0]
    for i, a in enumerate(archs, 1):
        print(f"ELF file {i:>4}: {stem}.{i}.{a}.cubin")
    return 0


def update_grub(root: Path, state: dict, args: list[str]) -> int:
    """Compose the next boot's command line from /etc/default/grub and /etc/default/grub.d/*.cfg."""
    value = ""
    files = [root / "etc/default/grub", *sorted((root / "etc/default/grub.d").glob("*.cfg"))]
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r'^\s*GRUB_CMDLINE_LINUX_DEFAULT="(.*)"\s*$', line)
            if m:
                value = m.group(1).replace("$GRUB_CMDLINE_LINUX_DEFAULT", value).strip()
    kernel = state.get("next_kernel") or state["kernel"]
    state["next_cmdline"] = f"BOOT_IMAGE=/boot/vmlinuz-{kernel} root=UUID=5d0c7a51 ro {value}".strip()
    save(root, state)
    write_grub_cfg(root, state["next_cmdline"])
    print(f"Generating grub configuration file ...\nFound linux image: /boot/vmlinuz-{kernel}\ndone (SIMULATED)",
          file=sys.stderr)
    return 0


def write_grub_cfg(root: Path, cmdline: str) -> None:
    """/boot/grub/grub.cfg as update-grub writes it, reduced to its default entry and the recovery
    entry (which gets no GRUB_CMDLINE_LINUX_DEFAULT): what GRUB boots from until the next update-grub."""
    image, _, rest = cmdline.removeprefix("BOOT_IMAGE=").partition(" ")
    base = " ".join(w for w in rest.split() if w in ("ro",) or w.startswith("root="))
    kver = image.rsplit("vmlinuz-", 1)[-1]
    cfg = root / "boot/grub/grub.cfg"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("# SIMULATED by p2pkit's update-grub stand-in\n"
                   f"menuentry 'Ubuntu' --class ubuntu --class gnu-linux --class gnu --class os {{\n"
                   f"\tlinux\t{image} {rest} $vt_handoff\n\tinitrd\t/boot/initrd.img-{kver}\n}}\n"
                   f"submenu 'Advanced options for Ubuntu' {{\n"
                   f"\tmenuentry 'Ubuntu, with Linux {kver} (recovery mode)' {{\n"
                   f"\t\tlinux\t{image} {base} recovery nomodeset dis_ucode_ldr\n"
                   f"\t\tinitrd\t/boot/initrd.img-{kver}\n\t}}\n}}\n")


# ---------------------------------------------------------------------------------------- systemd-boot, kernelstub
# The simulator's own copy of the formats (never the product's parsers): systemd's
# 90-loaderentry.install writes `key  value` lines; kernelstub (pop-os/kernelstub, installer.py
# make_loader_entry) writes title/linux/initrd/options to <ESP>/loader/entries/Pop_OS-current.conf
# and keeps its options in /etc/kernelstub/configuration (config.py: JSON, indent 2, `default` and
# `user` sections). The next boot's command line is the default entry's options (systemd-boot
# puts an initrd= word for the entry's initrd before them).

ESP = "boot/efi"
KERNELSTUB_CONFIG = "etc/kernelstub/configuration"


def write_loader(root: Path, state: dict) -> None:
    """The ESP as `bootctl install` and the kernel's kernel-install (systemd-boot) or kernelstub
    (Pop!_OS) leave it, with one entry for the running kernel carrying the running options."""
    kver = state["kernel"]
    opts = " ".join(w for w in state["cmdline"].split() if not w.startswith(("initrd=", "BOOT_IMAGE=")))
    loader = root / ESP / "loader"
    (loader / "entries").mkdir(parents=True, exist_ok=True)
    if state["bootloader"] == "kernelstub":
        (loader / "loader.conf").write_text("default Pop_OS-current\n")
        (loader / "entries/Pop_OS-current.conf").write_text(
            "title Pop!_OS\nlinux /EFI/Pop_OS-5d0c7a51/vmlinuz.efi\ninitrd /EFI/Pop_OS-5d0c7a51/initrd.img\n"
            f"options {opts}\n")
        user = [w for w in opts.split() if w != "ro" and not w.startswith("root=")]
        doc = {"default": {"kernel_options": ["quiet", "splash"], "esp_path": "/boot/efi", "setup_loader": False,
                           "manage_mode": False, "force_update": False, "live_mode": False, "unified_kernel": False,
                           "config_rev": 4},
               "user": {"kernel_options": user, "esp_path": "/boot/efi", "setup_loader": True, "manage_mode": True,
                        "force_update": False, "live_mode": False, "unified_kernel": False, "config_rev": 4}}
        (root / KERNELSTUB_CONFIG).parent.mkdir(parents=True, exist_ok=True)
        (root / KERNELSTUB_CONFIG).write_text(json.dumps(doc, indent=2))
        return
    mid = state["machine_id"]
    (loader / "loader.conf").write_text("#timeout 3\n#console-mode keep\n")
    (loader / "entries" / f"{mid}-{kver}.conf").write_text(
        f"title      {state['os']['PRETTY_NAME']}\nversion    {kver}\nmachine-id {mid}\nsort-key   ubuntu\n"
        f"options    {opts}\nlinux      /{mid}/{kver}/linux\ninitrd     /{mid}/{kver}/initrd.img-{kver}\n")


def loader_next_cmdline(root: Path, state: dict) -> str | None:
    """What systemd-boot boots next: loader.conf's `default` entry (a glob), else the entry of the
    kernel booting next; its options after an initrd= word for its initrd."""
    entries = root / ESP / "loader/entries"
    conf = root / ESP / "loader/loader.conf"
    default = next((ln.split(None, 1)[1].strip() for ln in conf.read_text().splitlines()
                    if ln.startswith("default ")), None) if conf.is_file() else None
    kver = state.get("next_kernel") or state["kernel"]
    pattern = (default if default.endswith(".conf") else default + ".conf") if default else f"*-{kver}.conf"
    found = sorted(entries.glob(pattern))
    if not found:
        return None
    keys: dict[str, list[str]] = {}
    for line in found[-1].read_text().splitlines():
        k, _, v = line.strip().partition(" ")
        keys.setdefault(k, []).append(v.strip())
    initrd = [w.replace("/", "\\") for w in keys.get("initrd", [])]
    return " ".join([*(f"initrd={w}" for w in initrd), *keys.get("options", [])])


def kernelstub(root: Path, state: dict, args: list[str]) -> int:
    """-a/--add-options "OPTS": add each option the user section lacks, save the configuration, and
    write the loader entry again with `root=UUID=... ro` and the options (kernelstub's own order)."""
    if len(args) != 2 or args[0] not in ("-a", "--add-options"):
        print("SIMULATED kernelstub: only -a/--add-options \"OPTIONS\" is simulated", file=sys.stderr)
        return 2
    cfg = root / KERNELSTUB_CONFIG
    doc = json.loads(cfg.read_text())
    opts = doc["user"]["kernel_options"]
    for o in args[1].split():
        if o not in opts:
            opts.append(o)
    cfg.write_text(json.dumps(doc, indent=2))
    entry = root / ESP / "loader/entries/Pop_OS-current.conf"
    lines = [ln for ln in entry.read_text().splitlines() if not ln.startswith("options ")]
    entry.write_text("\n".join([*lines, f"options root=UUID=5d0c7a51 ro {' '.join(opts)}"]) + "\n")
    return 0


# ---------------------------------------------------------------------------------------- driver

def uname(root: Path, state: dict, args: list[str]) -> int:
    """-m and -r answer for the simulated host (its architecture, its kernel); anything else is
    this machine's real uname."""
    if args in (["-m"], ["-r"]):
        print(state.get("arch", "x86_64") if args == ["-m"] else state["kernel"])
        return 0
    sys.stdout.flush()
    os.execv("/usr/bin/uname", ["uname", *args])
    return 127  # not reached


def installer(version: str, gsp: bool, args: list[str], path: str | None = None, md5: str | None = None) -> int:
    """The NVIDIA .run installer: only the userspace part (--no-kernel-modules) is simulated, and
    makeself's `--check` of the payload's MD5 (its messages as makeself prints them). It puts
    libnvidia-ml into the multiarch directory of the simulated host's architecture."""
    from p2pkit.sim.rules import MULTIARCH_LIBDIR

    if "--check" in args:
        import hashlib

        from p2pkit.sim.provision import PAYLOAD_MARKER

        text = Path(path or sys.argv[0]).read_text(encoding="utf-8", errors="replace")
        got = hashlib.md5(text.partition(PAYLOAD_MARKER)[2].encode()).hexdigest()
        if got != md5:
            print(f"Verifying archive integrity...Error in MD5 checksums: {got} is different from {md5}",
                  file=sys.stderr)
            return 2
        print("Verifying archive integrity...  100%   MD5 checksums are OK. All good.")
        return 0
    root = sim_root()
    state = load_state(root)
    machine = state.get("arch", "x86_64")
    lib = root / MULTIARCH_LIBDIR[machine].lstrip("/")
    so1 = lib / "libnvidia-ml.so.1"
    if "--uninstall" in args:  # removes what it installed, its libnvidia-ml.so.1 link with it
        for f in lib.glob(f"libnvidia-ml.so.{version}"):
            f.unlink()
        if so1.is_symlink() and os.readlink(so1) == f"libnvidia-ml.so.{version}":
            so1.unlink()
        fw = root / "lib/firmware/nvidia" / version
        if fw.is_dir():
            for f in fw.iterdir():
                f.unlink()
            fw.rmdir()
        if state.get("layout") == "container":
            from p2pkit.sim import guest_state

            guest_state.userspace_tools(install=False)
        save(root, state)
        print(f"Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for Linux-{machine} ({version}) "
              "is complete. (SIMULATED)")
        return 0
    if "--no-kernel-modules" not in args:
        print("SIMULATED installer: only `--silent --no-kernel-modules` is simulated", file=sys.stderr)
        return 1
    lib.mkdir(parents=True, exist_ok=True)
    for old in lib.glob("libnvidia-ml.so.*"):  # another driver's libraries and links go (kept nowhere)
        old.unlink()
    (lib / f"libnvidia-ml.so.{version}").write_text(f"SIMULATED libnvidia-ml {version}\n")
    so1.symlink_to(f"libnvidia-ml.so.{version}")
    if gsp:
        fw = root / "lib/firmware/nvidia" / version
        fw.mkdir(parents=True, exist_ok=True)
        for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            (fw / name).write_text(f"SIMULATED GSP firmware {version}\n")
    if state.get("layout") == "container":  # a simulated host lays its nvidia-smi out with the host
        from p2pkit.sim import guest_state

        guest_state.userspace_tools(install=True)
    save(root, state)
    print(f"Installation of the NVIDIA Accelerated Graphics Driver for Linux-{machine} (version: {version}) is now "
          "complete. (SIMULATED)")
    return 0


# ---------------------------------------------------------------------------------------- nvidia-smi

def nvidia_smi(root: Path, state: dict, args: list[str]) -> int:
    from p2pkit.sim import model

    if state["driver"].get("userspace") is None:
        print("nvidia-smi: command not found", file=sys.stderr)
        return 127
    err = model.nvml_error(state)
    if err == "Driver/library version mismatch":
        print("Failed to initialize NVML: Driver/library version mismatch")
        return 18
    if err:
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
    if args == ["topo", "-m"]:  # the layout of the real one (tests/fixtures/topo_m): a switch reads PIX
        n = len(gpus)
        rel = "PIX" if any(g.get("switch") for g in gpus) else state.get("topo_relation", "PHB")
        cols = [*(f"GPU{i}" for i in range(n)), "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
        head = "\t\x1b[4m" + "\t".join(cols) + "\x1b[0m\n"
        rows = "".join(f"GPU{i}\t" + "\t".join(" X " if i == j else rel for j in range(n)) + "\t0-31\t0\t\tN/A\n"
                       for i in range(n))
        sys.stdout.write(head + rows + legend_topo())
        return 0
    print(f"SIMULATED nvidia-smi: arguments not simulated: {' '.join(args)}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------------------- systemd

def _unit(root: Path, unit: str) -> dict:
    """ExecStart and EnvironmentFile of a unit under the simulated /etc/systemd/system."""
    from p2pkit.core import writers

    path = root / "etc/systemd/system" / unit
    out: dict = {"path": path, "exists": path.is_file(), "env": {}}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        k, _, v = line.partition("=")
        if k == "ExecStart":
            out["exec"] = v
        elif k == "ExecStartPre":
            out.setdefault("pre", []).append(v)
        elif k == "EnvironmentFile":
            envf = root / v.lstrip("-").lstrip("/")
            if envf.is_file():
                for ln in envf.read_text().splitlines():
                    if "=" in ln and not ln.lstrip().startswith("#"):
                        a, _, b = ln.partition("=")  # NAME="value" with \ " $ ` escaped, as systemd reads it
                        out["env"][a.strip()] = writers.env_value(b.strip())
        elif k == "MemoryMax":
            out["memory_max"] = v
        elif k == "Slice":
            out["slice"] = v
        elif k == "WorkingDirectory":
            out["cwd"] = v
        elif k == "User":
            out["user"] = v
    return out


def _alive(pid: int | None) -> bool:
    """Whether the process runs and is not a zombie: the state letter of /proc/PID/stat, after the
    command name in parentheses (proc(5)); what psutil reads, without importing it."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def service_state(state: dict, unit: str) -> tuple[str, int]:
    svc = state.get("services", {}).get(unit)
    if not svc:
        return "inactive", 0
    if svc.get("started") and _alive(svc.get("pid")):
        return "active", svc["pid"]
    return ("failed" if svc.get("started") else "inactive"), 0


def _start(root: Path, state: dict, unit: str) -> int:
    import shlex
    import subprocess

    u = _unit(root, unit)
    if not u.get("exec"):
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5

    def host_argv(line: str) -> list[str]:  # paths in the simulated root point into it: those that exist,
        # and files the engine creates in a directory that exists there (its request log)
        words = [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(line)]  # systemd's escapes
        return [str(root / a.lstrip("/")) if a.startswith("/") and ((root / a.lstrip("/")).exists()
                                                                    or (root / a.lstrip("/")).parent.is_dir()) else a
                for a in words]

    for pre in u.get("pre", []):  # ExecStartPre, in order; "-" tolerates a failure, "+" is privileges
        optional = pre.startswith("-")
        r = subprocess.run(host_argv(pre.lstrip("+-!")), capture_output=True, text=True)
        if r.returncode and not optional:
            print(f"Job for {unit} failed because the control process exited with error code "
                  f"(ExecStartPre: exit {r.returncode}: {r.stderr.strip()[-200:]})", file=sys.stderr)
            state.setdefault("services", {})[unit] = {"pid": None, "started": True}
            save(root, state)
            return 1
    u = _unit(root, unit)  # environment files are read after ExecStartPre, as systemd does
    argv = host_argv(u["exec"])
    log = root / "var/log/p2pkit" / f"{unit}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", **{k: (host_argv(v) or [v])[0] if v.startswith("/") else v
                                       for k, v in u["env"].items()}, **state.get("engine_env", {})}
    # WorkingDirectory= as systemd sets it (the engine's relative paths, e.g. NInfer's request log, land there)
    cwd = root / u["cwd"].lstrip("-/") if u.get("cwd") else None
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, cwd=cwd if cwd and cwd.is_dir() else None)
    state.setdefault("services", {})[unit] = {"pid": proc.pid, "started": True, "slice": u.get("slice"),
                                              "memory_max": u.get("memory_max", "max")}
    save(root, state)
    return 0


STOP_TIMEOUT_S = 60.0  # the engine unit's TimeoutStopSec= (p2pkit_service's template)


def _stop(root: Path, state: dict, unit: str) -> int:
    """As systemd stops a unit: SIGTERM to every process of it (the engine's session here), a wait of
    TimeoutStopSec, then SIGKILL to what is left; `systemctl stop` returns when they are gone."""
    from p2pkit.host.launcher import stop_session

    svc = state.get("services", {}).get(unit)
    left = stop_session(svc["pid"], STOP_TIMEOUT_S) if svc and _alive(svc.get("pid")) else []
    if svc:
        svc["started"] = bool(left)
    save(root, state)
    if left:
        print(f"Failed to stop {unit}: processes {', '.join(map(str, left))} survived SIGKILL", file=sys.stderr)
        return 1
    return 0


def systemctl(root: Path, state: dict, args: list[str]) -> int:
    """Offline verbs (--root, enable, is-enabled, disable) go to the real systemctl against the
    simulated root; runtime verbs (start, stop, show, ...) are simulated with real processes. The manager's
    memory is simulated as systemd keeps it: the unit files as it read them at the last daemon-reload (or
    boot), so that a file edited or removed since says NeedDaemonReload=yes and a timer that runs stays
    loaded after its file is gone (systemd(1), "daemon-reload"; systemctl(1), "show")."""
    args = [a.strip("'") for a in args if a not in ("--no-block", "--no-pager", "-l", "--system")]
    if any(a.startswith("--root") for a in args) or (args and args[0] in ("enable", "disable", "is-enabled")):
        return _real_systemctl(root, args)
    verb, units = (args[0], args[1:]) if args else ("", [])
    if verb in ("daemon-reload", "daemon-reexec"):
        state["daemon_reloads"] = state.get("daemon_reloads", 0) + 1
        daemon_reload(root, state)
        save(root, state)
        return 0
    positional = [a for i, a in enumerate(units) if not a.startswith("-") and (i == 0 or units[i - 1] != "-p")]
    unit = positional[0] if positional else ""
    if verb in ("start", "stop", "restart"):
        rc = 0
        for u in positional:
            rc = (_timer_start_stop(root, state, verb, u) if u.endswith(".timer")
                  else _start_stop(root, load_state(root), verb, u)) or rc
            state = load_state(root)
        return rc
    active, pid = _unit_active(root, state, unit)
    if verb == "is-active":
        print(active)
        return 0 if active == "active" else 3
    if verb == "show":
        return _show(root, state, positional, units)
    if verb == "status":
        print(f"● {unit} (SIMULATED)\n     Active: {active}" + (f"\n   Main PID: {pid}" if pid else ""))
        return 0 if active == "active" else 3
    print(f"SIMULATED systemctl: arguments not simulated: {' '.join(args)}", file=sys.stderr)
    return 1


def _real_systemctl(root: Path, args: list[str]) -> int:
    """An offline verb: the real systemctl, against the simulated root unless --root names one."""
    import subprocess

    real = ["/usr/bin/systemctl", *([] if any(a.startswith("--root") for a in args) else [f"--root={root}"]),
            *args]
    return subprocess.run(real).returncode


def _start_stop(root: Path, state: dict, verb: str, unit: str) -> int:
    """start (nothing to do for an active unit), stop, restart (a stop, then a start from the state it left)."""
    if verb == "start":
        return 0 if service_state(state, unit)[0] == "active" else _start(root, state, unit)
    if verb == "stop":
        return _stop(root, state, unit)
    return _stop(root, state, unit) or _start(root, load_state(root), unit)


UNIT_DIR = "etc/systemd/system"


def _unit_digest(root: Path, unit: str) -> str | None:
    import hashlib

    p = root / UNIT_DIR / unit
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


def daemon_reload(root: Path, state: dict) -> None:
    """The manager reads every unit file again: what it holds is what is on disk now; a unit whose file is
    gone stays in memory (not-found) only while it is active (a timer that still waits)."""
    d = root / UNIT_DIR
    files = {p.name: _unit_digest(root, p.name) for p in d.iterdir() if p.is_file()} if d.is_dir() else {}
    gone = {u: None for u, on in state.get("timers", {}).items() if on and u not in files}
    state["loaded_units"] = {**files, **gone}


def _timer_start_stop(root: Path, state: dict, verb: str, unit: str) -> int:
    loaded = state.get("loaded_units", {})
    if verb != "stop" and _unit_digest(root, unit) is None and unit not in loaded:
        print(f"Failed to start {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5
    state.setdefault("timers", {})[unit] = verb != "stop"
    if verb != "stop":
        loaded.setdefault(unit, _unit_digest(root, unit))  # loaded as it is started
        state["loaded_units"] = loaded
    save(root, state)
    return 0


def _unit_active(root: Path, state: dict, unit: str) -> tuple[str, int]:
    if unit.endswith(".timer"):
        return ("active" if state.get("timers", {}).get(unit) else "inactive"), 0
    return service_state(state, unit)


def _show(root: Path, state: dict, names: list[str], args: list[str]) -> int:
    """systemctl show UNIT... [-p PROP[,PROP]]... [--value]: the properties p2pkit reads, one block a unit
    (an empty line between blocks), as the manager holds the unit."""
    want = [p for i, a in enumerate(args) if a == "-p" and i + 1 < len(args) for p in args[i + 1].split(",")]
    want += [p for a in args if a.startswith("--property=") for p in a.split("=", 1)[1].split(",")]
    blocks = []
    for unit in names:
        props = _unit_props(root, state, unit)
        blocks.append([(v if "--value" in args else f"{k}={v}") for k, v in props.items() if not want or k in want])
    print("\n\n".join("\n".join(str(x) for x in b) for b in blocks))
    return 0


def _unit_props(root: Path, state: dict, unit: str) -> dict:
    """One unit's properties as the manager holds it: loaded from its file, or still in memory (an active
    timer whose file is gone); NeedDaemonReload where the file differs from what the last reload read."""
    u = _unit(root, unit)
    active, pid = _unit_active(root, state, unit)
    loaded = state.get("loaded_units", {})
    in_memory = unit in loaded and (_unit_digest(root, unit) is not None or active == "active")
    known = u["exists"] or in_memory
    timer = unit.endswith(".timer")
    props = {"Id": unit, "LoadState": "loaded" if known else "not-found", "ActiveState": active,
             "SubState": ({"active": "waiting"} if timer else {"active": "running", "failed": "failed"}).get(
                 active, "dead"),
             "MainPID": pid, "UnitFileState": _file_state(root, unit, u, in_memory),
             "NeedDaemonReload": "yes" if unit in loaded and loaded[unit] != _unit_digest(root, unit) else "no",
             "FragmentPath": f"/{UNIT_DIR}/{unit}" if known else ""}
    return {**props, **(_timer_props(u, known, active) if timer else _service_props(u))}


def _file_state(root: Path, unit: str, u: dict, in_memory: bool) -> str:
    if not u["exists"]:
        return "bad" if in_memory else ""
    wants = "timers.target.wants" if unit.endswith(".timer") else "multi-user.target.wants"
    if (root / UNIT_DIR / wants / unit).is_symlink():  # systemctl --root links to the absolute path in the root
        return "enabled"
    return "disabled" if "[Install]" in u["path"].read_text() else "static"


def _timer_props(u: dict, known: bool, active: str) -> dict:
    m = re.search(r"^Unit=(\S+)", u["path"].read_text(), re.M) if u["exists"] else None
    name = u["path"].name
    return {"Triggers": (m.group(1) if m else name.removesuffix(".timer") + ".service") if known else "",
            "NextElapseUSecRealtime": "Thu 2026-12-10 00:07:41 UTC" if active == "active" else "",
            "LastTriggerUSec": ""}


def _service_props(u: dict) -> dict:
    """ExecStart as systemd 252's `systemctl show` prints an exec command (a unit not run yet: start and stop
    times n/a, pid 0), Slice and MemoryMax as loaded."""
    ex = u.get("exec")
    return {"ExecStart": (f"{{ path={ex.split()[0]} ; argv[]={ex} ; ignore_errors=no ; start_time=[n/a] ; "
                          "stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }") if ex else "",
            "Slice": u.get("slice") or ("system.slice" if u["exists"] else ""),
            "MemoryMax": u.get("memory_max") or "infinity", "User": u.get("user") or "",
            "DropInPaths": " ".join(f"/{UNIT_DIR}/{d.parent.name}/{d.name}"
                                    for d in sorted(u["path"].parent.glob(f"{u['path'].name}.d/*.conf")))}


def journalctl(root: Path, state: dict, args: list[str]) -> int:
    """journalctl -u UNIT [-n N] [--after-cursor C]: the simulated unit's output (all of it without -n,
    as the real one); --show-cursor ends
    it with the journal's cursor (here the size of every unit's log), as `-n 0 --show-cursor` does."""
    logs = root / "var/log/p2pkit"
    unit = args[args.index("-u") + 1] if "-u" in args else ""
    n = int(args[args.index("-n") + 1]) if "-n" in args else None
    after = args[args.index("--after-cursor") + 1] if "--after-cursor" in args else \
        next((a.split("=", 1)[1] for a in args if a.startswith("--after-cursor=")), None)
    log = logs / f"{unit}.log"
    text = b""
    if unit and log.is_file():
        sizes = dict(p.rsplit(":", 1) for p in after.removeprefix("sim-bytes=").split(",") if ":" in p) \
            if after else {}
        text = log.read_bytes()[int(sizes.get(log.name, 0)):]
    lines = text.decode(errors="replace").splitlines()
    lines = lines[-n:] if n else ([] if n == 0 else lines)  # all of it without -n, as the real one
    if lines:
        print("\n".join(lines))
    elif n != 0:
        print("-- No entries --")
    if "--show-cursor" in args:
        sizes = ",".join(f"{f.name}:{f.stat().st_size}" for f in sorted(logs.glob("*.log"))) if logs.is_dir() else ""
        print(f"-- cursor: sim-bytes={sizes}")
    return 0


SIM_CUDA_ARCHS = ("75", "80", "86", "87", "88", "89", "90", "100", "103", "110", "120", "121")


def nvcc(root: Path, state: dict, args: list[str]) -> int:
    """nvcc --version and --list-gpu-arch: the simulated CUDA toolkit (13.1 unless the scenario says
    otherwise; the architectures it builds, one compute_XX a line, from the state's cuda_archs)."""
    v = state.get("cuda_version", "13.1")
    if args == ["--list-gpu-arch"]:
        print("\n".join(f"compute_{a}" for a in state.get("cuda_archs", SIM_CUDA_ARCHS)))
        return 0
    if args != ["--version"]:
        print("SIMULATED nvcc compiles nothing", file=sys.stderr)
        return 1
    print(f"nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2026 NVIDIA Corporation\n"
          f"Cuda compilation tools, release {v}, V{v}.80\nBuild cuda_{v}.r{v}/compiler.0_0 (SIMULATED)")
    return 0


# ---------------------------------------------------------------------------------------- users

def _user_args(args: list[str]) -> tuple[dict, str | None]:
    """useradd/usermod's options this host's roles use (--root, --system, --no-create-home,
    --shell S, --groups G, --append) and the user's name."""
    opts: dict = {}
    rest = list(args)
    name = None
    while rest:
        a = rest.pop(0)
        if a in ("--root", "-R", "--shell", "-s", "--groups", "-G"):
            opts[a.lstrip("-")[:1] if a.startswith("--") else a[1].lower()] = rest.pop(0) if rest else ""
        elif a.startswith("-"):
            opts[a] = True
        else:
            name = a
    return opts, name


def user_tool(tool: str, root: Path, args: list[str]) -> int:
    """useradd and usermod on the simulated host's /etc/passwd and /etc/group, as shadow's tools
    change a real host's (exit 9 for a user that exists, 6 for one or a group that does not). The
    user the simulated host makes gets this machine's running uid and gid: its engine is a process of
    this machine (run by this machine's user), and the files the roles give to the user must be
    that process's to enter."""
    opts, name = _user_args(args)
    if opts.get("r") and Path(opts["r"]).resolve() != root.resolve():
        print(f"{tool}: SIMULATED host at {root}: --root {opts['r']} is another tree", file=sys.stderr)
        return 1
    if not name:
        print(f"Usage: {tool} [options] LOGIN", file=sys.stderr)
        return 2
    passwd, group = root / "etc/passwd", root / "etc/group"
    users = passwd.read_text().splitlines() if passwd.is_file() else []
    groups = group.read_text().splitlines() if group.is_file() else []
    wanted = [g for g in str(opts.get("g") or "").split(",") if g]
    refused = _user_refused(tool, name, any(ln.split(":")[0] == name for ln in users), wanted, groups)
    if refused:
        return refused
    if tool == "useradd":
        uid, gid = os.getuid(), os.getgid()
        users.append(f"{name}:x:{uid}:{gid}::/nonexistent:{opts.get('s') or '/usr/sbin/nologin'}")
        groups.append(f"{name}:x:{gid}:")
    import tempfile  # here, not above: every other stand-in would import it (shutil, random) for nothing

    out = [_group_line(tool, ln, name, wanted, opts) for ln in groups]
    passwd.parent.mkdir(parents=True, exist_ok=True)
    for path, lines in ((passwd, users), (group, out)):  # a new name (O_EXCL) renamed over it, as shadow's
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.p2pkit-sim.")  # tools write a new file
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(f"{ln}\n" for ln in lines))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return 0


def _user_refused(tool: str, name: str, exists: bool, wanted: list[str], groups: list[str]) -> int:
    """shadow's refusals in its order: a group that does not exist (6), a user useradd finds (9) or usermod
    does not (6); 0 when none."""
    known = {ln.split(":")[0] for ln in groups}
    for g in wanted:
        if g not in known:
            print(f"{tool}: group '{g}' does not exist", file=sys.stderr)
            return 6
    if tool == "useradd" and exists:
        print(f"useradd: user '{name}' already exists", file=sys.stderr)
        return 9
    if tool == "usermod" and not exists:
        print(f"usermod: user '{name}' does not exist", file=sys.stderr)
        return 6
    return 0


def _group_line(tool: str, ln: str, name: str, wanted: list[str], opts: dict) -> str:
    """One /etc/group line after the tool: the user added to the groups wanted, and taken out of the others by
    usermod -G without -a."""
    f = ln.split(":")
    if len(f) >= 4 and f[0] in wanted:
        members = [m for m in f[3].split(",") if m]
        if name not in members:
            members.append(name)
        f[3] = ",".join(members)
    elif len(f) >= 4 and tool == "usermod" and not opts.get("--append") and "-a" not in opts and wanted:
        f[3] = ",".join(m for m in f[3].split(",") if m and m != name)  # -G without -a: only these groups
    return ":".join(f)


def useradd(root: Path, state: dict, args: list[str]) -> int:
    return user_tool("useradd", root, args)


def usermod(root: Path, state: dict, args: list[str]) -> int:
    return user_tool("usermod", root, args)


# ------------------------------------------------------------------------------- Secure Boot (MOK)

def _cert(path: str) -> dict | None:
    """A DER certificate's sha256, serial and CN, read with the real openssl (as mokutil reads it)."""
    import hashlib
    import subprocess

    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    r = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-serial", "-subject"], input=data,
                       capture_output=True, check=False)
    if r.returncode != 0:
        return None
    # openssl prints "serial=0A1B..." and "subject=CN = NAME"; the simulator keeps the serial in upper-case
    # hex without leading zeros (its own statement, not the product's parser)
    out = {"sha256": hashlib.sha256(data).hexdigest(), "serial": "", "cn": ""}
    for line in r.stdout.decode().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "serial":
            out["serial"] = value.strip().upper().lstrip("0") or "0"
        elif key.strip() == "subject":
            out["cn"] = next((x.split("=", 1)[1].strip() for x in value.split(",") if x.strip().startswith("CN")),
                             value.strip())
    return out


def signature_trusted(state: dict, info: dict) -> bool:
    """What the kernel accepts with Secure Boot on: a module signed by a key it trusts (Canonical's for
    the stock modules, which carry no sig_key here; an enrolled MOK's serial for p2pkit's)."""
    if info.get("signed") != "1":
        return False
    serial = info.get("sig_key", "").replace(":", "").upper().lstrip("0")
    return not serial or any(k["serial"] == serial for k in state.get("mok", {}).get("enrolled", []))


def mokutil(root: Path, state: dict, args: list[str]) -> int:
    """mokutil --sb-state | --import CERT [--hash-file F] | --list-new | --list-enrolled | --test-key CERT.
    Messages as lcp/mokutil's src/mokutil.c prints them (print_sb_state, get_password, test_key,
    print_skip_message, list_keys' "[key N]"). Keys queued by --import are enrolled by the next
    simulated boot (lifecycle.reboot: MokManager, the operator typing the password)."""
    mok = state.setdefault("mok", {"enrolled": [], "new": []})
    if args == ["--sb-state"]:
        print("SecureBoot enabled" if state["secure_boot"] else "SecureBoot disabled")
        return 0
    if args in (["--list-new"], ["--list-enrolled"]):
        return _mok_list(mok, args[0])
    if len(args) == 2 and args[0] == "--test-key":
        return _mok_test_key(mok, args[1])
    if args and args[0] == "--import" and len(args) >= 2:
        return _mok_import(root, state, mok, args)
    print(f"mokutil: unknown arguments {' '.join(args)}", file=sys.stderr)
    return 255


def _mok_list(mok: dict, which: str) -> int:
    """--list-new, --list-enrolled: each key as list_keys prints it, or that the list is empty (exit 1)."""
    keys = mok["new" if which == "--list-new" else "enrolled"]
    if not keys:
        print("MokNew is empty" if which == "--list-new" else "MokListRT is empty", file=sys.stderr)
        return 1
    for i, k in enumerate(keys, 1):
        print(f"[key {i}]\nSHA256 Fingerprint: {k['sha256']}\nCertificate:\n    Data:\n        Serial Number: "
              f"{k['serial']}\n        Subject: CN={k['cn']}")
    return 0


def _mok_test_key(mok: dict, path: str) -> int:
    """--test-key CERT: enrolled or queued (0), not enrolled (1), not a certificate (255)."""
    cert = _cert(path)
    if cert is None:
        print("Not a valid x509 certificate", file=sys.stderr)
        return -1 & 0xFF
    if any(k["sha256"] == cert["sha256"] for k in mok["enrolled"]):
        print(f"{path} is already enrolled")
        return 0
    if any(k["sha256"] == cert["sha256"] for k in mok["new"]):
        print(f"{path} is already in the enrollment request")
        return 0
    print(f"{path} is not enrolled")
    return 1


def _mok_import(root: Path, state: dict, mok: dict, args: list[str]) -> int:
    """--import CERT [--hash-file F]: the key queued for the next boot (the password read twice from stdin
    unless a hash file is given), skipped when already enrolled; 255 for what mokutil aborts on."""
    if state.get("mok_refuses"):  # a full EFI variable store, as a real firmware refuses SetVariable
        print("Failed to enroll new keys", file=sys.stderr)
        return 255
    cert = _cert(args[1])
    if cert is None:
        print(f"Abort!!! {args[1]} is not a valid x509 certificate in DER format", file=sys.stderr)
        return 255
    if "--hash-file" not in args and not _mok_password():
        return 255
    if any(k["sha256"] == cert["sha256"] for k in mok["enrolled"]):
        print(f"SKIP: {args[1]} is already enrolled")
        return 0
    if not any(k["sha256"] == cert["sha256"] for k in mok["new"]):
        mok["new"].append(cert)
    save(root, state)
    return 0


def _mok_password() -> bool:
    """get_password: the password and its repeat from stdin; False (with mokutil's message) when it is empty or
    they differ."""
    first = sys.stdin.readline().rstrip("\n")
    print("input password: ")
    again = sys.stdin.readline().rstrip("\n")
    print("input password again: ")
    if not first:
        print("password should be 1~256 characters", file=sys.stderr)
        print("Abort", file=sys.stderr)
        return False
    if first != again:
        print("password doesn't match", file=sys.stderr)
        print("Abort", file=sys.stderr)
        return False
    return True


def sign_file(root: Path, state: dict, args: list[str]) -> int:
    """scripts/sign-file HASH KEY CERT MODULE: appends the signature in place (sign-file.c writes
    MODULE.~signed~ and renames it over MODULE). The simulated module records what kmod's modinfo
    reads of a PKCS#7 signature: signer (the issuer's CN), sig_key (the serial, colon-separated hex),
    sig_hashalgo. Errors as sign-file.c's ERR() prints them ("sign-file: KEY: ...")."""
    import subprocess

    if len(args) != 4:
        print("Usage: scripts/sign-file [-dp] <hash algo> <key> <x509> <module> [<dest>]", file=sys.stderr)
        return 2
    algo, key, cert_path, module = args
    if subprocess.run(["openssl", "pkey", "-in", key, "-noout"], capture_output=True).returncode != 0:
        print(f"sign-file: {key}: error reading private key", file=sys.stderr)
        return 1
    cert = _cert(cert_path)
    if cert is None:
        print(f"sign-file: {cert_path}: error reading X.509 certificate", file=sys.stderr)
        return 1
    info = read_ko(Path(module))
    if info is None:
        print(f"sign-file: {module}: No such file or not a module", file=sys.stderr)
        return 1
    serial = cert["serial"] if len(cert["serial"]) % 2 == 0 else "0" + cert["serial"]
    info.update(signed="1", signer=cert["cn"], sig_key=":".join(serial[i:i + 2] for i in range(0, len(serial), 2)),
                sig_hashalgo=algo)
    tmp = Path(module + ".~signed~")
    tmp.write_text("P2PKIT-SIM-KO\n" + "".join(f"{k}={v}\n" for k, v in info.items()))
    os.replace(tmp, module)
    return 0
