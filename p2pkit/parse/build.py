"""Build output: nvcc's version, CMake's log (P07's success criteria, the first CMake Error), ldd."""

from __future__ import annotations

import re


def nvcc_release(text: str) -> str | None:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0'."""
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


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
                    if len(block) > 1:
                        break
                    continue
                block.append(nxt.strip())
            return " ".join(block)
    return None


def ninfer_criteria(log: str) -> dict[str, bool]:
    """P07: success is CUDAToolkit 13.1+ found, libavformat found, no CMake Error, linking ninfer-serve."""
    cuda = re.search(r"Found CUDAToolkit: .*\(found version \"(\d+\.\d+)", log)
    return {
        "found CUDAToolkit 13.1 or newer": bool(cuda) and version_tuple(cuda.group(1)) >= (13, 1),
        "found libavformat": bool(re.search(r"Found libavformat", log)),
        "no CMake Error": "CMake Error" not in log,
        "linked apps/ninfer-serve": bool(re.search(r"Linking CXX executable apps/ninfer-serve", log)),
    }


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
