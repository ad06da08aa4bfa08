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
from p2pkit.host.backup import sha256 as sha256_file

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
