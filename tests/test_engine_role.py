"""The engine role is complete on its own (issue 28, item 3): it decides from the host which build
dependencies are missing (dpkg's database under the host root, or the package's tools on the host's
PATH) and installs only those through the host's apt-get; it makes the build directory's parent with
a mode only when it creates it. Alone (`ansible-playbook -i INVENTORY playbooks/engine.yml`) it does
what the engine stage does, and a second run reports changed=0."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.ansible import RECAP
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import P2pkitError
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.stages.engine import cmake as engine_stage
from p2pkit.stages.engine import common
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def ctx_for(root: Path) -> pipeline.Ctx:
    h = Host.at(root)
    return pipeline.Ctx(profile=config.load(h.sim["profile"]), host=h, store=Store(root / "var/lib/p2pkit"),
                        out=Output())


def by_hand(tmp: Path, given: dict) -> subprocess.CompletedProcess:
    inv = tmp / "inventory.yml"
    inv.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, **given}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "playbooks/ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_HOME": str(tmp / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible/tmp")}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv),
                           str(REPO / "playbooks/engine.yml")], env=env, capture_output=True, text=True, timeout=600)


def changed(out: str) -> int:
    m = RECAP.search(out)
    assert m, out[-2000:]
    return int(m.group(2))


def test_the_stage_makes_the_parent_once_and_leaves_an_existing_mode_alone(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    parent = root / Path(ctx.profile.engine.build_dir).parent.relative_to("/")
    assert not parent.exists()
    first = common.dependencies(ctx)
    # the parent, then the checkout at the pinned commit (no build in the role's first run)
    assert first["changed"] == 2 and parent.is_dir() and parent.stat().st_mode & 0o777 == 0o755
    assert (root / ctx.profile.engine.build_dir.lstrip("/") / ".git/HEAD").read_text().strip() == \
        ctx.profile.engine.commit
    log = (ctx.store.dir / "logs/engine.log").read_text()
    assert "skipping: [localhost]" in log.split("Ensure the missing build dependencies are installed]", 1)[1][:200]
    parent.chmod(0o700)  # an existing directory's mode is the operator's
    assert common.dependencies(ctx)["changed"] == 0
    assert parent.stat().st_mode & 0o777 == 0o700


def test_the_role_alone_on_the_simulated_host_then_nothing(sim, tmp_path):
    root = sim("healthy")
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    given = {"p2pkit_root": str(root), "p2pkit_path": h.runner.path_env(),
             "p2pkit_engine_recipe": prof.engine.recipe, "p2pkit_engine_build_dir": prof.engine.build_dir,
             "p2pkit_engine_repo": prof.engine.repo, "p2pkit_engine_commit": prof.engine.commit,
             "p2pkit_engine_cmake_options": ["-DCMAKE_BUILD_TYPE=Release",
                                             f"-DCMAKE_CUDA_ARCHITECTURES={prof.engine.cuda_architectures}"],
             "p2pkit_engine_pkg_config_path": prof.engine.pkg_config_path}
    r = by_hand(tmp_path, given)
    # the parent, the checkout, configure, build, the configure stamp
    assert r.returncode == 0 and changed(r.stdout) == 5, r.stdout[-3000:]
    src = root / prof.engine.build_dir.lstrip("/")
    assert (src / "build/apps/ninfer-serve").is_file()
    log = (root / "var/lib/p2pkit/logs/engine-build.log").read_text()  # the role's own log when run alone
    assert f"$ cmake -S {src} -B {src}/build -G Ninja -DCMAKE_BUILD_TYPE=Release" in log
    assert "Linking CXX executable apps/ninfer-serve" in log
    again = by_hand(tmp_path, given)
    assert again.returncode == 0 and changed(again.stdout) == 0, again.stdout[-3000:]
    assert "skipping: [localhost]" in again.stdout.split("Build the engine's targets (cmake --build)]", 1)[1][:200]
    assert (root / "var/lib/p2pkit/logs/engine-build.log").read_text().endswith("ninja: no work to do.\n\n")
    # a changed option configures and builds again
    more = by_hand(tmp_path, {**given, "p2pkit_engine_cmake_options": [*given["p2pkit_engine_cmake_options"],
                                                                       "-DP2PKIT_TEST=1"]})
    assert more.returncode == 0 and changed(more.stdout) == 3, more.stdout[-3000:]


def test_the_role_refuses_an_unpinned_commit_and_a_directory_that_holds_files(sim, tmp_path):
    """An engine commit that is no pin (a branch name) stops the role before it clones; where the checkout
    belongs, a tree of empty directories (a checkout emptied of its files) is removed and cloned again,
    one holding a file is refused naming it, the file kept."""
    root = sim("healthy")
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    given = {"p2pkit_root": str(root), "p2pkit_path": h.runner.path_env(), "p2pkit_engine_build": False,
             "p2pkit_engine_recipe": prof.engine.recipe, "p2pkit_engine_build_dir": prof.engine.build_dir,
             "p2pkit_engine_repo": prof.engine.repo, "p2pkit_engine_commit": "main"}
    src = root / prof.engine.build_dir.lstrip("/")
    r = by_hand(tmp_path, given)
    assert r.returncode != 0 and 'p2pkit_engine_commit is "main": pin the engine commit' in r.stdout, r.stdout[-3000:]
    assert not src.exists()
    given["p2pkit_engine_commit"] = prof.engine.commit
    (src / "a/b").mkdir(parents=True)
    (src / ".git/objects").mkdir(parents=True)
    r = by_hand(tmp_path, given)
    assert r.returncode == 0 and (src / ".git/HEAD").read_text().strip() == prof.engine.commit, r.stdout[-3000:]
    assert "Remove an engine checkout emptied of its files" in r.stdout and not (src / "a").exists()
    away = src.with_name("away")
    src.rename(away)
    (src / "sub").mkdir(parents=True)
    (src / "sub/notes.txt").write_text("mine\n")
    r = by_hand(tmp_path, given)
    assert r.returncode != 0 and "exists and is not a git checkout: p2pkit will not touch it" in r.stdout
    assert f"{src}/sub/notes.txt" in r.stdout and (src / "sub/notes.txt").read_text() == "mine\n"


def test_without_a_required_variable_the_first_task_stops_naming_it(sim, tmp_path):
    root = sim("healthy")
    r = by_hand(tmp_path, {"p2pkit_root": str(root), "p2pkit_path": Host.at(root).runner.path_env(),
                           "p2pkit_engine_recipe": "ninfer"})
    assert r.returncode != 0 and r.stdout.count("TASK [") == 1, r.stdout[-3000:]
    # the first task is Ansible's check of the role's meta/argument_specs.yml
    assert re.search(r"fatal: .*missing required arguments: p2pkit_engine_build_dir", r.stdout)
    # given empty, the role's own first task names it
    r = by_hand(tmp_path, {"p2pkit_root": str(root), "p2pkit_path": Host.at(root).runner.path_env(),
                           "p2pkit_engine_recipe": "ninfer", "p2pkit_engine_build_dir": ""})
    assert r.returncode != 0 and r.stdout.count("TASK [") == 2, r.stdout[-3000:]
    assert re.search(r"fatal: .*the engine role needs p2pkit_engine_build_dir", r.stdout)


def test_a_missing_dependency_goes_to_the_hosts_apt_get_and_its_message_comes_back(sim):
    """The simulated host's dpkg no longer lists libcurl4-openssl-dev (and it has no tool to stand in
    for it): the role finds it missing and runs the host's apt-get, the real apt on the simulated
    host's database, which has no package lists: apt's own message is in p2pkit's error."""
    root = sim("healthy")
    status = root / "var/lib/dpkg/status"
    text = status.read_text()
    stanza = re.search(r"Package: libcurl4-openssl-dev\n.*?\n\n", text, re.S).group(0)
    status.write_text(text.replace(stanza, ""))
    ctx = ctx_for(root)
    with pytest.raises(P2pkitError) as e:
        common.dependencies(ctx)
    assert "Ensure the missing build dependencies are installed" in e.value.message
    assert "libcurl4-openssl-dev" in e.value.message


