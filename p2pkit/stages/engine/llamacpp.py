"""llama.cpp's recipe for the engine stage: its source from an archive pinned by sha256 (verified
before a byte of it is unpacked), then CMake and Ninja over only the targets the profile names.

On the GPU box: CUDA on, CMAKE_CUDA_ARCHITECTURES from the profile (120a), NCCL from the profile's
NCCL root and RUNPATH pointing there (P16). Where there is no CUDA (CI, a laptop) the profile says
`engine.cuda = false` (or `--set engine.cuda=false`): the same recipe with GGML_CUDA=OFF, said in
the output and in the artifact; p2pkit never turns CUDA off by itself.

The tree is unpacked straight into engine.build_dir (the build goes to build_dir/build, like the
git recipes); a marker file beside it records which archive it came from, so an unchanged pin is
not unpacked again and a directory p2pkit did not unpack is never touched."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.config import Profile
from p2pkit.core.errors import Exit, P2pkitError, UsageError
from p2pkit.host.backup import sha256 as sha256_file
from p2pkit.parse import build as pb
from p2pkit.rules.findings import Check, judge
from p2pkit.stages.engine import cmake

NAME = "llamacpp"
PKG_MODULES: tuple[str, ...] = ()
MARKER = ".p2pkit-source.json"
# after -G Ninja, which the engine role gives (it builds with Ninja)
BASE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")


def archive_name(url: str) -> str:
    """The archive's file name: a URL's last part, or a source distribution's (PEP 625) for pypi:NAME==V."""
    m = re.fullmatch(r"pypi:([A-Za-z0-9._-]+)==(\S+)", url)
    if m:
        return f"{re.sub(r'[-_.]+', '_', m.group(1)).lower()}-{m.group(2)}.tar.gz"
    return url.rsplit("/", 1)[-1]


def archive_path(ctx) -> Path:
    """Where the archive is on this machine: a local path through the host root, or the download
    cache (driver.cache_dir) for an https:// URL or a pypi: source distribution."""
    e, host = ctx.profile.engine, ctx.host
    url = e.source_url
    if url.startswith("file://"):
        return host.path(url.removeprefix("file://"))
    if url.startswith("/"):
        return host.path(url)
    return host.path(ctx.profile.driver.cache_dir) / archive_name(url)


def _pip_download(ctx, spec: str, path: Path) -> str | None:
    """The source distribution of spec (NAME==VERSION) through pip, as the package index it is set up
    for serves it, into path; an error text on failure. The sha256 pin is checked after."""
    with tempfile.TemporaryDirectory(prefix="p2pkit-sdist-", dir=path.parent) as tmp:
        r = ctx.host.runner.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                 "--disable-pip-version-check", "-q", spec, "-d", tmp], check=False, timeout=1800)
        got = sorted(Path(tmp).glob("*.tar.gz"))
        if r.returncode != 0 or len(got) != 1:
            tail = " ".join((r.stderr or r.stdout).strip().splitlines()[-2:])
            return f"pip download of {spec} failed (exit {r.returncode}): {tail or 'no source archive'}"
        os.replace(got[0], path)
    return None


def fetch(ctx, log: Path) -> dict:
    """The archive, downloaded when it is a URL and not cached yet; its sha256 against the pin."""
    import urllib.error  # here: a read-only command (status) does not pay for urllib
    import urllib.request

    e = ctx.profile.engine
    path = archive_path(ctx)
    out: dict = {"archive": str(path), "url": e.source_url, "sha256_expected": e.source_sha256}
    if e.source_url.startswith("pypi:") and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        err = _pip_download(ctx, e.source_url.removeprefix("pypi:"), path)
        if err:
            out["error"] = err
            return out
    if e.source_url.startswith("https://") and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        try:
            with urllib.request.urlopen(e.source_url, timeout=60) as r, safefs.open_file(part, "wb") as fh:
                shutil.copyfileobj(r, fh, 8 << 20)
        except (urllib.error.URLError, OSError) as err:
            if not part.is_symlink():
                part.unlink(missing_ok=True)
            out["error"] = f"download of {e.source_url} failed: {getattr(err, 'reason', err)}"
            return out
        os.replace(part, path)
    if not path.is_file():
        out["error"] = f"{e.source_url} does not exist"
        return out
    got = sha256_file(path)
    out["sha256"] = got
    with safefs.open_file(log, "a") as fh:
        fh.write(f"# source archive {path}: sha256 {got} (pinned {e.source_sha256})\n")
    if got != e.source_sha256:
        out["error"] = (f"the source archive's sha256 is {got}, the profile pins {e.source_sha256 or '(nothing)'}: "
                        "refused before unpacking")
    return out


