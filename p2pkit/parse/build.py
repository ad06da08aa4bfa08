"""Build output: nvcc's version, CMake's log (P07's success criteria, the first CMake Error), ldd."""

from __future__ import annotations

import re

from p2pkit.core.breaks import lines


def nvcc_release(text: str) -> str | None:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0'."""
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def nvcc_arch_list(text: str) -> list[str]:
    """`nvcc --list-gpu-arch` (or --list-gpu-code): the architectures the toolkit builds, as their
    numbers, ascending (compute_75, compute_80, ... -> ['75', '80', ...]). nvcc prints one per line
    (compute_XX for the virtual ones, sm_XX for --list-gpu-code); with both options it prints the
    --generate-code form (arch=compute_XX,code=sm_XX): every compute_/sm_ name counts, an a/f suffix
    is the same number (tests/fixtures/nvcc: nvcc 13.0.88)."""
    found = {m.group(1) for m in re.finditer(r"\b(?:compute|sm)_(\d+)[af]?\b", text)}
    return sorted(found, key=int)


CUDA_ARCH_KEYWORDS = ("native", "all", "all-major")  # CMake's own values: nothing to look up in the list


def cuda_arch_numbers(value: str) -> list[str] | None:
    """CMAKE_CUDA_ARCHITECTURES ("120a", "90", "90;120a", "86-real", "12.0a") -> the numbers nvcc's list
    holds (['120'], ['90'], ['90', '120']); None for CMake's keywords (native, all, all-major), which
    name no number. A value that is no architecture is kept as it is (it is in no list)."""
    parts = [x.strip() for x in re.split(r"[;,]", value) if x.strip()]
    if not parts or any(x in CUDA_ARCH_KEYWORDS for x in parts):
        return None
    out = []
    for x in parts:
        m = re.fullmatch(r"(\d+)(?:\.(\d))?[af]?(?:-real|-virtual)?", x)
        out.append((m.group(1) + m.group(2) if m.group(2) else m.group(1)) if m else x)
    return out


def archs_unbuildable(value: str, archs: list[str] | None) -> list[str]:
    """The entries of CMAKE_CUDA_ARCHITECTURES (engine.cuda_architectures) this toolkit cannot build:
    their number is not in `nvcc --list-gpu-arch` (120a and 120f are 120). Nothing when the list is
    unknown or the value is a CMake keyword (native, all)."""
    nums = cuda_arch_numbers(value)
    if not archs or nums is None:
        return []
    parts = [x.strip() for x in value.replace(",", ";").split(";") if x.strip()]
    return [part for part, n in zip(parts, nums, strict=True) if n not in archs]


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def first_cmake_error(log: str) -> str | None:
    """The first 'CMake Error' block: its header line and message lines up to the next blank line."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("CMake Error"):
            # pkg_check_modules says which package and why on the '--' lines just before its error
            why = [ln.strip(" -") for ln in lines[max(0, i - 8):i]
                   if re.search(r"(?i)package\b.*'|requested '|checking for module", ln)]
            block = [*why, line.strip()]
            for nxt in lines[i + 1:i + 12]:
                if not nxt.strip():
                    if len(block) > 1 and not block[-1].endswith(":"):  # "links to:" <blank> "CUDA::cublas"
                        break
                    continue
                block.append(nxt.strip())
            return " ".join(block)
    return None


def cmake_cache(text: str) -> dict[str, str]:
    """CMakeCache.txt: `NAME:TYPE=VALUE` lines (comments `#` and `//` skipped) -> {NAME: VALUE}."""
    out = {}
    for line in lines(text):  # CMake reads its cache a line to a \n
        m = re.match(r"^([^#/][^:=]*):[A-Z]+=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _cuda_found(log: str, cache: dict) -> tuple[str, str] | None:
    """The CUDA toolkit version CMake found: its 'Found CUDAToolkit' line in this run's log, or on a
    re-configure (which prints no such line) the details find_package_handle_standard_args cached."""
    m = re.search(r"Found CUDAToolkit: .*\(found version \"(\d+\.\d+)", log)
    if m:
        return m.group(1), "build log"
    m = re.search(r"\[v(\d+\.\d+)[^\]]*\]$", cache.get("FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit", ""))
    return (m.group(1), "CMakeCache.txt") if m else None


def _module_found(module: str, log: str, cache: dict) -> str | None:
    """pkg_check_modules' 'Found libavformat, version V' in this run's log, or its cached result: a
    prefix whose <P>_FOUND is 1 and whose module (alone: <P>_MODULE_NAME, or one of several:
    <P>_<module>_VERSION) is this one."""
    m = re.search(rf"Found {module}(?:, version (\S+))?", log)
    if m:
        return f"{m.group(1) or 'found'} (build log)"
    for key, val in cache.items():
        if key.endswith("_FOUND") and val == "1":
            pre = key[:-len("_FOUND")]
            if cache.get(f"{pre}_MODULE_NAME") == module and cache.get(f"{pre}_VERSION"):
                return f"{cache[pre + '_VERSION']} (CMakeCache.txt)"
            if cache.get(f"{pre}_{module}_VERSION"):
                return f"{cache[pre + '_' + module + '_VERSION']} (CMakeCache.txt)"
    return None


def ninfer_criteria(log: str, cache: dict | None = None, up_to_date: bool = False) -> dict[str, str | None]:
    """P07: success is CUDAToolkit 13.1+ found, libavformat found, no CMake Error, ninfer-serve linked.
    Each criterion maps to its evidence, or None when it is not met. A rebuild of an unchanged tree
    prints neither Found line nor a link line (tests/fixtures/cmake): then the CMake cache says what
    was found, and Ninja's own dry run (up_to_date) that the binary is current with its sources."""
    cache = cache or {}
    cuda = _cuda_found(log, cache)
    linked = "linked in this build" if re.search(r"Linking CXX executable apps/ninfer-serve", log) else (
        "up to date (ninja -n: no work to do)" if up_to_date else None)
    return {
        "found CUDAToolkit 13.1 or newer": f"{cuda[0]} ({cuda[1]})" if cuda and version_tuple(cuda[0]) >= (13, 1)
        else None,
        "found libavformat": _module_found("libavformat", log, cache),
        "no CMake Error": None if "CMake Error" in log else "none in the log",
        "linked apps/ninfer-serve": linked,
    }