def _without_package(root: Path, name: str) -> None:
    status = root / "var/lib/dpkg/status"
    text = status.read_text()
    status.write_text(text.replace(re.search(rf"Package: {re.escape(name)}\n.*?\n\n", text, re.S).group(0), ""))


def test_p2pkit_reads_the_missing_dependencies_as_the_role_decides_them(sim):
    """dpkg's database, or else the package's tools on the host's PATH (cmake without its package: this
    machine's cmake is lent to the simulated host); what p2pkit reads is what the role installs."""
    root = sim("healthy")
    ctx = ctx_for(root)
    assert common.missing_dependencies(ctx) == []
    _without_package(root, "cmake")
    assert common.missing_dependencies(ctx) == []  # its tool is on PATH: the role installs nothing either
    common.dependencies(ctx)
    log = (ctx.store.dir / "logs/engine.log").read_text()
    assert "skipping: [localhost]" in log.split("Ensure the missing build dependencies are installed]", 1)[1][:200]
    _without_package(root, "libcurl4-openssl-dev")
    assert common.missing_dependencies(ctx) == ["libcurl4-openssl-dev"]
    with pytest.raises(P2pkitError) as e:  # the role finds the same one and goes to apt-get with it
        common.dependencies(ctx)
    assert "Ensure the missing build dependencies are installed" in e.value.message
    assert "libcurl4-openssl-dev" in e.value.message


