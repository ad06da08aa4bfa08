"""/etc/os-release, /proc/cmdline, /proc/driver/nvidia/version, dpkg status, /proc/self/cgroup."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from p2pkit.core.breaks import lines


def os_release(text: str) -> dict[str, str]:
    out = {}
    for line in lines(text):  # systemd reads it as an environment file: a U+2028 in a value is part of it
        line = line.strip(" \t\r")
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            parts = shlex.split(value)
            out[key] = parts[0] if parts else ""
        except ValueError:
            out[key] = value.strip("\"'")
    return out


def kernel_tuple(release: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", release)
    if not m:
        raise ValueError(f"not a kernel release: {release!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class IommuIntent:
    mode: str  # "passthrough" | "off" | "translating" | "default"
    detail: str
    tokens: tuple[str, ...]


def iommu_intent(cmdline: str, cpu_vendor: str) -> IommuIntent:
    """What the kernel command line asks for. `default` means the kernel's build default decides
    (Ubuntu 24.04: translated DMA domains when the firmware enables the IOMMU)."""
    tokens = tuple(t for t in cmdline.split() if "iommu" in t)
    kv = {}
    for t in tokens:
        k, _, v = t.partition("=")
        kv[k] = v
    vendor_key = "amd_iommu" if "AMD" in cpu_vendor.upper() else "intel_iommu"
    if kv.get("iommu") == "off" or kv.get(vendor_key) == "off":
        return IommuIntent("off", f"{'iommu' if kv.get('iommu') == 'off' else vendor_key}=off", tokens)
    if kv.get("iommu") == "pt" or kv.get("iommu.passthrough") in ("1", "y", "on"):
        return IommuIntent("passthrough", "iommu=pt" if kv.get("iommu") == "pt" else "iommu.passthrough=1", tokens)
    if kv.get("iommu.passthrough") in ("0", "n", "off") or kv.get(vendor_key) in ("on", "force", "strict"):
        return IommuIntent("translating", " ".join(tokens), tokens)
    return IommuIntent("default", "no IOMMU option on the kernel command line", tokens)


def iommu_group_type(text: str) -> str:
    """/sys/kernel/iommu_groups/N/type: identity (passthrough), DMA / DMA-FQ (translating), blocked."""
    t = text.strip()
    if t == "identity":
        return "passthrough"
    if t.startswith("DMA"):
        return "translating"
    return t or "unknown"


@dataclass(frozen=True)
class NvidiaVersion:
    version: str
    open_module: bool
    builder: str
    raw: str


def modinfo_fields(text: str) -> dict[str, str]:
    """`modinfo MODULE`: each field's first value ("filename:       /lib/modules/.../nvidia.ko"; kmod
    pads the name to 16 columns; a signature goes on over tab-indented lines, alias and parm repeat)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+):\s*(.*?)\s*$", line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def nvidia_version(text: str) -> NvidiaVersion:
    """/proc/driver/nvidia/version: 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
    Release Build  (nixbld@)  <date>'."""
    first = text.splitlines()[0] if text.strip() else ""
    m = re.search(r"NVRM version:\s*(.*?)\s+(\d+\.\d+(?:\.\d+)?)\s", first + " ")
    if not m:
        raise ValueError(f"unexpected /proc/driver/nvidia/version: {first!r}")
    b = re.search(r"\(([^)]*@[^)]*)\)", first)
    return NvidiaVersion(m.group(2), "Open Kernel Module" in m.group(1), b.group(1) if b else "", first.strip())


def dpkg_nvidia_problems(status_text: str) -> list[tuple[str, str]]:
    """Packages named nvidia*/libnvidia* whose dpkg Status is neither installed nor purged-with-config."""
    problems = []
    for block in status_text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace() and ":" in line:
                k, _, v = line.partition(":")
                fields[k] = v.strip()
        name = fields.get("Package", "")
        if not re.match(r"^(lib)?nvidia", name):
            continue
        status = fields.get("Status", "")
        want, _, state = status.partition(" ok ")  # "hold ok installed": held by p2pkit, installed
        if want not in ("install", "hold", "deinstall", "purge") or state not in ("installed", "config-files",
                                                                                  "not-installed"):
            problems.append((name, status))
    return problems


