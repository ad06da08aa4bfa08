"""OS, kernel, identity, Secure Boot, disk, dpkg, user, cgroup: read through the host root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from p2pkit.core.errors import ProbeError
from p2pkit.host import Host
from p2pkit.parse import system as ps

SECUREBOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def os_release(host: Host) -> dict[str, str]:
    for p in ("/etc/os-release", "/usr/lib/os-release"):
        if host.exists(p):
            return ps.os_release(host.read(p, "the OS release"))
    raise ProbeError("the OS release", "neither /etc/os-release nor /usr/lib/os-release exists")


def kernel_release(host: Host) -> str:
    return host.read("/proc/sys/kernel/osrelease", "the kernel release").strip()


def identity(host: Host) -> dict[str, str]:
    def get(p, what):
        try:
            return host.read(p, what).strip()
        except ProbeError as e:
            return f"unknown ({e.why})"
    return {
        "machine_id": get("/etc/machine-id", "the machine id"),
        "boot_id": get("/proc/sys/kernel/random/boot_id", "the boot id"),
        "kernel": get("/proc/sys/kernel/osrelease", "the kernel release"),
        "hostname": get("/proc/sys/kernel/hostname", "the hostname"),
    }


def boot_id(host: Host) -> str:
    return host.read("/proc/sys/kernel/random/boot_id", "the boot id").strip()


def cmdline(host: Host) -> str:
    return host.read("/proc/cmdline", "the kernel command line").strip()


def cpu_vendor(host: Host) -> str:
    for line in host.read("/proc/cpuinfo", "the CPU vendor").splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def secure_boot(host: Host) -> str:
    """'on', 'off', or 'legacy-bios' (no EFI: Secure Boot cannot be on)."""
    if not host.exists("/sys/firmware/efi"):
        return "legacy-bios"
    if not host.exists(SECUREBOOT_VAR):
        return "off"
    data = host.read_bytes(SECUREBOOT_VAR, "the Secure Boot state")
    if len(data) < 5:
        raise ProbeError("the Secure Boot state", f"{SECUREBOOT_VAR} holds {len(data)} bytes, expected 5")
    return "on" if data[4] == 1 else "off"


TOOLS = ("make", "cc", "c++", "systemd-analyze", "cmake", "ninja", "pkg-config", "git")


def tools(host: Host) -> dict[str, str | None]:
    """Where each command a later stage runs is found on the PATH p2pkit runs commands with."""
    return {t: host.runner.which(t) for t in TOOLS}


def is_root(host: Host) -> bool:
    if host.tree:
        return host.sim_fact("euid", 0) == 0
    return os.geteuid() == 0


def free_bytes(host: Host, path: str) -> int:
    if host.tree:
        return int(host.sim_fact("disk_free_bytes", 0))
    p = host.path(path)  # the host's filesystem, never this machine's own where the root is not /
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def dpkg_status(host: Host) -> str | None:
    p = "/var/lib/dpkg/status"
    return host.read(p, "the dpkg database") if host.exists(p) else None


def self_cgroup(host: Host) -> ps.ProcCgroup:
    return ps.proc_cgroup(host.read("/proc/self/cgroup", "p2pkit's own cgroup"))


def memory_caps(host: Host, cg: ps.ProcCgroup) -> list[tuple[str, int]]:
    """Every memory limit on the path from the cgroup up to the root, v2 and v1."""
    caps = []
    if cg.v2_path is not None and host.exists("/sys/fs/cgroup/cgroup.controllers"):
        caps += _walk(host, "/sys/fs/cgroup", cg.v2_path, "memory.max")
    if "memory" in cg.v1 and host.exists("/sys/fs/cgroup/memory"):
        caps += _walk(host, "/sys/fs/cgroup/memory", cg.v1["memory"], "memory.limit_in_bytes")
    return caps


def pid_caps(host: Host, pid: int) -> dict:
    """A process's own cgroup chain and every memory cap up it (P12): the service's main PID, or the
    launcher's engine."""
    try:
        cg = ps.proc_cgroup(host.read(f"/proc/{pid}/cgroup", f"the cgroup of pid {pid}"))
    except ProbeError as e:
        return {"error": e.message}
    return {"v2_path": cg.v2_path, "v1_memory_path": cg.v1.get("memory"),
            "memory_caps": [{"file": f, "limit_bytes": n} for f, n in memory_caps(host, cg)]}


def _walk(host: Host, mount: str, path: str, fname: str) -> list[tuple[str, int]]:
    caps = []
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts), -1, -1):
        d = "/".join([mount, *parts[:i]])
        f = f"{d}/{fname}"
        if host.exists(f):
            try:
                limit = ps.memory_limit(host.read(f))
            except (ValueError, ProbeError):
                continue
            if limit is not None:
                caps.append((f, limit))
    return caps


