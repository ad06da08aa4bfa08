"""Preflight: is this the host the profile describes, before anything changes it."""

from __future__ import annotations

from p2pkit.core.config import Profile
from p2pkit.core.role_defaults import role_default
from p2pkit.parse.system import kernel_tuple
from p2pkit.rules import engine_cmd
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, failed, figure, judge, reading, reads, show, unknown

GIB = 1 << 30
SIM_HINT = ("to try p2pkit without GPUs: `p2pkit sim init /tmp/p2pkit-sim` then "
            "`p2pkit --root /tmp/p2pkit-sim up --reboot`")


@reads("tools", "os", "kernel", "is_root", "disk", "secure_boot", "pci_gpus", "iommu", "bootloader",
       "dpkg_nvidia", "distro_dkms", "cgroup", "mok")
def check(f: dict, p: Profile) -> list[Check]:
    # GPUs first: on a machine without them nothing else matters, and the first failure is the headline
    # a facts file recorded before p2pkit read the bootloader has none: that check is left out for it
    boot = [bootloader(f, p)] if "bootloader" in f else []
    return [
        _gpu_count(f, p), _gpu_model(f, p), _os(f, p), _kernel(f, p), _root(f, p), _disk(f, p),
        _secure_boot(f, p), _iommu(f, p), *boot, *_distro(f), _dpkg(f), _cgroup(f, p), _tools(f, p), _pins(p),
    ]


# every pin a later stage refuses to act without: (key, the stage that needs it, where `p2pkit pin` gets it)
PIN_SOURCES = {
    "driver.installer_sha256": ("driver", "--installer FILE|URL"),
    "p2p_module.commit": ("p2p-module", "--fork DIR|--fork-remote"),
    "engine.commit": ("engine", "--engine DIR|--engine-remote"),
    "engine.source_sha256": ("engine", ""),
}


def missing_pins(p: Profile) -> list[str]:
    """The pins this profile's stages need and leave empty, in stage order (the stages' own
    prechecks refuse the same: driver.precheck, p2p_module.precheck, engine.precheck)."""
    out = []
    if len(p.driver.installer_sha256) != 64:
        out.append("driver.installer_sha256")
    if len(p.p2p_module.commit) < 7:
        out.append("p2p_module.commit")
    return out + engine_cmd.engine(p).pins_missing(p)


def pin_command(p: Profile, keys: list[str]) -> str:
    """The one `p2pkit pin` line that resolves the keys it can (the remotes for the commits)."""
    opts = {"driver.installer_sha256": f"--installer {p.driver.installer_url or 'FILE'}",
            "p2p_module.commit": "--fork-remote", "engine.commit": "--engine-remote"}
    args = " ".join(opts[k] for k in keys if k in opts)
    return f"p2pkit pin {args} --out ./{p.name}.toml --yes"


def _pins(p) -> Check:
    """Every empty pin the run will need, named before anything changes (not one stage at a time)."""
    keys = missing_pins(p)
    title = "every pin the stages need is set"
    measured = "empty: " + ", ".join(f"{k} ({PIN_SOURCES[k][0]})" for k in keys) if keys else "all pinned"
    hint = ""
    if keys:
        hint = (f"`sudo p2pkit up --pin` resolves them and writes them into this host's profile (the installer "
                "from driver.installer_url once the checksums its makeself header carries hold, read and never run; "
                "the commits from `git ls-remote`), showing each value and where it came from; or pin a copy "
                f"yourself: `{pin_command(p, keys)}`, then "
                f"`sudo p2pkit --profile ./{p.name}.toml up`")
        if "engine.source_sha256" in keys:
            hint += "; engine.source_sha256 is yours to set: the sha256 of the source archive you reviewed"
    return judge("preflight.pins", title, not keys, measured, "every pin set (installer sha256, commits)", hint)


# the commands later stages run, why, and the Debian/Ubuntu package that brings each
TOOL_NEEDS = {
    "make": ("p2p-module: make modules", "make"),
    "cc": ("p2p-module: the kernel modules' compiler", "gcc"),
    "systemd-analyze": ("service: systemd-analyze verify and security", "systemd"),
    "cmake": ("engine: configure", "cmake"),
    "ninja": ("engine: build", "ninja-build"),
    "pkg-config": ("engine: FFmpeg and curl found through pkg-config (P06)", "pkg-config"),
    "git": ("engine: the pinned source", "git"),
    "c++": ("engine: the C++ compiler", "g++"),
}


