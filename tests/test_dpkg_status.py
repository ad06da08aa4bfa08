"""dpkg's database (/var/lib/dpkg/status) read for its installed packages: one pattern, the p2pkit_common role's
p2pkit_dpkg_installed, read by the driver, p2p-module and engine roles and by p2pkit. A stanza's Status line may
follow other fields (dpkg writes Essential and Protected before it: 25 of the 710 packages of the Debian 12
machine tests/fixtures/dpkg was copied from), a held package is installed, and only error flag "ok" with status
"installed" counts (reinstreq is a package dpkg must reinstall, config-files one removed). Read over real
stanzas and written ones (tests/fixtures/dpkg/README.md)."""

import re
import shutil
import subprocess

import pytest
import yaml

from p2pkit.core.ansible import COLLECTION
from p2pkit.parse import system as ps
from tests.conftest import FIXTURES, REPO
from tests.test_roles import load_files_module

STATUS = FIXTURES / "dpkg/status"
ROLES = REPO / COLLECTION / "roles"
# (package, selection) of each installed package in the fixture, in its order
INSTALLED = [["hostname", "install"], ["libgcc-s1", "install"], ["libnvidia-compute-580", "hold"],
             ["pkg-config", "install"]]
# where each role reads dpkg's database
READERS = {"p2pkit_driver": "tasks/main.yml", "p2pkit_p2p_module": "tasks/render.yml",
           "p2pkit_engine": "tasks/main.yml"}


def pattern() -> str:
    return yaml.safe_load((ROLES / "p2pkit_common/defaults/main.yml").read_text())["p2pkit_dpkg_installed"]


def test_the_pattern_is_stated_once_in_the_common_role_and_each_reader_takes_it_from_there():
    """p2pkit reads it there too (tests/test_role_defaults.py)."""
    for role, tasks in READERS.items():
        text = (ROLES / role / tasks).read_text()
        assert "p2pkit_dpkg_installed" in text and "Status:" not in text, role
    stated = [str(p.relative_to(REPO)) for d in ("p2pkit", "playbooks") for p in (REPO / d).rglob("*")
              if p.suffix in (".py", ".yml", ".j2") and "Status: " in p.read_text(errors="replace")]
    # the common role's statement; the simulator's writer of the simulated host's database and its own hold reader
    assert sorted(stated) == ["p2pkit/sim/render.py", f"{COLLECTION}/roles/p2pkit_common/defaults/main.yml"]


def test_the_pattern_reads_real_stanza_shapes():
    text = STATUS.read_text()
    found = list(re.finditer(pattern(), text, re.M))
    assert [list(m.groups()) for m in found] == INSTALLED
    for m in found:  # each match inside its own stanza: it never runs past a blank line into the next
        assert "\n\n" not in m.group(0) and m.group(0).startswith(f"Package: {m.group(1)}\n")
    # the one-line reading (Status: right after Package:) missed the Essential and the Protected package
    assert [p for p, _ in INSTALLED if p not in re.findall(r"^Package: (\S+)\nStatus: \S+ ok installed$", text,
                                                            re.M)] == ["hostname", "libgcc-s1"]


def test_the_files_module_finds_what_the_roles_read(tmp_path):
    """The roles read dpkg's database through p2pkit.host.p2pkit_files (findall, multiline): [package, selection]
    for each installed package."""
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    shutil.copy(STATUS, tmp_path / "var/lib/dpkg/status")
    probed = load_files_module().probe(str(tmp_path), {"path": "/var/lib/dpkg/status", "findall": pattern()})
    assert probed["found"] == INSTALLED


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="dpkg-query is not on this machine")
def test_dpkg_query_on_the_same_database_reads_the_same_installed_and_held_packages(tmp_path):
    """p2pkit's package holds (P02) come from dpkg-query's status abbreviation: installed is status 'i' with no
    error flag (a reinstreq package reads 'iiR'), whatever the selection, as the driver role reads the file."""
    for d in ("updates", "info"):
        (tmp_path / d).mkdir()
    shutil.copy(STATUS, tmp_path / "status")
    q = subprocess.run(["dpkg-query", f"--admindir={tmp_path}", "-W", "-f=${db:Status-Abbrev} ${Package}\n"],
                       capture_output=True, text=True, check=True)
    assert "iiR nvidia-dkms-580" in q.stdout.splitlines()
    assert ps.dpkg_installed(q.stdout) == [p for p, _ in INSTALLED]
    assert ps.dpkg_held(q.stdout) == ["libnvidia-compute-580"]
    # a package selected for removal or purge is still installed until it is removed
    assert ps.dpkg_installed("ri  a\npi  b\niU  c\nrc  d\nhiR e\n") == ["a", "b"]


def test_the_simulated_host_writes_an_essential_stanza_as_dpkg_does(sim):
    """bash's stanza carries Essential: yes between Package: and Status: (as on every Debian and Ubuntu host);
    a hold the real apt-mark set on it survives a re-render of the simulated host."""
    from p2pkit.sim.render import load_state, render

    root = sim("healthy")
    status = root / "var/lib/dpkg/status"
    assert status.read_text().startswith("Package: bash\nEssential: yes\nStatus: install ok installed\n")
    assert ["bash", "install"] in [list(m) for m in re.findall(pattern(), status.read_text(), re.M)]
    apt_mark = str(root / "usr/bin/apt-mark")  # this machine's real apt-mark on the simulated host's database
    subprocess.run([apt_mark, "hold", "bash"], check=True, capture_output=True)
    assert status.read_text().startswith("Package: bash\nEssential: yes\nStatus: hold ok installed\n")
    render(root, load_state(root))
    assert status.read_text().startswith("Package: bash\nEssential: yes\nStatus: hold ok installed\n")
    assert subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split() == \
        ["bash"]
