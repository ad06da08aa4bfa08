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
                  driver_version: str, engine: tuple[Path, str] | None = None, vllm_patched: bool = True,
                  vllm_sass: tuple[str, ...] = ("sm_120a", "sm_121a")) -> Path:
    text = (config.builtin_path(base)).read_text()
    data = tomllib.loads(text)
    data["driver"].update(version=driver_version, installer_url=f"file://{installer}", installer_sha256=sha)
    if driver_version != "615.71.09":
        data["driver"]["allow_other_version"] = False
    patched = data["p2p_module"].get("patched", True)
    data["p2p_module"].update(repo=f"file://{fork}", branch=driver_version + ("-p2p" if patched else ""),
                              commit=commit)
    data["profile"]["description"] = "SIMULATED host: " + data["profile"]["description"]
    if data["engine"]["recipe"] == "vllm" and not data["engine"].get("package"):
        # the PR branch's repository at its commit (the engine role clones it into build_dir), the patch in it or
        # not (the scenario's choice); the wheel cache is filled by lifecycle.init
        repo, commit = make_vllm_tree(root, data["engine"]["build_dir"], data["engine"].get("branch", ""),
                                      patched=vllm_patched, sass=vllm_sass)
        data["engine"].update(repo=f"file://{repo}", commit=commit, python="/opt/vllm/bin/python", requirements=[])
        flags = data["serve"].setdefault("flags", {})
        flags.update({"master-addr": "127.0.0.1", "master-port": free_port()})
        data["serve"]["health_timeout_s"] = 120.0
    elif engine is not None and data["engine"]["recipe"] != "vllm":  # vLLM from its wheel: the profile's own
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


SIM_PYPROJECT = """# SIMULATED vLLM tree: built by its own backend (sim_backend.py), as setup.py builds the real one
[build-system]
requires = []
build-backend = "sim_backend"
backend-path = ["."]

[project]
name = "vllm"
dynamic = ["version"]
"""


def make_vllm_tree(root: Path, tree: str, branch: str, patched: bool = True,
                   sass: tuple[str, ...] = ("sm_120a", "sm_121a")) -> tuple[Path, str]:
    """The SIMULATED source tree of vLLM's PR branch: a real git repository (with or without the sm_121 patch's two
    files) the engine role clones into `tree` at the commit, and pip builds into the engine's environment: the
    `vllm` package whose api_server is sim.engine's vLLM, and its compiled kernels (the stand-in cuobjdump lists
    `sass`, P39). Returns the repository and its commit."""
    work = root / ".p2pkit-sim/git/vllm-work"
    cuh = work / "csrc/libtorch_stable/quantization/fp4/nvfp4_utils.cuh"
    cuh.parent.mkdir(parents=True, exist_ok=True)
    cml = VLLM_CMAKELISTS if patched else VLLM_CMAKELISTS.replace(";12.1a", "").replace(";12.1", "")
    (work / "CMakeLists.txt").write_text(cml)
    cuh.write_text(NVFP4_UTILS if patched else "// SIMULATED: no sm_121 patch\n")
    (work / "pyproject.toml").write_text(SIM_PYPROJECT)
    (work / "sim_backend.py").write_text((Path(__file__).parent / "vllm_backend.py").read_text())
    api = work / "vllm/entrypoints/openai"
    api.mkdir(parents=True, exist_ok=True)
    (work / "vllm/__init__.py").write_text("# SIMULATED vLLM\n__version__ = '@VERSION@'\n")
    (work / "vllm/config.py").write_text("# SIMULATED vLLM: its config module imports\n")
    (work / "vllm/entrypoints/__init__.py").write_text("")
    (api / "__init__.py").write_text("")
    import sysconfig

    # the simulated server is p2pkit's sim.engine: its tree and the packages it imports (those of the Python that
    # laid the host out) after the environment's own
    paths = [P2PKIT_TREE, sysconfig.get_paths()["purelib"]]
    (api / "api_server.py").write_text(f"# SIMULATED\nimport sys\nsys.path.extend({paths!r})\n"
                                       "from p2pkit.sim.engine import vllm_main\n\n"
                                       "if __name__ == '__main__':\n    vllm_main()\n")
    cli = work / "vllm/entrypoints/cli"
    cli.mkdir(parents=True, exist_ok=True)
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text("# SIMULATED `vllm` CLI: its serve subcommand\n"
                                 f"import sys\nsys.path.extend({paths!r})\n"
                                 "from p2pkit.sim.engine import vllm_main\n\n"
                                 "if __name__ == '__main__':\n"
                                 "    if sys.argv[1:2] != ['serve']:\n"
                                 "        raise SystemExit('SIMULATED vllm: only `serve` is simulated')\n"
                                 "    del sys.argv[1]\n    vllm_main()\n")
    (work / "vllm/_C.abi3.so").write_text("SIMULATED vLLM kernels\n" + "".join(f"sass={a}\n" for a in sass))
    (work / ".gitignore").write_text("build/\n__pycache__/\n")
    _git(work, "init", "-q", "-b", branch or "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "SIMULATED vLLM PR #53896" + (" with the sm_121 patch" if patched else ""))
    return work, _git(work, "rev-parse", "HEAD")


VLLM_NCCL, VLLM_NCCL_VERSION = "nvidia/nccl/lib/libnccl.so.2", "2.29.3"


def _wheel(out: Path, dist: str, version: str, files: dict[str, bytes], tag: str = "py3-none-any") -> Path:
    """A SIMULATED wheel in pip's own layout (the files, dist-info METADATA, WHEEL and RECORD)."""
    import base64
    import zipfile

    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n"
    wheel = f"Wheel-Version: 1.0\nGenerator: p2pkit-sim\nRoot-Is-Purelib: true\nTag: {tag}\n"
    files = {**files, f"{info}/METADATA": meta.encode(), f"{info}/WHEEL": wheel.encode()}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in sorted(files.items()):
            z.writestr(name, data)
    return path


def make_vllm_wheels(root: Path, wheels: str, flashinfer: str = "0.6.18") -> None:
    """The engine's wheel cache as `p2pkit pin --engine-offline` leaves it after a fill where the network is
    (SIMULATED: this host reaches no package index): the source tree's dependencies as wheels, flashinfer-python
    at the given version (P25) and NCCL's wheel (its library with its version inside: what the running vLLM maps,
    P37), and the lock naming each with its sha256 (pip's hash-checking format)."""
    out = root / wheels.lstrip("/")
    out.mkdir(parents=True, exist_ok=True)
    nccl = f"\x7fELF SIMULATED libnccl NCCL version {VLLM_NCCL_VERSION}+cuda13.0\n".encode()
    made = [("flashinfer-python", flashinfer, _wheel(out, "flashinfer_python", flashinfer, {
                "flashinfer/__init__.py": f"# SIMULATED\n__version__ = {flashinfer!r}\n".encode()})),
            ("nvidia-nccl-cu13", VLLM_NCCL_VERSION,
             _wheel(out, "nvidia_nccl_cu13", VLLM_NCCL_VERSION, {VLLM_NCCL: nccl}))]
    lines = ["# SIMULATED: the lock `p2pkit pin --engine-offline` writes (this host reaches no package index)"]
    lines += [f"{name}=={ver} --hash=sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
              for name, ver, path in made]
    (out / "p2pkit-engine.lock").write_text("\n".join(lines) + "\n")


def engine_site(python: str) -> str:
    """Where a package of the engine's environment lands (engine.python's prefix, this machine's Python)."""
    return f"{Path(python).parent.parent}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
