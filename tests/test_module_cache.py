"""One cache of the modules Ansible builds, shared by a state directory's stage playbooks
(playbooks/callback_plugins/p2pkit_module_cache.py, core/ansible.module_cache): each module's payload
is built once per `up`, not once per playbook, and never reused across a change to what it is built
from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pkit.core import ansible
from tests.conftest import REPO
from tests.test_playbooks import ctx_for


def test_the_cache_is_named_by_what_the_payloads_are_built_from(tmp_path, monkeypatch):
    """The same sources give the same directory; a changed module of p2pkit's gives another, and the
    directory of the old key is removed rather than left to be reused."""
    share = tmp_path / "share"
    shutil.copytree(REPO / "playbooks", share / "playbooks", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(ansible, "share_dir", lambda: share)
    state = tmp_path / "state"
    first = ansible.module_cache(state)
    assert first == ansible.module_cache(state)
    first.mkdir(parents=True)
    (first / "ansible.legacy.p2pkit_files-ZIP_DEFLATED-none").write_text("a payload of the old module")
    lib = share / "playbooks/library/p2pkit_files.py"
    lib.write_text(lib.read_text() + "\n# changed\n")
    second = ansible.module_cache(state)
    assert second != first and second.parent == first.parent
    assert not first.exists()


@pytest.mark.slow
def test_a_stage_playbook_builds_into_the_shared_cache_and_the_next_reuses_it(sim):
    """The driver's playbook leaves its built modules in <state>/.ansible/modules/<key>; the p2p-module
    playbook, a later ansible-playbook process, finds p2pkit_files there and builds it no more (the
    payload file is the one the first run wrote)."""
    from p2pkit.stages.driver import act as driver_act
    from p2pkit.stages.p2p_module import act as acting

    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    cache = ansible.module_cache(ctx.store.dir)
    payload = cache / "ansible.legacy.p2pkit_files-ZIP_DEFLATED-none"
    assert payload.is_file(), sorted(p.name for p in cache.parent.rglob("*"))
    built = payload.stat().st_mtime_ns
    acting.p2p_module(ctx)
    assert payload.stat().st_mtime_ns == built
    assert (cache / "ansible.modules.git-ZIP_DEFLATED-none").is_file()
    # Ansible's own temporary directories are gone; the cache is what stays
    assert not list(Path(ctx.store.dir, ".ansible/tmp").glob("run*"))
