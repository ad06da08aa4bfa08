"""NCCL connection lines of every release (fixtures/nccl: public logs and NCCL's own format strings)."""

import pytest

from p2pkit.core import config
from p2pkit.parse import nccl
from p2pkit.stages.service import checks as service_checks
from p2pkit.stages.service.act import joined_line
from tests.conftest import FIXTURES

BY_RELEASE = (FIXTURES / "nccl/channels_by_release.txt").read_text().splitlines()
WANT = ["P2P/IPC", "NET/AWS Libfabric", "NET/IB", "P2P/direct pointer", "P2P/direct pointer", "SHM", "SHM", "SHM",
        "NET/Socket", "NET/IB", "P2P/CUMEM", "NET/AWS Libfabric", "SHM"]


def test_every_release_form_is_read():
    assert [nccl.transport(ln) for ln in BY_RELEASE] == WANT


@pytest.mark.parametrize("line", [
    "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read/CE",
    "h:1:1 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/MNNVL/read",
    "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read",
    "h:1:1 [0] NCCL INFO Ring 00 : 0 -> 1 via P2P/common device",
    "h:1:1 [0] NCCL INFO Channel 02/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA(PCI)/Shared",
    "h:1:1 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA",
])
def test_forms_from_the_format_strings(line):
    # each built from the INFO format of src/transport/{p2p,net,coll_net}.cc (release named in parse/nccl.py)
    t = nccl.transport(line)
    assert t in ("P2P/IPC", "P2P/MNNVL", "P2P/indirect", "P2P/common device", "NET/IB", "COLLNET/SHARP")


@pytest.mark.parametrize("line", [
    "h:1:1 [0] NCCL INFO Channel 00/24 :    0   1",  # the ring order, not a connection
    "h:1:1 [0] NCCL INFO NET/IB : No device found.",
    "h:1:1 [0] NCCL INFO Using network AWS Libfabric",
    "h:1:1 [0] NCCL INFO Ring 02 : 2 -> 0 -> 1",
])
def test_other_lines_are_not_connections(line):
    assert nccl.transport(line) is None


def test_the_check_judges_old_and_plugin_forms():
    p = config.load("dual-spark-vllm")
    old_ib = [BY_RELEASE[2]]  # 2.6-2.11: "Channel 03 : ... via NET/IB/0/GDRDMA", no "/C"
    assert service_checks._nccl(nccl.transports(old_ib), p).status == "pass"
    shm_and_socket = [BY_RELEASE[6], BY_RELEASE[8]]
    c = service_checks._nccl(nccl.transports(shm_and_socket), p)
    assert c.status == "fail" and c.measured == "NET/Socket, SHM"
    assert service_checks._nccl(nccl.transports([BY_RELEASE[11]]), p).status == "fail"  # Libfabric is not RoCE


def test_the_join_wait_sees_every_form():
    for ln in BY_RELEASE:
        assert joined_line(["h:1:1 [0] NCCL INFO Bootstrap : Using eth0", ln]) == ln
    assert joined_line(["h:1:1 [0] NCCL INFO NET/IB : No device found."]) is None


def test_ldd_version_not_found_is_a_failure_naming_library_and_version():
    """A real ldd capture (fixtures/ldd): the library resolves, yet lacks GLIBC_2.38: it will not load."""
    from p2pkit.parse.build import ldd
    from p2pkit.stages.engine import checks as ec

    libs = ldd((FIXTURES / "ldd/version_not_found.txt").read_text())
    foo = next(x for x in libs if x["name"] == "libfoo.so.6")
    assert foo["path"] == "/tmp/lddt/libfoo.so.6" and foo["missing_versions"] == ["GLIBC_2.38"]
    p = config.load("dual-5090-ninfer")
    b = {"source": {"head": "x"}, "cuda": {"version": "13.1"}, "pkg_config": {},
         "binary": {"runs": True, "version": "v"}, "libraries": libs}
    c = {x.id: x for x in ec.check({"engine_build": b}, p)}["engine.libraries"]
    assert c.status == "fail" and "libfoo.so.6 (/tmp/lddt/libfoo.so.6) lacks version GLIBC_2.38" in c.measured
    assert (c.value, c.unit, c.op, c.limit) == (1, "count", "==", 0)  # one library unresolved, none allowed
    clean = [x for x in libs if x["name"] != "libfoo.so.6"]
    assert {x.id: x for x in ec.check({"engine_build": {**b, "libraries": clean}}, p)}["engine.libraries"].status \
        == "pass"


ALLREDUCE = (FIXTURES / "h200-device/field-run/nccl_allreduce.txt").read_text().splitlines()


def test_socket_beside_ib_fails_p23():
    # one channel pair on sockets beside the RoCE ones is the silent TCP fallback all the same (P23)
    p = config.load("dual-spark-vllm")
    ib, sock = BY_RELEASE[9], BY_RELEASE[8]
    assert service_checks._nccl(nccl.transports([ib]), p).status == "pass"
    c = service_checks._nccl(nccl.transports([ib, sock]), p)
    assert c.status == "fail" and c.pitfall == "P23" and "NET/Socket" in c.measured


def test_init_summary_reads_pairs_version_and_environment():
    # the real H200 all-reduce log (version, NCCL_NVLS_ENABLE set by environment) and real connection lines
    s = nccl.init_summary([*ALLREDUCE, BY_RELEASE[10], BY_RELEASE[6], BY_RELEASE[9]])
    assert s["version"] == "2.28.9+cuda13.0" and s["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert s["connections"] == 3 and s["local"] == ["P2P/CUMEM", "SHM"] and s["across"] == ["NET/IB"]
    assert s["local_not_p2p"] == ["6->7 channel 9 via SHM"]
    assert nccl.connections([BY_RELEASE[1]]) == [{"channel": 0, "from": 7, "to": 8, "transport": "NET/AWS Libfabric"}]


def test_engine_nccl_between_local_gpus_p30():
    p2p = nccl.init_summary([*ALLREDUCE, BY_RELEASE[10]])
    c = service_checks.nccl_local(p2p)
    assert c.status == "pass" and c.pitfall == "P30" and "NCCL 2.28.9+cuda13.0" in c.measured
    shm = nccl.init_summary([*ALLREDUCE, BY_RELEASE[10], BY_RELEASE[12]])  # one pair via SHM: NCCL's default level
    c = service_checks.nccl_local(shm)
    assert c.status == "fail" and "0->1 channel 0 via SHM" in c.measured and "field.nccl_p2p_level" in c.hint
    assert service_checks.nccl_local(nccl.init_summary(ALLREDUCE)).status == "skip"  # no connection line
    across = service_checks.nccl_local(nccl.init_summary([BY_RELEASE[9]]))  # only across nodes: P23's
    assert across.status == "skip" and "NET/IB" in across.measured
