"""backup.userspace_paths reads each directory once for all of USERSPACE_GLOBS (issue 48's benchmark: `status`
asks for the driver's files on every run); what it finds is what Path.glob finds for those patterns, links,
dot names, several architectures and a directory reached through a link included."""

from __future__ import annotations

import os
from pathlib import Path

from p2pkit.host import Host
from p2pkit.host.backup import USERSPACE_GLOBS, userspace_paths


def by_pathlib(root: Path) -> list[str]:
    found = set()
    for pattern in USERSPACE_GLOBS:
        for p in root.glob(pattern):
            if p.is_file() or p.is_symlink():
                found.add("/" + str(p.relative_to(root)))
    return sorted(found)


def touch(root: Path, rel: str, text: str = "x") -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_the_driver_files_are_the_ones_path_glob_finds(tmp_path):
    root = tmp_path / "host"
    for rel in ("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.86.16", "usr/lib/x86_64-linux-gnu/libcuda.so.570.86.16",
                "lib/firmware/nvidia/570.86.16/.hidden", "usr/lib/x86_64-linux-gnu/libc.so.6",
                "usr/lib/aarch64-linux-gnu/libnvidia-ptxjitcompiler.so.570.86.16",
                "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.570.86.16",
                "usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so", "lib/firmware/nvidia/570.86.16/gsp_ga10x.bin",
                "lib/firmware/nvidia/560.35.03/gsp_tu10x.bin", "usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control",
                "usr/bin/nvidia-smi-not", "usr/share/nvidia/nvidia-application-profiles-570.86.16-rc",
                "etc/OpenCL/vendors/nvidia.icd", "usr/share/vulkan/icd.d/nvidia_icd.json"):
        touch(root, rel)
    lib = root / "usr/lib/x86_64-linux-gnu"
    os.symlink("libcuda.so.570.86.16", lib / "libcuda.so.1")  # the installer's links count, dangling ones too
    os.symlink("libnvidia-gone.so.1", lib / "libnvidia-gone.so")
    (lib / "libnvidia-dir.so.1").mkdir()  # a directory is no driver file
    os.symlink("../../../srv/fw", root / "lib/firmware/nvidia/999")  # a version directory reached through a link
    touch(root, "srv/fw/gsp.bin")
    (root / "usr/lib/riscv64-linux-gnu").write_text("not a directory")

    got = userspace_paths(Host.at(str(root)))
    assert got == by_pathlib(root)
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-gone.so" in got and "/lib/firmware/nvidia/999/gsp.bin" in got
    assert "/lib/firmware/nvidia/570.86.16/.hidden" in got  # Path.glob's * takes dot names too
    assert not any("libc.so" in x or "libnvidia-dir" in x or "nvidia-smi-not" in x for x in got)


def test_a_host_without_the_driver_has_none(tmp_path):
    (tmp_path / "usr").mkdir()
    assert userspace_paths(Host.at(str(tmp_path))) == [] == by_pathlib(tmp_path)