def test_a_held_a_protected_and_a_broken_dependency_are_read_as_dpkg_means_them(sim):
    """libcurl4-openssl-dev has no tool to stand in for it: dpkg's database alone decides. Held (the real
    apt-mark on the simulated host's database) or with a Protected: line between Package: and Status: (the shape
    dpkg writes for libgcc-s1 on Debian 12, tests/fixtures/dpkg), it is installed: p2pkit and the role install
    nothing. With dpkg's reinstreq flag (install reinstreq installed) it is not, and both go to apt-get."""
    root = sim("healthy")
    ctx = ctx_for(root)
    status = root / "var/lib/dpkg/status"
    plain = status.read_text()
    subprocess.run([str(root / "usr/bin/apt-mark"), "hold", "libcurl4-openssl-dev"], check=True, capture_output=True)
    assert "Package: libcurl4-openssl-dev\nStatus: hold ok installed\n" in status.read_text()
    protected = plain.replace("Package: libcurl4-openssl-dev\n", "Package: libcurl4-openssl-dev\nProtected: yes\n")
    for text in (None, protected):
        if text is not None:
            status.write_text(text)
        assert common.missing_dependencies(ctx) == []
        common.dependencies(ctx)
        log = (ctx.store.dir / "logs/engine.log").read_text()
        assert "skipping: [localhost]" in log.split("Ensure the missing build dependencies are installed]")[-1][:200]
    status.write_text(plain.replace("Package: libcurl4-openssl-dev\nStatus: install ok installed\n",
                                    "Package: libcurl4-openssl-dev\nStatus: install reinstreq installed\n"))
    assert common.missing_dependencies(ctx) == ["libcurl4-openssl-dev"]
    with pytest.raises(P2pkitError) as e:
        common.dependencies(ctx)
    assert "Ensure the missing build dependencies are installed" in e.value.message
    assert "libcurl4-openssl-dev" in e.value.message


def test_the_stage_runs_the_role_once_when_nothing_is_to_be_installed_first(sim):
    """The dependencies there (p2pkit reads them as the role does): the toolchain is checked first, then one
    run of the role checks out, configures and builds; a dependency to install first: two runs, the toolchain
    checked between them (pkg-config may be what is installed)."""
    root = sim("healthy")
    ctx = ctx_for(root)
    logs = ctx.store.dir / "logs"
    res = engine_stage.build(ctx)
    assert res["configure_rc"] == res["build_rc"] == 0 and res["source"]["head"] == ctx.profile.engine.commit
    assert (logs / "engine.log").is_file() and not (logs / "engine.log.1").exists()  # one ansible-playbook run
    tasks = res["dependencies"]["tasks"]
    assert tasks["Ensure the engine is checked out at the pinned commit"]["changed"] == 1
    assert tasks[engine_stage.BUILD_TASK]["changed"] == 1
    assert engine_stage.CONFIGURE_MARK in Path(res["log"]).read_text()
    _without_package(root, "libcurl4-openssl-dev")
    with pytest.raises(P2pkitError) as e:  # its first run stops at apt-get, before any toolchain check or build
        engine_stage.build(ctx)
    assert "Ensure the missing build dependencies are installed" in e.value.message


def test_the_emptied_checkout_removal_keeps_the_directory_itself_and_lost_found(sim, tmp_path):
    """Where the checkout belongs is a filesystem's root (a disk mounted at engine.build_dir): its empty
    lost+found is the filesystem's, and the directory itself cannot be removed. Both stay; the empty
    directories p2pkit's checkout left go; git then refuses the non-empty directory in its own words
    (before, find deleted lost+found and failed on the mount point)."""
    root = sim("healthy")
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    given = {"p2pkit_root": str(root), "p2pkit_path": h.runner.path_env(), "p2pkit_engine_build": False,
             "p2pkit_engine_recipe": prof.engine.recipe, "p2pkit_engine_build_dir": prof.engine.build_dir,
             "p2pkit_engine_repo": prof.engine.repo, "p2pkit_engine_commit": prof.engine.commit}
    src = root / prof.engine.build_dir.lstrip("/")
    (src / "lost+found").mkdir(parents=True)
    (src / "a/b").mkdir(parents=True)
    r = by_hand(tmp_path, given)
    assert "Remove an engine checkout emptied of its files" in r.stdout, r.stdout[-3000:]
    assert (src / "lost+found").is_dir() and not (src / "a").exists()
    assert r.returncode != 0 and "not an empty directory" in r.stdout, r.stdout[-3000:]
