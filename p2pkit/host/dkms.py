"""A distro's NVIDIA kernel module under DKMS (Debian's nvidia-open-kernel-dkms, Ubuntu's nvidia-dkms-N): what
DKMS builds, for which kernels, the package that brought it and whether its owner holds it, and the modprobe.d
lines that send `modprobe nvidia` to it. Read from the real tools: `dkms status`, the module's dkms.conf,
`dpkg-query -S` and `-W`."""

from __future__ import annotations

import os

from p2pkit.core.errors import P2pkitError
from p2pkit.host import Host
from p2pkit.parse import system as ps

DKMS = "/usr/sbin/dkms"
TREE = "/var/lib/dkms"
MODPROBE_D = "/etc/modprobe.d"


def nvidia_modules(host: Host) -> list[dict]:
    """Each DKMS module whose dkms.conf builds an nvidia.ko (BUILT_MODULE_NAME "nvidia"), as `dkms status` lists
    it: {dkms: NAME/VERSION, name, version, kernels: {K: state}, state (one without a kernel: "added"), modules
    (the file names DKMS installs), package, package_version, package_status (dpkg's abbreviation), held}.
    Empty where DKMS is not installed."""
    if not host.exists(DKMS):
        return []
    r = host.runner.run(["dkms", "status"], check=False, timeout=60)
    if r.returncode != 0:
        raise P2pkitError(f"dkms status exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}",
                          hint="run `sudo dkms status` and fix what it says, then run p2pkit again")
    found: dict[tuple[str, str], dict] = {}
    for line in ps.dkms_status(r.stdout):
        key = (line["name"], line["version"])
        if key not in found:
            conf = _conf(host, *key)
            mods = ps.dkms_conf_modules(conf or "")
            if not any(m["built"] == "nvidia" for m in mods):
                continue
            found[key] = {"dkms": f"{key[0]}/{key[1]}", "name": key[0], "version": key[1], "kernels": {},
                          "state": None, "modules": mods, **owner(host, f"/usr/src/{key[0]}-{key[1]}")}
        if line["kernel"]:
            found[key]["kernels"][line["kernel"]] = line["state"]
        else:
            found[key]["state"] = line["state"]
    return list(found.values())


def _conf(host: Host, name: str, version: str) -> str | None:
    for p in (f"{TREE}/{name}/{version}/source/dkms.conf", f"/usr/src/{name}-{version}/dkms.conf"):
        if host.exists(p):
            return host.read(p, "a DKMS module's dkms.conf")
    return None


def owner(host: Host, path: str) -> dict:
    """The package that owns `path` (dpkg-query -S), its version and dpkg's status abbreviation ("hi ": held,
    installed; "iF": half-configured); {package: None} when no package owns it (a module added by hand)."""
    r = host.runner.run(["dpkg-query", "-S", path], check=False)
    if r.returncode != 0 or ":" not in r.stdout:
        return {"package": None, "package_version": None, "package_status": None, "held": False}
    pkg = r.stdout.split(":", 1)[0].split(",")[0].strip()
    q = host.runner.run(["dpkg-query", "-W", "-f=${Version}\t${db:Status-Abbrev}", pkg], check=False)
    version, _, abbrev = q.stdout.partition("\t")
    return {"package": pkg, "package_version": version or None, "package_status": abbrev.strip() or None,
            "held": abbrev.startswith("h")}


def tree_paths(host: Host, mod: dict) -> list[str]:
    """What DKMS keeps of `mod` and `dkms remove` deletes, as host paths: its tree under /var/lib/dkms (the source
    link, each kernel's built modules and make.log, the kernel-K-ARCH links; not build/, the objects of the last
    build, which a rebuild makes again) and the modules it installed under each kernel's DEST_MODULE_LOCATION."""
    out = []
    top = f"{TREE}/{mod['name']}"
    for d, dirs, files in os.walk(host.path(top)):
        rel = host.host_path(d)
        if rel == f"{top}/{mod['version']}":
            dirs[:] = [x for x in dirs if x != "build"]
        for n in [*files, *[x for x in dirs if os.path.islink(os.path.join(d, x))]]:
            p = f"{rel}/{n}"
            if p.startswith(f"{top}/{mod['version']}/") or (rel == top and n.startswith("kernel-")):
                out.append(p)
        dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x))]
    for kernel in mod["kernels"]:
        for m in mod["modules"]:
            base = f"/lib/modules/{kernel}/{m['location'].strip('/')}"
            if host.path(base).is_dir():
                out += [f"{base}/{n}" for n in host.listdir(base) if n.split(".ko")[0] == m["dest"]
                        and ".ko" in n]
    return sorted(set(out))


def modprobe_routes(host: Host) -> dict[str, list[str]]:
    """The files in /etc/modprobe.d whose lines send `modprobe nvidia` elsewhere (an install command or an alias
    for nvidia: Debian's alternatives link nvidia.conf to its nvidia-modprobe.conf), each with those lines. The
    link is named, not its target: it is what modprobe reads and what a rollback puts back."""
    out = {}
    for n in host.listdir(MODPROBE_D):
        p = f"{MODPROBE_D}/{n}"
        if not n.endswith(".conf") or not host.path(p).is_file():
            continue
        lines = ps.modprobe_routes(host.read(p, "a modprobe.d file"))
        if lines:
            out[p] = lines
    return out