LLAMACPP_TARGETS = ("llama-server", "llama-bench")


def _cuda_toolkit(log: str, cache: dict) -> str | None:
    """llama.cpp's CUDA toolkit as CMake found it: FindCUDAToolkit's line in this run's log ("-- Found
    CUDAToolkit: /usr/local/cuda-13.0/include (found version "13.0.88")"), or on a re-configure (which
    prints only llama.cpp's own "-- CUDA Toolkit found") the cache: the details FindCUDAToolkit cached,
    or CUDAToolkit_VERSION / CMAKE_CUDA_COMPILER_VERSION where a build caches them."""
    m = re.search(r"Found CUDAToolkit: (\S+) \(found version \"([\d.]+)\"", log)
    if m:
        return f"{m.group(2)} at {m.group(1)} (build log)"
    m = re.search(r"\[v([\d.]+)[^\]]*\]$", cache.get("FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit", ""))
    if m:
        return f"{m.group(1)} (CMakeCache.txt)"
    for key in ("CUDAToolkit_VERSION", "CMAKE_CUDA_COMPILER_VERSION"):
        if re.match(r"\d+\.\d+", cache.get(key, "")):
            return f"{cache[key]} (CMakeCache.txt {key})"
    return None


def _on(v: str | None) -> bool:
    return (v or "").upper() in ("ON", "1", "TRUE", "YES", "Y")


def llamacpp_criteria(log: str, cache: dict | None = None, up_to_date: bool = False, cuda: bool = True,
                      targets: tuple[str, ...] = LLAMACPP_TARGETS) -> dict[str, str | None]:
    """P07 the llama.cpp way, from its own build log: the CUDA toolkit found (CUDA builds only, and
    GGML_CUDA on in the cache), no CMake Error, and the build ends by linking bin/llama-server and
    bin/llama-bench. On a re-configure the Found line is not printed again (the cache says what was
    found), and on a rebuild with nothing to do nothing links: Ninja's dry run of the targets
    (up_to_date: ninja_current) says they are current. Each criterion -> its evidence, or None."""
    cache = cache or {}
    out: dict[str, str | None] = {}
    if cuda:
        found = _cuda_toolkit(log, cache)
        off = "GGML_CUDA" in cache and not _on(cache["GGML_CUDA"])
        out["found CUDAToolkit"] = None if off else found
    out["no CMake Error"] = None if "CMake Error" in log else "none in the log"
    for t in targets:
        linked = re.search(rf"Linking CXX executable bin/{re.escape(t)}$", log, re.M)
        out[f"linked bin/{t}"] = "linked in this build" if linked else (
            "up to date (ninja -n -d explain: only the always-run custom steps)" if up_to_date else None)
    return out


CUSTOM_TARGET = re.compile(r"^ninja explain: output (\S*CMakeFiles/[^/.\s]+) doesn't exist$")