def unpack(ctx, src: Path, fetched: dict) -> dict:
    """engine.source_subdir of the verified archive into src, unless src already holds this very
    archive (the marker says so). A src that p2pkit did not unpack is refused, never overwritten."""
    e = ctx.profile.engine
    out: dict = {"path": str(src), "sha256": fetched["sha256"], "subdir": e.source_subdir}
    marker = src / MARKER
    if marker.is_file():
        try:
            had = json.loads(marker.read_text())
        except ValueError:
            had = {}
        if had.get("sha256") == fetched["sha256"] and had.get("subdir") == e.source_subdir:
            return {**out, "unpacked": False}
        out["error"] = (f"{src} holds another source ({had.get('sha256', '?')[:12]}, "
                        f"{had.get('subdir', '?')}): move it away or choose another engine.build_dir")
        return out
    if src.exists() and any(src.iterdir()):
        out["error"] = f"{src} exists and was not unpacked by p2pkit: p2pkit will not touch it"
        return out
    staging = src.with_name(f".{src.name}.unpacking")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    prefix = e.source_subdir.strip("/") + "/" if e.source_subdir else ""
    with tarfile.open(fetched["archive"]) as tar:
        members = []
        for m in tar.getmembers():
            if prefix and not m.name.startswith(prefix):
                continue
            m.name = m.name[len(prefix):]
            if m.name:
                members.append(m)
        if not members:
            shutil.rmtree(staging)
            out["error"] = f"the archive has nothing under {e.source_subdir!r}: check engine.source_subdir"
            return out
        tar.extractall(staging, members=members, filter="data")
    if src.exists():
        src.rmdir()
    src.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, src)
    atomic_write(marker, (json.dumps({"sha256": fetched["sha256"], "subdir": e.source_subdir,
                                      "url": e.source_url}, indent=2) + "\n").encode())
    return {**out, "unpacked": True, "files": len(members)}


def source(ctx, src: Path, log: Path) -> dict:
    """Fetch, verify, unpack: the source record the engine check judges."""
    fetched = fetch(ctx, log)
    if "error" in fetched:
        return {"path": str(src), "archive": fetched, "error": fetched["error"]}
    return {**unpack(ctx, src, fetched), "archive": fetched}


OFFLINE_DROP = ("models", "docs", "benches", "media")  # not built: sample models, docs, benchmark scripts, images
OFFLINE_TOP = "llama.cpp"


