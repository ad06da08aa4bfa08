"""What the driver and p2p-module stages replace, kept so that `p2pkit rollback` can put it back.

Layout: <state>/backup/<stage>/manifest.json and files/<path on the host>. The manifest records,
for every path a stage may replace or add, its state before p2pkit first touched it: "original"
(a copy is kept, with its sha256) or "absent" (p2pkit added it; rollback removes it). An entry is
written once: re-running a stage never overwrites the record of the host as it was.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
from pathlib import Path

from p2pkit.artifacts import atomic_write
from p2pkit.errors import P2pkitError
from p2pkit.host import Host

DRIVER_PATHS = [
    "/etc/modprobe.d/p2pkit-blacklist-nouveau.conf",
    "/etc/apt/preferences.d/p2pkit-nvidia",
    "/etc/apt/apt.conf.d/51p2pkit-unattended-upgrades",
]
P2P_PATHS = [
    "/etc/default/grub.d/60-p2pkit-iommu.cfg",
    "/etc/kernel/postinst.d/zz-p2pkit",
    "/etc/apt/apt.conf.d/99p2pkit-restore",
    "/etc/systemd/system/p2pkit-restore.service",
    "/etc/systemd/system/p2pkit-restore.timer",
]
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")


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
        if not self.manifest_path.exists():
            return {"stage": self.stage, "entries": {}, "held_before": None}
        return json.loads(self.manifest_path.read_text())

    def save(self, m: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.manifest_path, (json.dumps(m, indent=2, sort_keys=True) + "\n").encode())

    def copy_path(self, path: str) -> Path:
        return self.dir / "files" / path.lstrip("/")

    def snapshot(self, paths: list[str], kernel: str, driver_version: str, extra: dict | None = None) -> dict:
        """Record each path's state before this run changes it (first time only)."""
        m = self.manifest()
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        for path in paths:
            if path in m["entries"]:
                continue
            real = self.host.path(path)
            entry = {"kernel": kernel, "driver_version": driver_version, "time": now}
            if real.is_file() and not real.is_symlink():
                dest = self.copy_path(path)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(real, dest)
                entry.update(kind="original", sha256=sha256(dest), mode=real.stat().st_mode & 0o7777)
            else:
                entry.update(kind="absent")
            m["entries"][path] = entry
        for k, v in (extra or {}).items():
            if m.get(k) is None:
                m[k] = v
        self.save(m)
        return m

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
            if e["kind"] == "original":
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
                real.parent.mkdir(parents=True, exist_ok=True)
                e = self.manifest()["entries"][path]
                shutil.copy2(self.copy_path(path), real)
                real.chmod(e.get("mode", 0o644))
            else:
                real.unlink()
            done.append((action, path))
        return done


def module_paths(host: Host, kernel: str) -> list[str]:
    """The .ko files make modules_install overwrites, and the stock DKMS copies it moves aside."""
    base = f"/lib/modules/{kernel}"
    paths = [f"{base}/kernel/drivers/video/{m}.ko" for m in MODULES]
    updates = host.path(f"{base}/updates")
    if updates.is_dir():
        paths += sorted("/" + str(p.relative_to(host.root)) for p in updates.rglob("nvidia*.ko*"))
    return paths