def needed_tools(p: Profile) -> list[str]:
    """Every tool a later stage runs: the engine's only where its recipe builds with it."""
    engine = engine_cmd.engine(p).build_tools(p)
    return [t for t in TOOL_NEEDS if t in engine or TOOL_NEEDS[t][0].split(":")[0] != "engine"]


def _tools(f, p) -> Check:
    """Every command a later stage runs, found before anything runs (not after a two-minute build)."""
    found = f.get("tools")
    want = "every tool a later stage runs: " + ", ".join(needed_tools(p))
    if found is None:  # a facts file recorded before p2pkit looked for tools
        return unknown("preflight.tools", "tools later stages run", "not recorded", want, needed=False)
    if failed(found) or not isinstance(found, dict):
        return unknown("preflight.tools", "tools later stages run", found, want)
    missing = [t for t in needed_tools(p) if not found.get(t)]
    packages = " ".join(dict.fromkeys(TOOL_NEEDS[t][1] for t in missing))
    return judge("preflight.tools", "tools later stages run", not missing,
                 "missing: " + "; ".join(f"{t} ({TOOL_NEEDS[t][0]})" for t in missing) if missing else "all found",
                 want, f"install them before anything runs: `sudo apt-get install -y {packages}`")


def _os(f, p) -> Check:
    os_ = f.get("os")
    want = f"{p.host.os_id} {p.host.os_version}"
    if failed(os_):
        return unknown("preflight.os", "operating system", os_, want)
    got = f"{os_.get('ID', '?')} {os_.get('VERSION_ID', '?')}"
    ok = got == want
    if not ok and p.host.allow_other_os:
        return Check("preflight.os", "operating system", WARN, got, want,
                     "host.allow_other_os is set: p2pkit goes on, but only Ubuntu 24.04 is tested")
    return judge("preflight.os", "operating system", ok, got, want,
                 f"p2pkit's playbooks and the driver pin are made for {want} (kernel headers, apt holds, "
                 f"GRUB drop-ins); install {want}, or set host.allow_other_os = true in the profile")


def _kernel(f, p) -> Check:
    k = f.get("kernel")
    want = f">= {p.host.min_kernel}"
    if failed(k):
        return unknown("preflight.kernel", "kernel release", k, want)
    try:
        ok = kernel_tuple(k) >= kernel_tuple(p.host.min_kernel)
    except ValueError:
        return Check("preflight.kernel", "kernel release", FAIL, k, want, "the kernel release is unreadable")
    return judge("preflight.kernel", "kernel release", ok, k, want,
                 f"boot a kernel {want} (Ubuntu 24.04's GA kernel is 6.8)")


def _root(f, p) -> Check:
    r = f.get("is_root")
    if failed(r):
        return unknown("preflight.root", "running as root", r, True)
    if not p.host.require_root:
        return Check("preflight.root", "running as root", PASS if r else WARN, r, "root (not required)")
    return judge("preflight.root", "running as root", bool(r), r, True,
                 "p2pkit installs a driver and kernel modules: run it as root (sudo p2pkit up)")


def _disk(f, p) -> Check:
    d = f.get("disk")
    want_b = p.host.min_free_disk_gib * GIB
    want = f">= {p.host.min_free_disk_gib} GiB free"
    if failed(d):
        return unknown("preflight.disk", "free disk for the engine and model", d, want)
    got = d["free_bytes"]
    return figure("preflight.disk", "free disk for the engine and model", got / GIB, ">=",
                  p.host.min_free_disk_gib, "GiB", f"free at least {(want_b - got) / GIB:.1f} GiB more under "
                  f"{d['path']}, or lower host.min_free_disk_gib if your model is smaller",
                  context=f"free under {d['path']}")