def pack(archive: Path, subdir: str, out: Path, drop: tuple[str, ...] = OFFLINE_DROP) -> dict:
    """An archive for a machine without network (a lab's GPU box): engine.source_subdir of the
    verified archive under one top directory (llama.cpp/), without the directories the build never
    reads (`drop`), as .tar.xz. Deterministic: members in name order, owners 0, the source's own
    times and modes, GNU format, xz preset 9, so packing the same pinned archive again gives the same
    bytes and the same sha256. Written to a temporary name and renamed: never half an archive."""
    import lzma

    prefix = subdir.strip("/") + "/" if subdir else ""
    kept, size = 0, 0
    part = out.with_name(out.name + ".partial")
    with tarfile.open(archive) as src:
        members = []
        for m in src.getmembers():
            if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
                continue
            rel = m.name[len(prefix):]
            if not rel or rel.split("/", 1)[0] in drop or not (m.isfile() or m.isdir() or m.issym()):
                continue
            members.append((rel, m))
        if not members:
            raise ValueError(f"the archive has nothing under {subdir!r}")
        members.sort(key=lambda x: x[0])
        try:
            with lzma.open(part, "wb", preset=9) as xz, \
                    tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as dst:
                for rel, m in members:
                    info = tarfile.TarInfo(f"{OFFLINE_TOP}/{rel}")
                    info.type, info.mode, info.mtime, info.linkname = m.type, m.mode & 0o755, int(m.mtime), m.linkname
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if m.isfile():
                        info.size = m.size
                        dst.addfile(info, src.extractfile(m))
                        kept, size = kept + 1, size + m.size
                    else:
                        dst.addfile(info)
            os.replace(part, out)
        finally:
            part.unlink(missing_ok=True)
    return {"path": str(out), "sha256": sha256_file(out), "bytes": out.stat().st_size, "files": kept,
            "unpacked_bytes": size, "subdir": OFFLINE_TOP, "dropped": list(drop)}


def nccl_layout(nccl: Path) -> dict:
    """What CMake's FindNCCL needs under NCCL_ROOT: include/nccl.h and lib/libnccl.so (a pip
    nvidia-nccl wheel ships only libnccl.so.2: the unversioned link is missing there)."""
    lib = next((nccl / d / "libnccl.so" for d in ("lib", "lib64") if (nccl / d / "libnccl.so").exists()), None)
    return {"root": str(nccl), "header": (nccl / "include/nccl.h").is_file(), "library": str(lib) if lib else None,
            "versioned": sorted(str(p) for p in nccl.glob("lib*/libnccl.so.*"))}


def cmake_options(ctx) -> list[str]:
    e, host = ctx.profile.engine, ctx.host
    if not e.cuda:
        return [*BASE_OPTIONS, "-DGGML_CUDA=OFF"]
    nccl = host.path(e.nccl_root)
    return [*BASE_OPTIONS, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={e.cuda_architectures}",
            "-DGGML_CUDA_NCCL=ON", f"-DNCCL_ROOT={nccl}", f"-DCMAKE_BUILD_RPATH={nccl}/lib",
            f"-DCMAKE_INSTALL_RPATH={nccl}/lib"]


def unpacked(src: Path) -> dict:
    """Read-only: which archive the tree in src came from (its marker), for verify and doctor."""
    marker = src / MARKER
    try:
        had = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {"path": str(src), "error": f"{src} holds no source p2pkit unpacked ({MARKER} missing)"}
    return {"path": str(src), "sha256": had.get("sha256"), "subdir": had.get("subdir"), "unpacked": False}


def checks_out(p: Profile) -> bool:
    """A git checkout at the pinned commit, unless engine.source_url names an archive pinned by sha256."""
    return not p.engine.source_url


def precheck(p: Profile) -> list[Check]:
    if p.engine.source_url:
        out = [judge("engine.source_pin", "engine source archive pinned by sha256", bool(p.engine.source_sha256),
                     p.engine.source_sha256 or "(no sha256)", "a sha256", "set engine.source_sha256 to the "
                     "digest of the archive you reviewed; p2pkit never unpacks an unpinned archive")]
    else:
        out = [judge("engine.commit", "engine source pinned", len(p.engine.commit) >= 7 and bool(p.engine.repo),
                     p.engine.commit or "(empty)", "a repository and a commit",
                     "set engine.repo and engine.commit to the source you reviewed; p2pkit never builds an unpinned "
                     "engine", pitfall="P09")]
    return out + _nccl_root(p)


def _nccl_root(p: Profile) -> list[Check]:
    if not p.engine.cuda:  # a CPU build links no NCCL (the cuda check says it is off)
        return []
    return [judge("engine.nccl_root", "a pinned NCCL for llama.cpp", bool(p.engine.nccl_root),
                  p.engine.nccl_root or "(empty)", "a directory", "set engine.nccl_root: the system libnccl "
                  "2.18.3 hangs at init on SM120", pitfall="P16")]


