"""The probes of the facts that take more than one host probe, or a profile, to read: each is named in
the fact table (p2pkit/facts/table.py) beside its type. The others are host probes named there directly
(p2pkit/host/)."""

from __future__ import annotations

import re

from p2pkit.core import runner, writers
from p2pkit.core.role_defaults import role_default
from p2pkit.host import Host, kmod, launcher, system
from p2pkit.host import field_facts as hfield
from p2pkit.host import nvml as _nvml
from p2pkit.parse import system as ps


def _os(h: Host):
    return system.os_release(h)


def _iommu(h: Host):
    intent = ps.iommu_intent(system.cmdline(h), system.cpu_vendor(h))
    return {"intent": intent.mode, "detail": intent.detail, "cmdline_tokens": list(intent.tokens),
            "cpu_vendor": system.cpu_vendor(h)}


def _disk(h: Host):
    path = "/var/lib"  # where p2pkit's state, the engine and the model go
    return {"path": path, "free_bytes": system.free_bytes(h, path)}


def _dpkg(h: Host):
    text = system.dpkg_status(h)
    return None if text is None else [{"package": p, "status": s} for p, s in ps.dpkg_nvidia_problems(text)]


def _distro_dkms(h: Host):
    """A distro's NVIDIA module under DKMS (p2pkit.rules.distro): each such DKMS module with its package, and the
    modprobe.d files that route nvidia to it."""
    from p2pkit.host import dkms

    mods = dkms.nvidia_modules(h)
    return {"modules": mods, "routes": dkms.modprobe_routes(h) if mods else {}}


def _cgroup(h: Host):
    """p2pkit's own cgroup and its caps, and whether systemd is PID 1 (whether the engine's cgroup will be
    a systemd slice or the one p2pkit's launcher makes)."""
    cg = system.self_cgroup(h)
    caps = system.memory_caps(h, cg)
    return {"v2_path": cg.v2_path, "v1_memory_path": cg.v1.get("memory"),
            "memory_caps": [{"file": f, "limit_bytes": n} for f, n in caps],
            "systemd_booted": launcher.systemd_booted(h)}


def _guards(h: Host):
    files = role_default("p2pkit_driver", "p2pkit_driver_guard_files")  # where the driver role writes them

    def has(path: str, needle: str) -> bool:
        return h.exists(path) and needle in h.read(path)
    return {
        "nouveau_blacklisted": has(files["nouveau_blacklist"], "blacklist nouveau"),
        "apt_pin": has(files["apt_pin"], "Pin-Priority: -1"),
        "unattended_upgrades_blacklist": has(files["unattended_upgrades"], "Package-Blacklist"),
    }


def _built_module(h: Host, profile):
    from p2pkit.core.config import p2p_src_dir

    src = p2p_src_dir(profile)
    ko = f"{src}/kernel-open/nvidia.ko"
    if not h.exists(ko):
        return {"path": ko, "srcversion": None, "error": f"{ko} has not been built"}
    r = h.runner.run(["modinfo", "-F", "srcversion", str(h.path(ko))], check=False)
    # the kernel the tree was last built for: the newest build stamp (.p2pkit-built-<kernel>-<commit>,
    # written after each build; a build for another kernel leaves the earlier stamps)
    head, tail = ".p2pkit-built-", f"-{profile.p2p_module.commit}"
    stamps = sorted((h.path(f"{src}/{n}").stat().st_mtime_ns, n[len(head):-len(tail)]) for n in h.listdir(src)
                    if n.startswith(head) and n.endswith(tail) and len(n) > len(head) + len(tail))
    return {"path": ko, "srcversion": r.stdout.strip() or None, "kernel": stamps[-1][1] if stamps else None}


def _head(h: Host, profile):
    """A worker node's view of its head (P27): whether the head's rendezvous port accepts a connection
    now. Read-only; nothing on the head changes. Only a worker of a multi-node engine has a head."""
    import socket

    from p2pkit.rules.engine_cmd import node

    n = node(profile)
    if n["role"] != "worker":
        return {"role": n["role"]}
    addr = f"{n['master_addr']}:{n['master_port']}"
    try:
        with socket.create_connection((n["master_addr"], n["master_port"]), timeout=2):
            return {"role": "worker", "address": addr, "up": True}
    except (OSError, TypeError, ValueError) as e:
        return {"role": "worker", "address": addr, "up": False, "why": str(e) or type(e).__name__}