def package_holds(host: Host) -> dict:
    """Installed packages and the held ones, read as the driver playbook reads them: what apt may
    replace on the next upgrade (P02). One dpkg-query answers both: the abbreviation's first letter
    is the selection dpkg keeps, 'h' the hold `apt-mark showhold` lists (dpkg-query(1)) for every
    installed package; apt-mark itself would load apt's whole cache to print those names."""
    q = host.runner.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Package}\n"], check=False)
    if q.returncode not in (0, 1):
        raise ProbeError("package holds", q.stderr.strip()[-300:] or "dpkg-query failed")
    return {"installed": ps.dpkg_installed(q.stdout), "held": ps.dpkg_held(q.stdout)}


# The restore units and hooks: the p2p-module role states their paths (p2pkit_p2p_module_paths in its
# defaults/main.yml) and p2pkit reads them there when first asked (module attributes RESTORE_UNIT, RESTORE_TIMER,
# KERNEL_HOOK, APT_HOOK, MODPROBE_CONF, never read at import), and TIMER_WANTS: the link `systemctl enable` makes
# for the timer.
P2P_ROLE = "p2pkit_p2p_module"
_P2P_PATHS = {"RESTORE_UNIT": "restore_service", "RESTORE_TIMER": "restore_timer", "KERNEL_HOOK": "kernel_hook",
              "APT_HOOK": "apt_hook", "MODPROBE_CONF": "modprobe_conf"}


def restore_guards(host: Host) -> dict[str, bool]:
    """What the p2p-module stage installs so that upgrades cannot leave the host without the patched
    module (P02): the restore service, its timer enabled (its timers.target.wants link, the unit not
    masked), the kernel postinst hook (executable) and the apt hook."""
    def has(path: str, needle: str) -> bool:
        return host.path(path).is_file() and needle in host.read(path)
    unit, timer = __getattr__("RESTORE_UNIT"), __getattr__("RESTORE_TIMER")
    hook = host.path(__getattr__("KERNEL_HOOK"))
    return {
        "restore service": has(unit, "restore"),
        "restore timer enabled": host.path(host.realpath(__getattr__("TIMER_WANTS"))).is_file()
        and host.realpath(timer) != "/dev/null",
        "kernel postinst hook": hook.is_file() and os.access(hook, os.X_OK) and "restore --kernel" in hook.read_text(),
        "apt hook": has(__getattr__("APT_HOOK"), unit.rpartition("/")[2]),
    }


def unit_view(host: Host, units: list[str], props: list[str], timeout: float | None = None) -> dict[str, dict]:
    """systemd's own view of each unit, as the running manager holds it (`systemctl show UNIT... -p ...`): the
    settings it loaded, not the file on disk (a unit edited and not reloaded says NeedDaemonReload=yes; one
    whose file is gone stays loaded while it is active). Keyed by the unit's name; Id is always read."""
    want = ["Id", *[p for p in props if p != "Id"]]
    r = host.runner.run(["systemctl", "show", *units, "-p", ",".join(want)], check=False, timeout=timeout)
    blocks = ps.systemctl_show(r.stdout)
    if r.returncode != 0 or len(blocks) != len(units):
        raise ProbeError(f"systemd's view of {', '.join(units)}", (r.stderr or r.stdout).strip()[-300:]
                         or f"systemctl show exited {r.returncode} with {len(blocks)} of {len(units)} units")
    return {unit: block for unit, block in zip(units, blocks, strict=True)}


def process_tree(host: Host, pid: int) -> list[int]:
    """pid and its descendants, from /proc/PID/task/TID/children (the engine's workers too)."""
    out, todo = [], [pid]
    while todo and len(out) < 512:
        p = todo.pop(0)
        out.append(p)
        for tid in host.listdir(f"/proc/{p}/task"):
            try:
                todo += [int(c) for c in host.read(f"/proc/{p}/task/{tid}/children").split()]
            except ProbeError:
                continue
    return out


def mapped_under(host: Host, pid: int, directory: str) -> dict:
    """The mappings of files under directory in the engine's processes, with their VmFlags (P26)."""
    d = directory.rstrip("/") + "/"
    maps, unread = [], []
    for p in process_tree(host, pid):
        try:
            text = host.read(f"/proc/{p}/smaps", f"the mappings of pid {p}")
        except ProbeError as e:
            unread.append(e.message)
            continue
        maps += [{"pid": p, **m} for m in ps.smaps_mappings(text) if host.host_path(Path(m["path"])).startswith(d)
                 or m["path"].startswith(d)]
    return {"pid": pid, "directory": directory, "mappings": maps, **({"unread": unread} if unread else {})}


