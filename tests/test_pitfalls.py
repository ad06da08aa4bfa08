"""Pitfalls judged over the real formats (issue 18): each test fails when its detection is removed."""

from p2pkit.checks import engine as ec
from p2pkit.parse import build as pb
from tests.conftest import FIXTURES

CM = FIXTURES / "cmake"


def cm(name):
    return (CM / name).read_text()


def test_first_build_meets_p07_from_the_log_alone():
    crit = pb.ninfer_criteria(cm("first_configure.txt").replace("13.0.88", "13.1.80") + cm("first_build.txt"))
    assert all(crit.values()), crit
    assert crit["found libavformat"] == "60.16.100 (build log)" and crit["linked apps/ninfer-serve"] == \
        "linked in this build"


def test_real_reconfigure_and_noop_build_print_neither_found_nor_link_lines():
    log = cm("reconfigure.txt") + cm("noop_build.txt")
    crit = pb.ninfer_criteria(log)  # the log alone, as p2pkit judged it before: a rebuild "fails"
    assert crit["found CUDAToolkit 13.1 or newer"] is None and crit["found libavformat"] is None
    assert crit["linked apps/ninfer-serve"] is None and pb.ninja_no_work(cm("noop_build.txt"))


def test_rebuild_proven_from_cmake_cache_and_ninja():
    cache = pb.cmake_cache(cm("CMakeCache.txt"))
    assert cache["FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit"].endswith("[v13.0.88()]")
    log = cm("reconfigure.txt") + cm("noop_build.txt")
    crit = pb.ninfer_criteria(log, cache, up_to_date=True)
    # the recorded toolkit is 13.0: found, and judged too old from the cache as from a log line
    assert crit["found CUDAToolkit 13.1 or newer"] is None
    assert crit["found libavformat"] == "60.16.100 (CMakeCache.txt)"
    assert crit["linked apps/ninfer-serve"] == "up to date (ninja -n: no work to do)"
    newer = {**cache, "FIND_PACKAGE_MESSAGE_DETAILS_CUDAToolkit": "[/usr/local/cuda/include][v13.1.80()]"}
    assert pb.ninfer_criteria(log, newer, up_to_date=True)["found CUDAToolkit 13.1 or newer"] == \
        "13.1 (CMakeCache.txt)"
    assert pb.ninfer_criteria(log, newer, up_to_date=False)["linked apps/ninfer-serve"] is None


def test_cmake_cache_module_found_among_several():
    cache = {"FFMPEG_FOUND": "1", "FFMPEG_libavformat_VERSION": "61.1.100", "FFMPEG_VERSION": ""}
    assert pb.ninfer_criteria("", cache)["found libavformat"] == "61.1.100 (CMakeCache.txt)"
    assert pb.ninfer_criteria("", {**cache, "FFMPEG_FOUND": "0"})["found libavformat"] is None


def test_build_log_check_names_p07_and_the_rebuild():
    b = {"source": {"head": "abc1234"}, "cuda": {"version": "13.1"}, "pkg_config": {}, "log": "/l",
         "configure_rc": 0, "build_rc": 0, "binary": {"runs": True}, "libraries": [{"name": "x", "path": "/x"}],
         "criteria": pb.ninfer_criteria(cm("reconfigure.txt") + cm("noop_build.txt"))}
    from p2pkit import config

    c = {x.id: x for x in ec.check({"engine_build": b}, config.load(None))}
    assert c["engine.build_log"].status == "fail" and c["engine.build_log"].pitfall == "P07"
    assert "--from engine --force" in c["engine.build_log"].hint