def _vram_fit(h: Host, profile, nvml: dict | None = None):
    """P18's inputs: the model's size and KV shape, each GPU's free VRAM (plus what the running engine
    already holds: it gives that back on a restart), and for llama.cpp which KV types its tree accepts
    with tensor split. `nvml`: the same collection's nvml fact (the table's uses), else read here."""
    from p2pkit.host import model
    from p2pkit.rules import engine_cmd
    nv = nvml if isinstance(nvml, dict) else _nvml.facts(h)
    pid = launcher.engine_process(h)["pid"]  # the launcher's record, or the unit's MainPID
    mine = set(system.process_tree(h, pid)) if pid else set()
    gpus: list | dict = {"error": nv["error"]} if "error" in nv else []
    for g in [] if isinstance(gpus, dict) else nv.get("gpus", []):
        procs = g.get("processes") if isinstance(g.get("processes"), list) else []
        free = g.get("memory_free", g.get("memory_total"))  # a recorded document without free: nothing runs
        gpus.append({"index": g["index"], "total": g.get("memory_total"), "free": free if isinstance(free, int)
                     else None, "engine_used": sum(x["used"] or 0 for x in procs if x["pid"] in mine)})
    out = {"model": model.model_shape(h, profile, engine_cmd.draft_model(profile)), "gpus": gpus}
    return {**out, **engine_cmd.engine(profile).fit_facts(h, profile)}
def _engine_nccl(h: Host):
    """The NCCL the running engine has mapped (P37), or that it is not running (found through the
    launcher's record where systemd is not PID 1, else the unit's MainPID)."""
    pid = launcher.engine_process(h)["pid"]
    return {"running": False} if pid is None else hfield.process_nccl(h, pid)


def _engine_files(h: Host, profile):
    """The engine binary the profile names, now: its identity (one stat) and what ldd resolves for it. The engine
    gate compares them with what its artifact recorded when the build hashed the binary."""
    from p2pkit.parse import build as pb
    from p2pkit.rules import engine_cmd

    exe = h.path(engine_cmd.binary(profile))
    out: dict = {"path": str(exe), "identity": system.file_identity(exe)}
    if out["identity"] is not None and engine_cmd.engine(profile).LINKED_BINARY:
        out["libraries"] = pb.ldd(h.runner.run(["ldd", str(exe)], check=False).stdout)
    return {"binary": out}


def _driver_files(h: Host, profile):
    """The userspace driver's files of the pinned version the installer wrote (its libraries, its GSP firmware,
    nvidia-smi and its other programs), now: each one's identity (one stat, issue 48 item 3). The driver act
    records their sha256 beside it (<state>/driver-files.json) and reinstalls where one no longer matches."""
    return {path: {"identity": system.file_identity(h.path(path))} for path in installed_driver_files(h, profile)}


def installed_driver_files(h: Host, profile) -> list[str]:
    """The installer's files of this version as the host names them: the libraries named for the version, the
    firmware directory of the version, the nvidia-* programs in /usr/bin; regular files only (its links are
    the installer's to remake)."""
    from p2pkit.host.backup import userspace_paths

    v = profile.driver.version
    out = [x for x in userspace_paths(h) if (f".so.{v}" in x or f"/lib/firmware/nvidia/{v}/" in x)]
    out += [f"/usr/bin/{n}" for n in h.listdir("/usr/bin") if n.startswith("nvidia-")]
    return sorted(x for x in out if h.path(x).is_file() and not h.path(x).is_symlink())


def _service_files(h: Host):
    """The files the service stage writes (its unit, slice and environment files), now, None where nothing is
    there: the sha256 of each (a few hundred bytes; content, not identity, since `bench --ab` puts the same bytes
    back), {"error": ...} where this user may not read one; the secrets file by its identity only (one stat: a
    digest of a short, guessable text in a world-readable artifact would let its values be tried offline). The
    service gate compares them with what its artifact recorded."""
    from p2pkit.host.backup import sha256

    out: dict = {}
    for path in system.ENGINE_FILES:
        p = h.path(path)
        if path == system.ENGINE_SECRETS_FILE:
            ident = system.file_identity(p)
            out[path] = {"identity": ident} if ident is not None else None
            continue
        try:
            out[path] = {"sha256": sha256(p)} if p.is_file() else None
        except OSError as e:
            out[path] = {"error": f"could not read {path}: {e.strerror or e}"}
    return out


def _model_file(h: Host, profile):
    """The model output the profile names, now (one stat; an HF model served as it is: its directory)."""
    m = profile.model
    if m.format == "hf":
        return {"path": m.source, "directory": h.path(m.source).is_dir()}
    return {"path": m.output, "identity": system.file_identity(h.path(m.output)) if m.output else None}


def _profile_nccl(h: Host, profile):
    """The version of the NCCL the profile points the engine at (P16)."""
    root = profile.engine.nccl_root
    if not root or not profile.engine.nccl_min:
        return None
    lib = f"{root}/lib/libnccl.so.2"
    if not h.exists(lib):
        return {"path": lib, "error": f"{lib} does not exist", "by_hand": f"ls -l {root}/lib"}
    v = hfield.library_nccl_version(h, lib)
    return {"path": lib, "version": ".".join(map(str, v)) if v else None}


def _engine_archs(h: Host, profile):
    """The architectures the engine's CUDA kernels were built for (P39)."""
    from p2pkit.rules import engine_cmd

    if not profile.engine.cuda:
        return {"missing": "a CPU build (engine.cuda = false) has no CUDA kernels"}
    base, pattern = engine_cmd.engine(profile).kernel_library(profile)
    found = sorted(h.path(base).glob(pattern)) if h.exists(base) else []
    if not found:
        return {"missing": f"no engine kernel library ({pattern}) under {base}: the engine is not built yet"}
    return hfield.cuobjdump_archs(h, h.host_path(found[0]))