# The engine's unit, environment files and user: the service role states them (its defaults/main.yml) and p2pkit reads
# them there when first asked (module attributes ENGINE_UNIT, ENGINE_ENV_FILE, ENGINE_SECRETS_FILE, ENGINE_USER, never
# read at import; ENGINE_UNIT_FILE, the unit's path), and ENGINE_FILES: what the service stage writes (the service
# role's unit, slice and environment files), its gate's proof that they are still the files it proved.
SERVICE_ROLE = "p2pkit_service"
_SERVICE_DEFAULTS = {"ENGINE_UNIT": "p2pkit_service_unit", "ENGINE_ENV_FILE": "p2pkit_service_env_file",
                     "ENGINE_SECRETS_FILE": "p2pkit_service_secrets_file", "ENGINE_USER": "p2pkit_service_user"}
BOOT_HOLD = "/etc/default/grub.d/61-p2pkit-boot-default.cfg"  # the kernel hook's boot default (P36)


def __getattr__(name: str):
    if name in _SERVICE_DEFAULTS:
        from p2pkit.core.role_defaults import role_default

        value = role_default(SERVICE_ROLE, _SERVICE_DEFAULTS[name])
        if name == "ENGINE_UNIT":  # a file name under /etc/systemd/system, never a path elsewhere
            from p2pkit.core import unitenv
            from p2pkit.core.role_defaults import broken

            try:
                unitenv.unit_name(_SERVICE_DEFAULTS[name], value)
            except unitenv.Refused as e:
                raise broken(SERVICE_ROLE, f"its {e.message}") from None
        return value
    if name in _P2P_PATHS:
        from p2pkit.core.role_defaults import role_default

        return role_default(P2P_ROLE, "p2pkit_p2p_module_paths")[_P2P_PATHS[name]]
    if name == "TIMER_WANTS":
        return "/etc/systemd/system/timers.target.wants/" + __getattr__("RESTORE_TIMER").rpartition("/")[2]
    if name == "ENGINE_UNIT_FILE":
        return f"/etc/systemd/system/{__getattr__('ENGINE_UNIT')}"
    if name == "ENGINE_FILES":
        return (__getattr__("ENGINE_UNIT_FILE"), "/etc/systemd/system/p2pkit.slice",
                __getattr__("ENGINE_ENV_FILE"), __getattr__("ENGINE_SECRETS_FILE"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def service_main_pid(host: Host, unit: str | None = None, timeout: float | None = None) -> int | None:
    """The running unit's main PID as systemd reports it (the engine's unit by default), or None."""
    unit = unit or __getattr__("ENGINE_UNIT")
    r = host.runner.run(["systemctl", "show", "-p", "MainPID", "--value", unit], check=False, timeout=timeout)
    v = r.stdout.strip()
    return int(v) if v.isdigit() and int(v) > 0 else None


def process_start(host: Host, pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat), None when it is gone."""
    try:
        return ps.proc_stat_start_ticks(host.path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def process_age_s(host: Host, pid: int) -> float | None:
    """Seconds since the process started (its start time in /proc/PID/stat against /proc/uptime, both counted
    from the boot), None where either cannot be read."""
    start = process_start(host, pid)
    try:
        up = float(host.path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if start is None:
        return None
    age = up - start / os.sysconf("SC_CLK_TCK")
    return round(age, 1) if age >= 0 else None


def file_identity(path: Path) -> dict | None:
    """What tells one file from another without reading it: its device, inode and size, and its modification
    and change times in nanoseconds (the change time moves with every write, rename, chmod or chown, and no
    user can set it back); None when nothing is there. Recorded beside a file's sha256, it lets `status` see
    a moved, replaced or rewritten file at the cost of one stat (a multi-GB model is never hashed there)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def process_cpu(host: Host, pid: int) -> dict | None:
    """The process's state letter and the CPU time (clock ticks) it and its descendants used, from
    /proc/PID/stat and /proc/PID/task/*/children; None when it is gone."""
    try:
        text = host.path(f"/proc/{pid}/stat").read_text()
        state, ticks = ps.proc_stat_state(text), ps.proc_stat_cpu_ticks(text)
    except (OSError, ValueError, IndexError):
        return None
    todo, seen = [pid], {pid}
    while todo:  # an engine's workers (vLLM's engine core, llama.cpp's none) load too
        p = todo.pop()
        for kids in host.path(f"/proc/{p}/task").glob("*/children"):
            try:
                found = [int(x) for x in kids.read_text().split()]
            except (OSError, ValueError):
                continue
            for c in found:
                if c in seen:
                    continue
                seen.add(c)
                todo.append(c)
                try:
                    ticks += ps.proc_stat_cpu_ticks(host.path(f"/proc/{c}/stat").read_text())
                except (OSError, ValueError, IndexError):
                    pass
    return {"state": state, "cpu_ticks": ticks, "processes": len(seen)}


def process_state(host: Host, pid: int) -> str | None:
    """The process's state letter from /proc/PID/stat (T: stopped), or None when it is gone."""
    try:
        return ps.proc_stat_state(host.path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
