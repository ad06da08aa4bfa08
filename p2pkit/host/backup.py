"""What the driver and p2p-module stages replace, kept so that `p2pkit rollback` can put it back.

Layout: <state>/backup/<stage>/manifest.json and files/<path on the host>. The manifest records,
for every path a stage may replace or add, its state before p2pkit first touched it: "original"
(a copy is kept, with its sha256) or "absent" (p2pkit added it; rollback removes it). An entry is
written once: re-running a stage never overwrites the record of the host as it was.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.errors import P2pkitError, UsageError
from p2pkit.host import Host


def p2p_paths() -> list[str]:
    """The files the p2p-module role writes (its defaults/main.yml, p2pkit_p2p_module_paths), kept for rollback."""
    from p2pkit.core.role_defaults import role_default

    return list(role_default("p2pkit_p2p_module", "p2pkit_p2p_module_paths").values())


# what the fork builds and installs (its kernel-open/Makefile: nvidia-peermem too, tests/fixtures/fork-570.86.16-p2p)
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
# What NVIDIA's .run installer writes, replaces or removes (the library, firmware, binary and
# configuration entries of its .manifest): another driver's files there are kept before it runs.
USERSPACE_GLOBS = (
    "usr/lib/*-linux-gnu/libnvidia-*.so*", "usr/lib/*-linux-gnu/libcuda.so*",
    "usr/lib/*-linux-gnu/libcudadebugger.so*", "usr/lib/*-linux-gnu/libnvcuvid.so*",
    "usr/lib/*-linux-gnu/libnvoptix.so*", "usr/lib/*-linux-gnu/lib*_nvidia.so*",
    "usr/lib/*-linux-gnu/vdpau/libvdpau_nvidia.so*", "usr/lib/*-linux-gnu/gbm/nvidia-drm_gbm.so",
    "usr/lib/xorg/modules/drivers/nvidia_drv.so", "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so*",
    "lib/firmware/nvidia/*/*", "etc/OpenCL/vendors/nvidia.icd", "usr/share/vulkan/icd.d/nvidia_icd.json",
    "usr/share/vulkan/implicit_layer.d/nvidia_layers.json", "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "usr/share/egl/egl_external_platform.d/*nvidia*", "usr/share/nvidia/*",
    "usr/bin/nvidia-smi", "usr/bin/nvidia-debugdump", "usr/bin/nvidia-persistenced", "usr/bin/nvidia-cuda-mps-*",
    "usr/bin/nvidia-modprobe", "usr/bin/nvidia-settings", "usr/bin/nvidia-xconfig", "usr/bin/nvidia-powerd",
    "usr/bin/nvidia-bug-report.sh",
)


def userspace_paths(host: Host) -> list[str]:
    """The driver files on the host now (files and links) that the installer may replace or remove: what
    Path.glob finds for USERSPACE_GLOBS, each directory read once for all of them (usr/lib/<arch> holds
    thousands of entries on a real host, and six of the patterns list it; `status` asks on every run)."""
    root = str(host.root)
    listed: dict[str, list[os.DirEntry]] = {}
    found = set()
    for pattern in USERSPACE_GLOBS:
        for rel in _glob(root, pattern.split("/"), listed):
            p = os.path.join(root, rel)
            if os.path.isfile(p) or os.path.islink(p):
                found.add("/" + rel)
    return sorted(found)


def _glob(root: str, parts: list[str], listed: dict[str, list[os.DirEntry]]) -> list[str]:
    """The paths under root (relative) that match parts as Path.glob matches them (3.11: a wildcard matches
    dot names too, a directory on the way may be a link to one, case counts), the directories read through
    `listed` (a directory's entries, read once)."""
    found = [""]
    for i, part in enumerate(parts):
        last, nxt = i == len(parts) - 1, []
        for rel in found:
            here = os.path.join(root, rel)
            if not any(c in part for c in "*?["):
                p = os.path.join(here, part)
                if os.path.exists(p) if last else os.path.isdir(p):
                    nxt.append(os.path.join(rel, part))
                continue
            if here not in listed:
                try:
                    with os.scandir(here) as it:
                        listed[here] = list(it)
                except OSError:
                    listed[here] = []
            nxt += [os.path.join(rel, e.name) for e in listed[here]
                    if fnmatch.fnmatchcase(e.name, part) and (last or _is_dir(e))]
        found = nxt
    return found


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Backup:
    def __init__(self, state_dir: Path, stage: str, host: Host):
        self.dir = Path(state_dir) / "backup" / stage
        self.stage = stage
        self.host = host

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def manifest(self) -> dict:
        """The manifest, read only from p2pkit's own file (a link there is refused, exit 2); one that
        is not JSON is a UsageError naming it, never a traceback."""
        path = self.manifest_path
        try:
            doc = json.loads(safefs.read_text(path))
        except FileNotFoundError:
            return {"stage": self.stage, "entries": {}, "held_before": None}
        except (OSError, ValueError) as e:
            doc, why = None, str(e)
        else:
            why = "not a p2pkit backup manifest"
        if not (isinstance(doc, dict) and isinstance(doc.get("entries"), dict)):
            raise UsageError(f"the backup manifest {path} cannot be read: {why}",
                             hint=f"move it away (`mv {path} {path}.broken`): the {self.stage} stage then records the "
                                  "files it changes anew, and rollback puts back what was there before that run")
        return doc

    def save(self, m: dict) -> None:
        safefs.makedirs(self.dir)  # no link on the way below the state directory (issue 48 item 1)
        atomic_write(self.manifest_path, (json.dumps(m, indent=2, sort_keys=True) + "\n").encode())

    def copy_path(self, path: str) -> Path:
        return self.dir / "files" / path.lstrip("/")

    def snapshot(self, paths: list[str], kernel: str, driver_version: str, extra: dict | None = None,
                 files: tuple[str, ...] | list[str] = ()) -> dict:
        """Record each path's state before this run changes it (first time only). `files`: the paths the stage's
        role writes as regular files, where it refuses a link: a link found at one is left unrecorded (the run
        stops at the role's refusal; the next run, the link gone, records what is there then), never kept as what
        rollback puts back (the planted-link campaign on the container host: rollback re-made a link p2pkit had
        refused, and update-grub, as root, read its target as GRUB's drop-in)."""
        m = self.manifest()
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        for path in paths:
            if path in m["entries"]:
                continue
            real = self.host.path(path)
            if path in files and real.is_symlink():
                continue
            entry = {"kernel": kernel, "driver_version": driver_version, "time": now}
            if real.is_symlink():  # a library's soname link: its target is what was there
                target = os.readlink(real)
                entry.update(kind="symlink", target=target, sha256=hashlib.sha256(target.encode()).hexdigest())
            elif real.is_file():
                dest = self.copy_path(path)
                with open(real, "rb") as src, safefs.open_file(dest, "wb") as fh:  # never through a link
                    shutil.copyfileobj(src, fh)
                shutil.copystat(real, dest, follow_symlinks=False)
                entry.update(kind="original", sha256=sha256(dest), mode=real.stat().st_mode & 0o7777)
            else:
                entry.update(kind="absent")
            m["entries"][path] = entry
        for k, v in (extra or {}).items():
            if m.get(k) is None:
                m[k] = v
        self.save(m)
        return m

    def record_added(self, paths: list[str], kernel: str, driver_version: str) -> None:
        """Paths a stage created that were not there before it ran: rollback removes them."""
        m = self.manifest()
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        new = [p for p in paths if p not in m["entries"]]
        for path in new:
            m["entries"][path] = {"kind": "absent", "kernel": kernel, "driver_version": driver_version, "time": now}
        if new:
            self.save(m)

    def verify(self) -> list[str]:
        """Backed-up copies whose sha256 no longer matches the manifest (rollback refuses then)."""
        bad = []
        for path, e in self.manifest()["entries"].items():
            if e["kind"] == "original":
                copy = self.copy_path(path)
                if not copy.is_file() or sha256(copy) != e["sha256"]:
                    bad.append(str(copy))
        return bad

    def plan(self) -> list[tuple[str, str]]:
        out = []
        for path, e in sorted(self.manifest()["entries"].items()):
            real = self.host.path(path)
            exists = real.exists() or real.is_symlink()
            if e["kind"] in ("original", "symlink"):
                out.append(("restore", path))
            elif exists:
                out.append(("remove", path))
        return out

    def apply(self) -> list[tuple[str, str]]:
        bad = self.verify()
        if bad:
            raise P2pkitError(f"backed-up file changed since it was saved: {bad[0]} (sha256 differs from the "
                              "manifest); rollback would put back something else than what was there",
                              hint="restore that file from your own backup, or remove its entry from "
                                   f"{self.manifest_path} to leave that path as it is")
        done = []
        for action, path in self.plan():
            real = self.host.path(path)
            if action == "restore":
                real = self._placed(path)
                safefs.makedirs(real.parent, under=self.host.root)  # no link below the host's root
                e = self.manifest()["entries"][path]
                if real.is_symlink() or (e["kind"] == "symlink" and real.exists()):
                    real.unlink()
                if e["kind"] == "symlink":
                    os.symlink(e["target"], real)
                else:  # put in place by a rename: a link there now is replaced, never written through
                    safefs.atomic_write(real, self.copy_path(path).read_bytes(), e.get("mode", 0o644))
            else:
                real.unlink()
            done.append((action, path))
        return done


    def _placed(self, path: str) -> Path:
        """Where a kept file goes back: its directory with the links on the way resolved where no one but root (or
        this user) could have made or changed them (a merged /usr's /lib -> usr/lib, Debian's and Ubuntu's: the
        stock modules under /lib/modules), so the walk that puts it back meets no link; a link anyone else could
        have planted stays unresolved, and the walk refuses it (LinkRefused, exit 2)."""
        parent = os.path.dirname(path)
        canon = self.host.path(self.host.realpath(parent))
        if canon == self.host.path(parent) or safefs.first_untrusted(canon) is not None:
            return self.host.path(path)
        return canon / os.path.basename(path)


def module_paths(host: Host, kernel: str) -> list[str]:
    """The .ko files make modules_install overwrites, and the stock DKMS copies it moves aside."""
    base = f"/lib/modules/{kernel}"
    paths = [f"{base}/kernel/drivers/video/{m}.ko" for m in MODULES]
    updates = host.path(f"{base}/updates")
    if updates.is_dir():
        paths += sorted("/" + str(p.relative_to(host.root)) for p in updates.rglob("nvidia*.ko*"))
    return paths