def secure_boot_path(m: dict) -> str:
    """What p2pkit does with Secure Boot on, said whole (issue 29): the key, its enrolment, the signing."""
    return (f"with Secure Boot on, the p2p-module stage signs the modules it builds: it makes a key at {m.get('key')} "
            f"(0600; its certificate {m.get('cert')}) unless p2p_module.signing_key names one, queues its enrolment "
            "with `mokutil --import` (a one-time password: give it as P2PKIT_MOK_PASSWORD in the environment of "
            f"`sudo p2pkit up`, or run `sudo mokutil --import {m.get('cert')}` yourself first), signs each module "
            "with the kernel's sign-file, and after the reboot MokManager asks for that password once (choose "
            "\"Enroll MOK\"); or turn Secure Boot off in the firmware setup")


def _secure_boot(f, p) -> Check:
    sb = f.get("secure_boot")
    if failed(sb):
        return unknown("preflight.secure_boot", "Secure Boot", sb, "off", needed=False)
    if sb in ("off", "legacy-bios"):
        return judge("preflight.secure_boot", "Secure Boot", True, sb, "off")
    m = f.get("mok") or {"error": "not read"}
    expected = "off, or a signing key p2pkit can enrol"
    if failed(m):
        return unknown("preflight.secure_boot", "Secure Boot", m, expected)
    if not m.get("sign_file"):
        return judge("preflight.secure_boot", "Secure Boot", False,
                     f"on; no scripts/sign-file in the headers of {m.get('kernel')}", expected,
                     f"install linux-headers-{m.get('kernel')} (it ships scripts/sign-file); " + secure_boot_path(m),
                     severity=FAIL)
    if not m.get("mokutil"):
        return judge("preflight.secure_boot", "Secure Boot", False, "on; mokutil is not installed", expected,
                     "sudo apt-get install mokutil; " + secure_boot_path(m), severity=FAIL)
    if m.get("cert_error"):
        return judge("preflight.secure_boot", "Secure Boot", False, f"on; {m['cert_error']}", expected,
                     secure_boot_path(m), severity=FAIL)
    state = m.get("enrolment")
    if state in ("enrolled", "in-db"):
        return judge("preflight.secure_boot", "Secure Boot", True, f"on; key {m['cert']} enrolled", expected)
    if state == "queued":
        return judge("preflight.secure_boot", "Secure Boot", False, f"on; key {m['cert']} queued for enrolment",
                     expected, "MokManager enrols it at the next boot: type the one-time password there "
                     "(choose \"Enroll MOK\")", severity=WARN)
    if m.get("password_given"):
        what = f"key {m['cert']} not enrolled" if m.get("cert_exists") else "no key yet"
        return judge("preflight.secure_boot", "Secure Boot", False,
                     f"on; {what}: p2pkit queues its enrolment (P2PKIT_MOK_PASSWORD is set)", expected,
                     secure_boot_path(m), severity=WARN)
    return judge("preflight.secure_boot", "Secure Boot", False,
                 f"on; {'key ' + m['cert'] + ' not enrolled' if m.get('cert_exists') else 'no signing key yet'} "
                 "and no enrolment password (P2PKIT_MOK_PASSWORD)", expected, secure_boot_path(m), severity=FAIL)


def _gpu_count(f, p) -> Check:
    gpus = f.get("pci_gpus")
    want = p.gpus.count
    if failed(gpus):
        return unknown("preflight.gpu_count", "NVIDIA GPUs in sysfs", gpus, want)
    if not gpus:
        return figure("preflight.gpu_count", "NVIDIA GPUs in sysfs", 0, "==", want, "count",
                      "no NVIDIA GPU was found under /sys/bus/pci/devices; this host cannot run the "
                      f"profile's stages. Check the cards are seated and enabled in the firmware; {SIM_HINT}")
    return figure("preflight.gpu_count", "NVIDIA GPUs in sysfs", len(gpus), "==", want, "count",
                  f"the profile expects {want} GPU(s) and P2P needs two: seat the missing card, check "
                  "it in `lspci -d 10de:`, or use a profile that matches this host",
                  context=", ".join(g["bdf"] for g in gpus))


def _gpu_model(f, p) -> Check:
    gpus = f.get("pci_gpus")
    want = f"{p.gpus.model} ({', '.join(p.gpus.pci_device_ids) or 'any id'})"
    if failed(gpus) or not gpus:
        return Check("preflight.gpu_model", "GPU model", "skip", "no GPU to judge", want)
    ids = sorted({g.get("device_id") or "?" for g in gpus})
    ok = not p.gpus.pci_device_ids or all(i in p.gpus.pci_device_ids for i in ids)
    names = sorted({g.get("name") for g in gpus})
    return judge("preflight.gpu_model", "GPU model", ok, f"{', '.join(names)} ({', '.join(ids)})", want,
                 "this profile is for other GPUs: pick a profile for this host (`p2pkit profile list`)")


