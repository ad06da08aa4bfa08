"""The service's and engine's playbooks start only when one of their tasks has work
(p2pkit/stages/work.py): p2pkit's own probes decide, and the tasks get only that work (the driver
and p2p-module roles decide their own work: tests/test_roles.py). Each skip is proven both ways: on a host where
everything is in place no playbook starts; on one where a single thing differs the playbook
starts and puts exactly that right (a probe that missed it would leave it wrong)."""

import os
from pathlib import Path

import pytest

from p2pkit import config, pipeline
from p2pkit.artifacts import Store
from p2pkit.host import Host
from p2pkit.output import Output
from p2pkit.stages import work


def test_differs_reads_content_mode_and_kind(tmp_path):
    host = Host.at(tmp_path)
    (tmp_path / "etc").mkdir()
    f = work.file_entry("/etc/x.conf", "a = 1\n", "0644")
    assert work.differs(host, f)  # missing
    (tmp_path / "etc/x.conf").write_text("a = 1\n")
    os.chmod(tmp_path / "etc/x.conf", 0o644)
    assert not work.differs(host, f)
    (tmp_path / "etc/x.conf").write_text("a = 2\n")  # one byte
    assert work.differs(host, f)
    (tmp_path / "etc/x.conf").write_text("a = 1\n")
    os.chmod(tmp_path / "etc/x.conf", 0o600)  # the mode
    assert work.differs(host, f)
    d = work.dir_entry("/etc", "0755")
    os.chmod(tmp_path / "etc", 0o700)  # an existing directory's mode is the operator's
    assert not work.differs(host, d)
    assert work.differs(host, work.dir_entry("/etc/x.conf"))  # a file where a directory belongs
    assert work.differs(host, {**f, "owner": "p2pkit-no-such-user"})  # the role creates the user first


def test_has_work_counts_flags_lists_and_files_only():
    assert work.has_work({"files": {"a": [], "b": []}, "install": False, "stock": []}) == []
    assert work.has_work({"files": {"a": [{"path": "/x"}]}, "install": True, "stock": [{"path": "/y"}]}) == \
        ["files.a", "install", "stock"]


def ctx_for(root: Path, profile=None) -> pipeline.Ctx:
    host = Host.at(root)
    return pipeline.Ctx(profile=profile or config.load(host.sim["profile"]), host=host,
                        store=Store(root / "var/lib/p2pkit"), out=Output())


def started(res: dict) -> bool:
    return res.get("started", True) and "returncode" in res


@pytest.mark.slow


def test_the_failure_named_is_the_one_that_stopped_the_run_not_one_a_rescue_caught():
    from p2pkit.ansible import failed_task

    log = ("TASK [r : Download the installer and check its pinned sha256] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "The checksum did not match"}\n'
           "TASK [r : Keep the download with the wrong checksum aside] ***\nchanged: [localhost]\n"
           "TASK [r : Stop on a wrong checksum] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "has sha256 ab, not the pinned 00"}\n'
           "TASK [r : Hold packages] ***\n"
           'failed: [localhost] (item=a) => {"msg": "no such package a"}\n'
           'fatal: [localhost]: FAILED! => {"msg": "One or more items failed"}\n')
    assert failed_task(log) == "task 'r : Hold packages': no such package a"  # a loop: its first item's failure
    assert failed_task(log.split("TASK [r : Hold")[0]) == "task 'r : Stop on a wrong checksum': " \
                                                          "has sha256 ab, not the pinned 00"