def ninja_current(text: str) -> bool:
    """Ninja's dry run with its reasons (`-n -d explain`, stdout and stderr) says the targets are current:
    "no work to do.", or the only root reason is a custom target's stamp that never exists (CMake's
    add_custom_target is always out of date: llama.cpp's "Provisioning UI assets"). A dry run cannot
    run that step, so it lists everything downstream of it too (ui.cpp, llama-server relinked: "... is
    dirty"), where the real no-op rebuild runs the step alone and restats (tests/fixtures/llamacpp/build).
    Any other reason (an output missing or older than an input, deps missing, a command line changed)
    is work; a dry run without reasons cannot be told apart from real work and is not current."""
    if ninja_no_work(text):
        return True
    reasons = [x for x in text.splitlines() if x.startswith("ninja explain: ") and not x.endswith(" is dirty")]
    return bool(reasons) and all(CUSTOM_TARGET.match(x) for x in reasons)


def ninja_no_work(text: str) -> bool:
    """Ninja's own verdict that a target is current: 'ninja: no work to do.' (with -n, nothing runs;
    a dry run with work to do prints the steps, link lines included, without running them)."""
    return "ninja: no work to do." in text


ARCH_LIST = re.compile(r'\b(?:set|cuda_archs_loose_intersection)\(\s*([A-Z0-9_]+)\s+"([^"]*)"')


def cmake_arch_lists(text: str) -> dict[str, list[list[str]]]:
    """vLLM's CMakeLists.txt: every list a variable is given, `set(CUDA_SUPPORTED_ARCHS "7.5;...;12.0")`
    or `cuda_archs_loose_intersection(SCALED_MM_ARCHS "12.0a;12.1a" "${CUDA_ARCHS}")` (one per CUDA
    version branch) -> {variable: [[arch, ...], ...]}."""
    out: dict[str, list[list[str]]] = {}
    for m in ARCH_LIST.finditer(text):
        out.setdefault(m.group(1), []).append([a for a in m.group(2).split(";") if a])
    return out


def names_arch(archs: list[str], arch: str) -> bool:
    """'12.1' in ['12.0a', '12.1a'] (a, f and +PTX suffixes count)."""
    return any(re.match(rf"^{re.escape(arch)}(?:[af]|\+PTX)?$", a) for a in archs)


LDD_VERSION = re.compile(r"^(?P<by>\S+): (?P<lib>\S+): version `(?P<version>[^']+)' not found \(required by (\S+)\)")


def ldd(text: str) -> list[dict]:
    """`ldd BINARY`: name, resolved path (None when 'not found'), and the symbol versions the library
    lacks ("version `GLIBC_2.38' not found": the library is found, yet the binary cannot load)."""
    out: list[dict] = []
    missing: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if v := LDD_VERSION.match(line):
            missing.setdefault(v["lib"], []).append(v["version"])
            continue
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            out.append({"name": m.group(1), "path": None if m.group(2) == "not found" else m.group(3)})
    for lib, versions in missing.items():
        entry = next((e for e in out if e["path"] == lib), None)
        if entry is None:
            entry = {"name": lib.rsplit("/", 1)[-1], "path": lib}
            out.append(entry)
        entry["missing_versions"] = versions
    return out


def ldd_problems(libs: list[dict]) -> list[str]:
    """Each library that will not load, named with why: not found, or the versions it lacks."""
    return [f"{x['name']} not found" if x["path"] is None else
            f"{x['name']} ({x['path']}) lacks version {', '.join(x['missing_versions'])}"
            for x in libs if x["path"] is None or x.get("missing_versions")]


# A failed `make modules` of the fork, through kbuild: make's own exit lines ("make[2]: *** [...:
# kernel-open] Error 2", one per make level) come last and name only what failed; what went wrong is
# said earlier, among thousands of progress lines (tests/fixtures/fork-570.86.16-p2p).
KBUILD_ERROR = re.compile(r"\berror:|\bERROR:|: not found$|command not found|No rule to make target|\*\*\*")
MAKE_EXIT = re.compile(r"^make(?:\[\d+\])?: \*\*\* (?:\[.*\] Error \d+$|Waiting for unfinished jobs|Deleting file)")


def kbuild_errors(text: str, limit: int = 6) -> list[str]:
    """The lines of a failed kbuild run that say what went wrong, first ones first, each once: the
    compiler's and modpost's errors, a tool the shell did not find, make's own refusals; not make's
    exit lines (`*** [...] Error N`), which only name the target that failed."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if KBUILD_ERROR.search(line) and not MAKE_EXIT.match(line) and line not in out:
            out.append(line[:300])
            if len(out) == limit:
                break
    return out