def _engine_env_file(h: Host):
    path = system.ENGINE_ENV_FILE
    if not h.exists(path):
        return {"path": path, "env": None}
    # read as systemd reads it: a line ends at \n or \r only (a U+2028 in a value is part of it)
    return {"path": path, "env": writers.read_env_file(h.read(path, "the engine's environment file"))}


TIMER_PROPS = ["LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload", "FragmentPath", "Triggers",
               "NextElapseUSecRealtime", "LastTriggerUSec"]
SERVICE_PROPS = ["LoadState", "ActiveState", "UnitFileState", "NeedDaemonReload", "FragmentPath", "ExecStart"]


def _restore_units(h: Host):
    """systemd's own view of the restore timer and its service, where systemd is PID 1 (`systemctl show`): what
    it loaded and runs, which the files on disk do not tell (a timer whose file is gone still fires; one edited
    and not reloaded runs the old settings)."""
    if not launcher.systemd_booted(h):
        return {"systemd": False}
    timer, unit = (system.RESTORE_TIMER.rpartition("/")[2], system.RESTORE_UNIT.rpartition("/")[2])
    props = sorted(set(TIMER_PROPS) | set(SERVICE_PROPS))
    view = system.unit_view(h, [timer, unit], props)
    return {"systemd": True, "timer": {"name": timer, "path": system.RESTORE_TIMER, **view[timer]},
            "service": {"name": unit, "path": system.RESTORE_UNIT, **view[unit]}}


ENGINE_UNIT_PROPS = ["LoadState", "ActiveState", "NeedDaemonReload", "FragmentPath", "DropInPaths", "Slice",
                     "MemoryMax", "User", "ExecStart"]


def _engine_unit(h: Host):
    """The engine's unit as systemd loaded it (`systemctl show`), where systemd is PID 1 and the unit file is
    there: the settings it runs with, which a file edited and not reloaded, or a drop-in, makes other than the
    role's file."""
    if not launcher.systemd_booted(h) or not h.path(system.ENGINE_UNIT_FILE).is_file():
        return {"systemd": launcher.systemd_booted(h), "installed": False}
    unit = system.ENGINE_UNIT
    return {"systemd": True, "installed": True, "name": unit, "path": system.ENGINE_UNIT_FILE,
            "user": system.ENGINE_USER, **system.unit_view(h, [unit], ENGINE_UNIT_PROPS)[unit]}


def _boot_hold(h: Host):
    """The kernel hook's hold on the boot default (P36): which kernel it keeps booting, for which new one."""
    if not h.exists(system.BOOT_HOLD):
        return {"held": None}
    text = h.read(system.BOOT_HOLD, "the boot-default hold")
    kv = dict(m.groups() for m in re.finditer(r"^# p2pkit-(kernel|new_kernel)=(\S+)", text, re.M))
    held = {"kernel": kv.get("kernel", "?"), "new_kernel": kv.get("new_kernel", "?")}
    if held["new_kernel"] != "?":  # what modprobe would load for the kernel held back, as modinfo says now
        held["module"] = kmod.modinfo(h, held["new_kernel"])
    return {"held": held}


# status and doctor ask a running engine once, briefly: a frozen one does not answer (times this machine's load per
# CPU where it is over 1: a loaded machine's systemctl and engine are slow, not frozen)
LIVE_TIMEOUT_S = 2.0


def _engine_live(h: Host, profile):
    """The engine as it is now, each probe bounded by a second or two: its main PID (the launcher's
    record, or the unit's MainPID), that process's state (T: stopped), and /health once (a headless
    worker serves none)."""
    limit = runner.under_load(LIVE_TIMEOUT_S)
    proc = launcher.engine_process(h, timeout=limit)
    if proc["manager"] is None:
        return {"installed": False}
    from p2pkit.host import engine_api
    from p2pkit.rules import engine_cmd

    pid = proc["pid"]
    out = {"installed": True, "manager": proc["manager"], "pid": pid, "state": proc["state"],
           "role": engine_cmd.node(profile)["role"]}
    if pid and out["role"] != "worker" and proc["state"] not in ("T", "t"):  # a stopped one cannot answer: not asked
        code, body = engine_api.get(engine_cmd.health_url(profile), timeout=limit)
        out["health"] = {"code": code, "text": body.strip()[:160]}
        if code is None:  # nothing listening yet may be an engine still starting (after a boot): how long it runs
            from p2pkit.host import system

            out.update(age_s=system.process_age_s(h, pid), starting_window_s=profile.serve.health_timeout_s)
    if pid and out["role"] == "worker":  # a headless worker outlives its head: its head's rendezvous, asked once
        n = engine_cmd.node(profile)
        out["head"] = engine_api.port_answers(n["master_addr"], n["master_port"], LIVE_TIMEOUT_S)
    return out