def _iommu(f, p) -> Check:
    io = f.get("iommu")
    want = p.p2p_module.iommu
    if failed(io):
        return unknown("preflight.iommu", "IOMMU mode", io, want, needed=False)
    gpus = f.get("pci_gpus") if not failed(f.get("pci_gpus")) else []
    effective = sorted({g.get("iommu_group", "unknown") for g in gpus or []})
    measured = f"command line: {io['intent']} ({io['detail']}); GPUs: {', '.join(effective) or 'n/a'}"
    translating = io["intent"] == "translating" or "translating" in effective
    return Check("preflight.iommu", "IOMMU mode", WARN if translating else PASS, measured,
                 f"{want} (the p2p-module stage sets it)",
                 "a translating IOMMU gives IO_PAGE_FAULT and zero-filled P2P tensors; the p2p-module "
                 "stage adds iommu=pt to the kernel command line and asks for a reboot" if translating else "")


def bootloader_takes() -> dict[str, str]:
    """Where the p2p-module stage puts the IOMMU option, per bootloader (GRUB's drop-in: the p2p-module role's
    path, read when asked; the module attribute BOOTLOADER_TAKES is this)."""
    dropin = role_default("p2pkit_p2p_module", "p2pkit_p2p_module_paths")["grub_dropin"]
    return {
        "grub": f"a GRUB drop-in ({dropin}) and update-grub",
        "systemd-boot": "/etc/kernel/cmdline and the loader entries' options lines",
        "kernelstub": "`kernelstub --add-options`",
    }


def __getattr__(name: str):
    if name == "BOOTLOADER_TAKES":
        return bootloader_takes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def bootloader(f, p) -> Check:
    """The p2p-module stage sets the IOMMU option through the bootloader; one p2pkit does not know
    stops the run here, before anything changes, where the running command line lacks it."""
    b, io = f.get("bootloader"), f.get("iommu")
    title = "bootloader p2pkit sets the kernel command line through"
    want = "GRUB, systemd-boot or kernelstub"
    if failed(b):
        return unknown("preflight.bootloader", title, b, want)
    takes = bootloader_takes()
    if b["name"] in takes:
        return Check("preflight.bootloader", title, PASS, f"{b['name']} ({b['why']}): the IOMMU option goes into "
                     + takes[b["name"]], want)
    applied = not failed(io) and io.get("intent") == p.p2p_module.iommu
    return Check("preflight.bootloader", title, PASS if applied else FAIL,
                 f"unknown: {b['why']}" + ("; the running command line already has the IOMMU option" if applied
                                           else ""), want,
                 "" if applied else "p2pkit cannot set the kernel command line on this host and will not reboot "
                 "it for nothing: add the IOMMU option the p2p-module stage needs (iommu=pt with amd_iommu=on or "
                 "intel_iommu=on; iommu.passthrough=1 on arm64) to the kernel command line of the bootloader that "
                 "boots this box, reboot, check /proc/cmdline, then run `p2pkit up` again")


def _dpkg(f) -> Check:
    d = f.get("dpkg_nvidia")
    if failed(d):
        return unknown("preflight.nvidia_packages", "no NVIDIA package half-installed", d, "none", needed=False)
    if d is None:
        return Check("preflight.nvidia_packages", "no NVIDIA package half-installed", "skip", "no dpkg database",
                     "none")
    return judge("preflight.nvidia_packages", "no NVIDIA package half-installed", not d,
                 ", ".join(f"{x['package']} ({x['status']})" for x in d) or "none", "none",
                 "finish or remove them first: `sudo dpkg --configure -a`, then `sudo apt-get purge` the "
                 "listed nvidia packages")