def targets(p: Profile) -> list[str]:
    return list(p.engine.targets)


def toolchain_more(ctx) -> dict:
    e = ctx.profile.engine
    return {"nccl": nccl_layout(ctx.host.path(e.nccl_root))} if e.nccl_root else {}


def criteria(ctx, out: Path, log: str, cached: dict | None) -> tuple[bool, dict]:
    """A no-op rebuild still runs llama.cpp's UI-assets step, so Ninja never says "no work to do": its
    explained dry run is read instead."""
    p = ctx.profile
    wanted = tuple(p.engine.targets) or pb.LLAMACPP_TARGETS
    current = cmake.up_to_date(ctx, out, list(wanted), pb.ninja_current, ("-d", "explain"))
    return current, pb.llamacpp_criteria(log, cached, current, p.engine.cuda, wanted)


def installed_more(ctx, build: Path, libraries: list) -> dict:
    """With CUDA, what libggml-cuda.so links too: NCCL is linked there, not into llama-server (P16)."""
    if not ctx.profile.engine.cuda:
        return {}
    out = {"nccl_links": {"llama-server": libraries}}
    ggml = next(iter(sorted(build.rglob("libggml-cuda.so*"))), None)
    if ggml:
        out["nccl_links"]["libggml-cuda.so"] = pb.ldd(ctx.host.runner.run(["ldd", str(ggml)], check=False).stdout)
    return out


def result_more(b: dict, p: Profile) -> list[Check]:
    """P16: every library that links NCCL links the profile's."""
    out = []
    for target, lst in b.get("nccl_links", {}).items():
        nccl = [x["path"] for x in lst if x["name"].startswith("libnccl")]
        ok = bool(nccl) and all(n and cmake.under(n, p.engine.nccl_root) for n in nccl)
        out.append(judge(f"engine.nccl.{target}", f"{target} links the profile's NCCL", ok,
                         ", ".join(n or "not found" for n in nccl) or "no libnccl", f"under {p.engine.nccl_root}",
                         "the system libnccl (2.18.3) hangs at init on SM120: rebuild with NCCL_ROOT and RUNPATH "
                         "set to the profile's NCCL", pitfall="P16"))
    return out


def offline(ctx, dest: Path) -> dict:
    """`p2pkit pin --engine-offline FILE`: the pinned archive (downloaded into the cache once, its sha256 checked
    against the pin before a byte is read), packed for a machine without network at `dest`."""
    e = ctx.profile.engine
    if not e.source_url:
        raise UsageError(f"--engine-offline packs llama.cpp's source archive, and {ctx.profile.name} builds from a "
                         "git checkout (engine.source_url is empty)",
                         hint="use a profile whose engine.source_url names an archive (dual-5090-llamacpp)")
    if not e.source_sha256:
        raise UsageError("engine.source_sha256 is empty: p2pkit packs only a pinned archive",
                         hint="pin the archive you reviewed first (engine.source_sha256)")
    cache = Path(ctx.profile.driver.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    got = fetch(ctx, cache / "fetch.log")
    if "error" in got:
        raise P2pkitError(got["error"], code=Exit.CHECK_FAILED,
                          hint=f"check the network (or put the pinned archive in {cache}); nothing was written")
    try:
        packed = pack(Path(got["archive"]), e.source_subdir, dest)
    except (ValueError, OSError) as err:
        raise P2pkitError(f"packing {got['archive']} failed: {err}", code=Exit.CHECK_FAILED,
                          hint="check engine.source_subdir and the free space beside " + str(dest)) from err
    return {**packed, "from": e.source_url, "from_sha256": got["sha256"]}


# the build, its record, its checks and their re-proof: the CMake recipes' (stages/engine/cmake.py), which asks this
# module for what is the recipe's own (its options, targets, pkg-config modules, criteria)
build, measure, check, reproved = cmake.build, cmake.measure, cmake.check, cmake.reproved