def _dpkg_abbrev(text: str) -> list[tuple[str, str, str, str]]:
    """`dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n'`: (selection, state, error flag, package) per
    line; the flag is '' where dpkg's is ok (the abbreviation's third column blank) and 'R' for reinstreq."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-z])([a-zA-Z])(\S?)\s+(\S+)$", line.strip())
        if m:
            out.append((m.group(1), m.group(2), m.group(3), m.group(4)))
    return out


def dpkg_installed(text: str) -> list[str]:
    """The installed packages as the roles read dpkg's database (the common role's p2pkit_dpkg_installed):
    state 'i' (installed) with no error flag, whatever the selection ('hi' is held, still installed; 'ri' is
    to be removed, not removed yet); 'iiR' (reinstreq) is a package dpkg must reinstall first."""
    return [p for _want, state, flag, p in _dpkg_abbrev(text) if state == "i" and not flag]


def dpkg_held(text: str) -> list[str]:
    """The packages whose selection is hold ('h'): for every package dpkg-query lists (installed, or
    its configuration left), what `apt-mark showhold` prints from the same database. apt-mark also
    names a hold on a package never installed, which dpkg-query -W does not list; P02 asks only
    about installed ones."""
    return [p for want, _state, _flag, p in _dpkg_abbrev(text) if want == "h"]


SMAPS_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ \S+ \d+\s*(.*)$")


def smaps_mappings(text: str) -> list[dict]:
    """/proc/PID/smaps: each mapping's file (empty for anonymous) and its VmFlags (`rr` is
    madvise(MADV_RANDOM), proc(5))."""
    out: list[dict] = []
    for line in text.splitlines():
        m = SMAPS_HEADER.match(line)
        if m:
            out.append({"path": m.group(1).strip(), "flags": []})
        elif line.startswith("VmFlags:") and out:
            out[-1]["flags"] = line.split()[1:]
    return out


@dataclass(frozen=True)
class ProcCgroup:
    v2_path: str | None
    v1: dict[str, str]


def proc_cgroup(text: str) -> ProcCgroup:
    v2 = None
    v1 = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        for c in ctrls.split(","):
            if c:
                v1[c] = path
    return ProcCgroup(v2, v1)


def memory_limit(text: str) -> int | None:
    """memory.max ('max' = none) or memory.limit_in_bytes (a huge page-aligned number = none)."""
    t = text.strip()
    if t == "max":
        return None
    n = int(t)
    return None if n >= 2**62 else n


def mountinfo(text: str) -> list[dict]:
    """/proc/self/mountinfo: mount point, device (major:minor), filesystem type and source per line.
    Fields (proc(5)): id, parent, major:minor, root, mount point, options, optional fields..., "-",
    fstype, source, super options. Octal escapes (\\040 for a space) are decoded."""
    def unescape(s: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)

    out = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts[6:] or len(parts) < 10:
            continue
        sep = parts.index("-", 6)
        out.append({"mount_point": unescape(parts[4]), "device": parts[2], "root": unescape(parts[3]),
                    "fstype": parts[sep + 1], "source": unescape(parts[sep + 2]) if len(parts) > sep + 2 else ""})
    return out


def mount_of(mounts: list[dict], path: str) -> dict | None:
    """The mount a path lives on: the last-mounted one with the longest mount point above it."""
    best, best_len = None, -1
    for m in mounts:
        mp = m["mount_point"].rstrip("/") or "/"
        above = path == mp or path.startswith(mp if mp.endswith("/") else mp + "/")
        if above and len(mp) >= best_len:
            best, best_len = m, len(mp)
    return best


# ------------------------------------------------------------------ what the follow-up commands left



def proc_stat_state(text: str) -> str:
    """The state letter of /proc/PID/stat (R, S, D, T stopped, t traced, Z zombie): the field after
    the command name, which may itself hold spaces and parentheses."""
    return text[text.rindex(")") + 1:].split()[0]


def proc_stat_cpu_ticks(text: str) -> int:
    """utime + stime of /proc/PID/stat (fields 14 and 15, in clock ticks): the CPU time the process used."""
    fields = text[text.rindex(")") + 1:].split()  # fields[0] is field 3 (the state)
    return int(fields[11]) + int(fields[12])


def proc_stat_start_ticks(text: str) -> int:
    """starttime of /proc/PID/stat (field 22, clock ticks after boot): with the PID, which process this is
    (a PID can be reused; a restarted engine has another start time)."""
    return int(text[text.rindex(")") + 1:].split()[19])


def proc_stat_session(text: str) -> int:
    """The session id of /proc/PID/stat (the fourth field after the command name: state ppid pgrp session)."""
    return int(text[text.rindex(")") + 1:].split()[3])



def systemctl_show(text: str) -> list[dict[str, str]]:
    """`systemctl show UNIT... -p PROP,...`: one block of KEY=VALUE lines per unit, in the order the units
    were named, blocks apart by an empty line (systemctl(1), show: "the output is ... one property per line
    ... separated by an empty line between units"). A value may hold '=' (ExecStart's { path=... }); only
    the first one splits."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, eq, value = line.partition("=")
        if eq:
            blocks[-1][key] = value
    return [b for b in blocks if b]


# ------------------------------------------------------------------- DKMS (a distro's NVIDIA module, P34)

_DKMS_LINE = re.compile(r"^(?P<head>[^:]+):\s*(?P<state>\S.*?)\s*$")


def dkms_status(text: str) -> list[dict]:
    """`dkms status` lines as dicts {name, version, kernel, arch, state}: dkms 3's "NAME/VERSION, KERNEL, ARCH:
    installed" (or "NAME/VERSION: added" before any build), and dkms 2's "NAME, VERSION, KERNEL, ARCH: installed".
    A warning dkms appends in parentheses stays in the state ("installed (WARNING! Diff between built and
    installed module!)")."""
    out = []
    for line in text.splitlines():
        m = _DKMS_LINE.match(line.strip())
        if not m or line.startswith(("Error", "Warning", "WARNING")):
            continue
        parts = [x.strip() for x in m.group("head").split(",")]
        if "/" in parts[0]:
            name, _, version = parts[0].partition("/")
            rest = parts[1:]
        elif len(parts) >= 2:
            name, version, rest = parts[0], parts[1], parts[2:]
        else:
            continue
        out.append({"name": name, "version": version, "kernel": rest[0] if rest else None,
                    "arch": rest[1] if len(rest) > 1 else None, "state": m.group("state")})
    return out


_DKMS_ARRAY = re.compile(r'^\s*(BUILT_MODULE_NAME|DEST_MODULE_NAME|DEST_MODULE_LOCATION)\[(\d+)\]\s*=\s*"?([^"\s]*)"?',
                         re.M)
_DKMS_VAR = re.compile(r'^\s*PACKAGE_NAME\s*=\s*"?([^"\s]*)"?', re.M)


def dkms_conf_modules(text: str) -> list[dict]:
    """The modules a dkms.conf builds: [{built, dest, location}] by index (DEST_MODULE_NAME defaults to the built
    name; "$PACKAGE_NAME" expanded, as Debian's nvidia packages write it)."""
    pkg = (_DKMS_VAR.search(text) or [None, ""])[1]
    by: dict[int, dict] = {}
    for key, idx, value in _DKMS_ARRAY.findall(text):
        by.setdefault(int(idx), {})[key] = value.replace("${PACKAGE_NAME}", pkg).replace("$PACKAGE_NAME", pkg)
    out = []
    for _, v in sorted(by.items()):
        if "BUILT_MODULE_NAME" in v:
            out.append({"built": v["BUILT_MODULE_NAME"], "dest": v.get("DEST_MODULE_NAME") or v["BUILT_MODULE_NAME"],
                        "location": v.get("DEST_MODULE_LOCATION", "")})
    return out


def modprobe_routes(text: str) -> list[str]:
    """The modprobe.d lines that send `modprobe nvidia` somewhere else than the nvidia.ko depmod maps: an
    install command or an alias for nvidia (Debian's nvidia-modprobe.conf: "install nvidia modprobe -i
    nvidia-current-open $CMDLINE_OPTS")."""
    return [ln.strip() for ln in text.splitlines()
            if re.match(r"^\s*(install|alias)\s+nvidia(\s|$)", ln)]
