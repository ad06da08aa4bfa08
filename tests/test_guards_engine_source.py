"""Condition guards for engine.source (p2pkit.stages.engine.checks._source): judged through the engine
stage's check over the engine artifact recorded on the lent H200 (tests/fixtures/h200-device/
engine-build: llama.cpp 0c1e570 from a pinned archive), its profile and overrides as recorded."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from p2pkit.core import config
from p2pkit.stages import registry
from tests.conftest import FIXTURES, REPO

ART = json.loads((FIXTURES / "h200-device/engine-build/engine.artifact.json").read_text())
PROFILE = config.load(str(REPO / f"bench/{ART['profile']}.toml"), ART["overrides"])


def source(src: dict | None = None, p=PROFILE):
    (st,) = [s for s in registry() if s.name == "engine"]
    f = copy.deepcopy(ART["facts"])
    if src is not None:
        f["engine_build"]["source"] = src
    return {c.id: c for c in st.check(f, p)}["engine.source"]


def test_archive_source_verified_by_its_sha256():
    src = ART["facts"]["engine_build"]["source"]
    c = source()
    assert c.status == "pass" and c.measured == f"sha256 {src['sha256'][:16]}... in {src['path']}"
    assert source({**src, "sha256": "0" * 64}).status == "fail"
    c = source({**src, "error": "tar: Unexpected EOF in archive"})
    assert c.status == "fail" and c.measured == "tar: Unexpected EOF in archive"
    c = source({**src, "archive": {**src["archive"], "error": "sha256 mismatch"}})
    assert c.status == "fail" and c.measured == "sha256 mismatch"


def test_git_source_at_the_pinned_commit():
    """Without an archive the checkout's HEAD must start with engine.commit; no commit pinned, no
    HEAD read, or another HEAD fails, saying what was read."""
    git = replace(PROFILE, engine=replace(PROFILE.engine, source_url="", commit="0c1e570"))
    head = "0c1e5703a1b2c3d4e5f60718293a4b5c6d7e8f90"
    c = source({"path": "/src/llama.cpp", "head": head}, git)
    assert c.status == "pass" and c.measured == head
    assert source({"path": "/src/llama.cpp", "head": "ffff" + head[4:]}, git).status == "fail"
    c = source({"path": "/src/llama.cpp", "error": "not a git repository"}, git)
    assert c.status == "fail" and c.measured == "not a git repository"
    assert source({"path": "/src/llama.cpp"}, git).measured == "no checkout"
    unpinned = replace(git, engine=replace(git.engine, commit=""))
    assert source({"path": "/src/llama.cpp", "head": head}, unpinned).status == "fail"
    vllm_like = replace(git, engine=replace(git.engine, source_url="https://x/llama.cpp.tar.gz"))
    assert source({"path": "/src/llama.cpp", "head": head}, replace(vllm_like, engine=replace(
        vllm_like.engine, recipe="ninfer"))).measured == head  # an archive is llama.cpp's way only