def _distro(f) -> list[Check]:
    """A distro's NVIDIA module under DKMS met before p2pkit (p2pkit.rules.distro): one whose package dpkg left
    half-configured (its DKMS build failed half-way) is refused here, before anything changes, naming the package,
    DKMS's log and the fix; an installed one is said, with what the p2p-module stage will do with it (a warning:
    the next stages replace a driver the user installed). A hold is refused by the acting stages, which tell the
    user's holds from the driver stage's."""
    from p2pkit.rules import distro

    if "distro_dkms" not in f:  # facts recorded by an earlier p2pkit
        return []
    d = f["distro_dkms"]
    id_, title = "preflight.distro_module", "a distro NVIDIA kernel module p2pkit can take over"
    if failed(d):
        return [unknown(id_, title, d, "none, or one whose package is installed")]
    mods = d.get("modules") or []
    if not mods:
        return [Check(id_, title, PASS, "none under DKMS", "none, or one whose package is installed")]
    broken = [m for m in mods if m.get("package_status") and m["package_status"][1:2] != "i"]
    if broken:
        pkgs = " ".join(sorted({m["package"] for m in broken}))
        said = "; ".join(
            f"{m['package']} {m.get('package_version') or ''} is {dpkg_state(m['package_status'])} (dpkg "
            f"{m['package_status']}); DKMS holds {m['dkms']} "
            + (", ".join(f"{k}: {v}" for k, v in sorted(m["kernels"].items())) or (m.get("state") or "added"))
            + f" (its build log: /var/lib/dkms/{m['name']}/{m['version']}/build/make.log)" for m in broken)
        return [Check(id_, title, FAIL, said, "none, or one whose package is installed",
                      f"its DKMS build failed half-way and dpkg will run it again at the next apt run; p2pkit replaces "
                      f"that module with the P2P-patched one: remove the package (`sudo apt-get purge {pkgs}`: nothing "
                      "of p2pkit's is installed yet), or fix its build and `sudo dpkg --configure -a`; then "
                      "`p2pkit up` again", "P34")]
    return [Check(id_, title, WARN, "; ".join(f"{m['package'] or 'no package'} {m.get('package_version') or ''} "
                                               f"(DKMS {m['dkms']})" for m in mods),
                  "none, or one whose package is installed",
                  "the p2p-module stage " + distro.plan(mods, d.get("routes") or {}), "P34")]


DPKG_STATES = {"F": "half-configured", "U": "unpacked, not configured", "H": "half-installed",
               "W": "waiting for a trigger", "t": "with a trigger pending", "c": "removed, its configuration kept"}


def dpkg_state(abbrev: str) -> str:
    return DPKG_STATES.get(abbrev[1:2], f"in dpkg state {abbrev[1:2]!r}")


# where the engine's own cgroup comes from, by who starts it (serve.manager, or on "auto" whether
# systemd is PID 1; a recording without that reading: either)
ENGINE_CGROUP = {
    "systemd": "the engine runs as a system service in its own slice and does not inherit this cap",
    "launcher": "systemd is not PID 1 here, so p2pkit's launcher starts the engine in a memory cgroup of its own "
                "at the top of the hierarchy, which does not inherit this cap (the service stage proves it)",
    "auto": "the engine runs in a cgroup of its own (its systemd slice, or where systemd is not PID 1 the one "
            "p2pkit's launcher makes) and does not inherit this cap",
}


def _cgroup(f, p: Profile) -> Check:
    cg = f.get("cgroup")
    if failed(cg):
        return unknown("preflight.cgroup", "p2pkit not in a memory-capped cgroup", cg, "no memory cap",
                       needed=False, pitfall="P12")
    caps = sorted(cg["memory_caps"], key=lambda c: c["limit_bytes"])  # the tightest first: it is the one that binds
    manager = p.serve.manager
    if manager == "auto" and cg.get("systemd_booted") is not None:
        manager = "systemd" if cg["systemd_booted"] else "launcher"
    return reading("preflight.cgroup", "p2pkit not in a memory-capped cgroup", WARN if caps else PASS,
                   caps[0]["limit_bytes"] / GIB if caps else None, "GiB", "no memory cap",
                   "p2pkit runs inside a memory-capped cgroup (a tool's background terminal?). That is fine "
                   f"for p2pkit; {ENGINE_CGROUP[manager]}", "P12", text=f"{caps[0]['file'] if caps else ''} = {{}}"
                   + "".join(f", {c['file']} = {show(c['limit_bytes'] / GIB, 'GiB')}" for c in caps[1:]),
                   missing="no memory cap")
