"""What a simulated host needs besides its files: the NVIDIA installer to download, the fork to
clone (a real git repository), kernel headers, and a profile that pins both."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from p2pkit.core import config, tomlwrite

# makeself's header (makeself-header.sh) as NVIDIA's .run carries it: the checksums, label, target
# directory and payload sizes as assignments, and the number of header lines the stub skips to reach
# its payload; here the lines are also Python (the stub that runs is the simulator's).
INSTALLER = '''#!{python}
# This script was generated using Makeself 2.1.5 (SIMULATED {name}: installs the userspace driver
# into the simulated host; `--check` verifies the payload's MD5, as makeself's stub does)
CRCsum="0000000000"
MD5="{md5}"
label="NVIDIA Accelerated Graphics Driver for Linux-{machine} {version}"
script="./nvidia-installer"
targetdir="NVIDIA-Linux-{machine}-{version}"
filesizes="{size}"
# offset=`head -n {skip} "$0" | wc -c | tr -d " "`
import sys
from p2pkit.sim.standins import installer
sys.exit(installer({version!r}, {gsp!r}, sys.argv[1:], __file__, MD5))
'''
PAYLOAD_MARKER = "# --- payload ---\n"
PAYLOAD = "# SIMULATED payload: libnvidia-ml.so.{version}, gsp_ga10x.bin, gsp_tu10x.bin\n"

# the p2pkit that lays the host out: the simulated engines find its simulator there, installed or not
P2PKIT_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAKEFILE = """# SIMULATED open-gpu-kernel-modules build ({branch})
SYSSRC ?= /lib/modules/$(shell uname -r)/build
PYTHON := {python}
modules modules_install clean kernel-open.clean:
\t$(PYTHON) -m p2pkit.sim.kbuild $@ SYSSRC=$(SYSSRC) SYSOUT=$(SYSOUT) \\
\t  INSTALL_MOD_PATH=$(INSTALL_MOD_PATH) INSTALL_MOD_DIR=$(INSTALL_MOD_DIR)
.PHONY: modules modules_install clean kernel-open.clean
"""


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "p2pkit sim", "GIT_AUTHOR_EMAIL": "sim@p2pkit.invalid",
           "GIT_COMMITTER_NAME": "p2pkit sim", "GIT_COMMITTER_EMAIL": "sim@p2pkit.invalid",
           "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z",
           "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_installer(root: Path, version: str, gsp: bool, machine: str = "x86_64") -> tuple[Path, str]:
    """NVIDIA's installer for the simulated host's architecture, named as NVIDIA names it."""
    from p2pkit.sim.rules import nvidia_installer

    d = root / ".p2pkit-sim/downloads"
    d.mkdir(parents=True, exist_ok=True)
    p = d / nvidia_installer(machine, version)
    payload = PAYLOAD.format(version=version)
    fields = {"python": sys.executable, "version": version, "gsp": gsp, "name": p.name, "machine": machine,
              "md5": hashlib.md5(payload.encode()).hexdigest(), "size": len(payload.encode())}
    skip = INSTALLER.format(**fields, skip=0).count("\n") + 1  # the header's lines, the marker's with them
    p.write_text(INSTALLER.format(**fields, skip=skip) + PAYLOAD_MARKER + payload)
    p.chmod(0o755)
    return p, hashlib.sha256(p.read_bytes()).hexdigest()


def make_fork(root: Path, version: str, max_kernel: tuple[int, int] = (6, 17),
              patched: bool = True) -> tuple[Path, str]:
    """A real git repository with the branch <version>-p2p (NVIDIA's own tree: <version>) and a
    Makefile driving sim.kbuild."""
    work = root / ".p2pkit-sim/git/work"
    bare = root / ".p2pkit-sim/git/open-gpu-kernel-modules.git"
    work.mkdir(parents=True, exist_ok=True)
    branch = f"{version}-p2p" if patched else version
    (work / "Makefile").write_text(MAKEFILE.format(branch=branch, python=sys.executable))
    (work / "VERSION").write_text(f"VERSION={version}\nPATCHED={int(patched)}\nMAX_KERNEL_MAJOR={max_kernel[0]}\n"
                                  f"MAX_KERNEL_MINOR={max_kernel[1]}\n")
    (work / "kernel-open").mkdir(exist_ok=True)
    (work / "kernel-open/nv-pci.c").write_text("/* SIMULATED: BAR1 P2P mailbox (aikitoria patch) */\n")
    (work / ".gitignore").write_text("*.ko\n.p2pkit-built-*\n.sim-make.log\n")
    _git(work, "init", "-q", "-b", branch)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"SIMULATED {branch}" + (": P2P over BAR1" if patched else ""))
    commit = _git(work, "rev-parse", "HEAD")
    _git(root / ".p2pkit-sim/git", "clone", "-q", "--bare", str(work), str(bare))
    return bare, commit


def make_headers(root: Path, kernel: str, split: bool = False) -> None:
    """linux-headers-<kernel>: Ubuntu's, one tree at /lib/modules/K/build; `split`: Debian's, the
    headers in /lib/modules/K/source (linux-headers-K-common) and build/ only the flavour's output
    tree, its Makefile including the common one (as linux-headers-6.1.0-57-amd64 lays them out)."""
    build = root / "lib/modules" / kernel / "build"
    build.mkdir(parents=True, exist_ok=True)
    headers = root / "lib/modules" / kernel / ("source" if split else "build")
    (headers / "include/linux").mkdir(parents=True, exist_ok=True)
    (headers / "include/linux/kernel.h").write_text(f"/* SIMULATED linux-headers-{kernel} */\n")
    if split:
        (headers / "Makefile").write_text(f"# SIMULATED linux-headers-{kernel}-common\n")
        (build / "Makefile").write_text(f"# SIMULATED linux-headers-{kernel}\ninclude {headers}/Makefile\n")
    else:
        (build / "Makefile").write_text(f"# SIMULATED linux-headers-{kernel}\n")
    from p2pkit.sim.render import standin_script  # the headers' scripts/sign-file (Secure Boot signing)

    (build / "scripts").mkdir(exist_ok=True)
    (build / "scripts/sign-file").write_text(standin_script("sign-file"))
    (build / "scripts/sign-file").chmod(0o755)


def write_profile(root: Path, base: str, installer: Path, sha: str, fork: Path, commit: str,
                  driver_version: str, engine: tuple[Path, str] | None = None, vllm_patched: bool = True) -> Path:
    text = (config.builtin_path(base)).read_text()
    data = tomllib.loads(text)
    data["driver"].update(version=driver_version, installer_url=f"file://{installer}", installer_sha256=sha)
    if driver_version != "615.71.09":
        data["driver"]["allow_other_version"] = False
    patched = data["p2p_module"].get("patched", True)
    data["p2p_module"].update(repo=f"file://{fork}", branch=driver_version + ("-p2p" if patched else ""),
                              commit=commit)
    data["profile"]["description"] = "SIMULATED host: " + data["profile"]["description"]
    if data["engine"]["recipe"] == "vllm":
        tree = make_vllm_tree(root, data["engine"]["build_dir"], data["engine"].get("branch", ""),
                              patched=vllm_patched)
        data["engine"].update(repo="", commit=tree, python="/opt/vllm/bin/python")
        flags = data["serve"].setdefault("flags", {})
        flags.update({"master-addr": "127.0.0.1", "master-port": free_port()})
        data["serve"]["health_timeout_s"] = 120.0
    elif engine is not None:
        data["engine"].update(repo=f"file://{engine[0]}", commit=engine[1], python=sys.executable)
    data["serve"]["port"] = free_port()  # the simulated engine really listens: never collide
    out = root / ".p2pkit-sim/profile.toml"
    out.write_text("# SIMULATED: the default profile, pinned to the simulated installer and fork\n"
                   + tomlwrite.dumps(data))
    return out


def make_ninfer(root: Path, dflash2_tp2: bool = True) -> tuple[Path, str]:
    """A real git repository holding the simulated NInfer tree (see sim/ninfer_tree.py)."""
    from p2pkit.sim import ninfer_tree as t

    work = root / ".p2pkit-sim/git/ninfer-work"
    (work / "apps").mkdir(parents=True, exist_ok=True)
    (work / "src").mkdir(exist_ok=True)
    (work / "tools").mkdir(exist_ok=True)
    (work / "CMakeLists.txt").write_text(t.CMAKELISTS.replace('"${SIM_PYTHON}"', f'"{sys.executable}"')
                                         .replace('"${SIM_P2PKIT}"', f'"{P2PKIT_TREE}"'))
    (work / "apps/main.cpp").write_text(t.MAIN_CPP)
    mapping = t.SHARD_MAPPING if dflash2_tp2 else t.SHARD_MAPPING_OLD
    (work / "src/shard_mapping.cpp").write_text(mapping)
    (work / "tools/__init__.py").write_text("")
    (work / "tools/container.py").write_text(t.CONTAINER_PY)
    (work / "tools/convert.py").write_text(t.CONVERT_PY)
    (work / ".gitignore").write_text("build/\n__pycache__/\n")
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "SIMULATED NInfer with TP2 DFlash2" if dflash2_tp2 else "SIMULATED old NInfer")
    commit = _git(work, "rev-parse", "HEAD")
    bare = root / ".p2pkit-sim/git/ninfer.git"
    _git(root / ".p2pkit-sim/git", "clone", "-q", "--bare", str(work), str(bare))
    return bare, commit


def make_ffmpeg(root: Path, modules=("libavformat", "libavcodec", "libavutil", "libswscale", "libcurl")) -> None:
    from p2pkit.sim import ninfer_tree as t

    prefix = root / "opt/ffmpeg"
    pc = prefix / "lib/pkgconfig"
    pc.mkdir(parents=True, exist_ok=True)
    versions = {"libavformat": "60.16.100", "libavcodec": "60.31.102", "libavutil": "58.29.100",
                "libswscale": "7.5.100", "libcurl": "8.5.0"}
    for m in modules:
        (pc / f"{m}.pc").write_text(t.PC.format(prefix=prefix, name=m, version=versions[m], lib=m[3:]))


def write_safetensors(path: Path, tensors: dict[str, int]) -> None:
    """A safetensors file laid out by its documented format: u64 LE header length, JSON header
    (dtype, shape, data_offsets), then the data. Tensors are F16 vectors of the given lengths."""
    import struct

    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def make_hf_model(root: Path, path: str, layers: int = 4, shards: int = 2) -> None:
    """A small HF-format model directory: config.json, index, safetensors shards."""
    d = root / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": layers,
                                               "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
                                               "hidden_size": 512, "max_position_embeddings": 32768,
                                               "simulated": True}))
    weight_map = {}
    per = max(1, layers // shards)
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{i}.mlp.up_proj.weight": 4096 for i in range(s * per, min(layers, (s + 1) * per))}
        if s == shards - 1:
            tensors["lm_head.weight"] = 8192
        write_safetensors(d / name, tensors)
        weight_map.update({t: name for t in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


VLLM_COMMIT = hashlib.sha1(b"SIMULATED vLLM release/qwen38next (PR #53896) with the sm_121 patch").hexdigest()
VLLM_WRAPPER = """#!/bin/sh
# SIMULATED vLLM environment: this machine's Python with the simulated packages first on the path.
PYTHONPATH={lib} exec {python} "$@"
"""


VLLM_CMAKELISTS = """# SIMULATED vLLM tree: the arch-list lines of vLLM's CMakeLists.txt (tests/fixtures/vllm, real
# format) as seed 004's sm_121 patch leaves them: 12.1 added to the four lists (P21).
set(CUDA_SUPPORTED_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.1;10.3;12.0;12.1")
cuda_archs_loose_intersection(SCALED_MM_ARCHS "12.0a;12.1a" "${CUDA_ARCHS}")
cuda_archs_loose_intersection(CUTLASS_MOE_DATA_ARCHS "9.0a;10.0a;10.1a;10.3a;12.0a;12.1a" "${CUDA_ARCHS}")
cuda_archs_loose_intersection(FP4_SM120_ARCHS "12.0a;12.1a" "${CUDA_ARCHS}")
"""
NVFP4_UTILS = """// SIMULATED: the sm_121 patch's software E2M1 conversion (GB10 has no cvt.rn.satfinite.e2m1x2.f32)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 1210
// software E2M1 conversion
#endif
"""


def make_vllm_tree(root: Path, tree: str, branch: str, patched: bool = True) -> str:
    """The SIMULATED source tree vLLM was built from: a real git checkout on the PR branch, with (or
    without) the sm_121 patch. Returns its commit."""
    work = root / tree.lstrip("/")
    cuh = work / "csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh"
    cuh.parent.mkdir(parents=True, exist_ok=True)
    cml = VLLM_CMAKELISTS if patched else VLLM_CMAKELISTS.replace(";12.1a", "").replace(";12.1", "")
    (work / "CMakeLists.txt").write_text(cml)
    cuh.write_text(NVFP4_UTILS if patched else "// SIMULATED: no sm_121 patch\n")
    _git(work, "init", "-q", "-b", branch or "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "SIMULATED vLLM PR #53896" + (" with the sm_121 patch" if patched else ""))
    return _git(work, "rev-parse", "HEAD")


VLLM_NCCL, VLLM_NCCL_VERSION = "nvidia/nccl/lib/libnccl.so.2", "2.29.3"


def make_vllm(root: Path, flashinfer: str = "0.6.18", commit: str = "",
              sass: tuple[str, ...] = ("sm_120a", "sm_121a")) -> None:
    """A SIMULATED Python environment at /opt/vllm: `vllm` (whose api_server is sim.engine's vLLM),
    and flashinfer-python at the given version, both with dist-info metadata like pip leaves."""
    env = root / "opt/vllm"
    lib = env / "lib"
    version = f"0.11.1.dev53896+g{(commit or VLLM_COMMIT)[:7]}"
    api = lib / "vllm/entrypoints/openai"
    api.mkdir(parents=True, exist_ok=True)
    (lib / "vllm/__init__.py").write_text(f"# SIMULATED vLLM\n__version__ = {version!r}\n")
    (lib / "vllm/entrypoints/__init__.py").write_text("")
    (api / "__init__.py").write_text("")
    (api / "api_server.py").write_text(f"# SIMULATED\nimport sys\nsys.path.append({P2PKIT_TREE!r})\n"
                                       "from p2pkit.sim.engine import vllm_main\n\n"
                                       "if __name__ == '__main__':\n    vllm_main()\n")
    # the compiled kernels: the stand-in cuobjdump lists these architectures (P39)
    (lib / "vllm/_C.abi3.so").write_text("SIMULATED vLLM kernels\n" + "".join(f"sass={a}\n" for a in sass))
    # the NCCL the wheel nvidia-nccl-cu13 puts in the venv: one file, libnccl.so.2, its version inside it
    # (what the running engine maps, lifecycle.init)
    nccl = lib / VLLM_NCCL
    nccl.parent.mkdir(parents=True, exist_ok=True)
    nccl.write_text(f"\x7fELF SIMULATED libnccl NCCL version {VLLM_NCCL_VERSION}+cuda13.0\n")
    (lib / "flashinfer").mkdir(exist_ok=True)
    (lib / "flashinfer/__init__.py").write_text(f"# SIMULATED\n__version__ = {flashinfer!r}\n")
    for name, ver in (("vllm", version), ("flashinfer_python", flashinfer)):
        meta = lib / f"{name}-{ver}.dist-info"
        meta.mkdir(exist_ok=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {ver}\n")
    (env / "bin").mkdir(parents=True, exist_ok=True)
    wrapper = env / "bin/python"
    wrapper.write_text(VLLM_WRAPPER.format(lib=lib, python=sys.executable))
    wrapper.chmod(0o755)
