"""The roles and modules ship as the Ansible collection p2pkit.host (issue 39 item 3): `ansible-galaxy
collection build` of playbooks/collections/ansible_collections/p2pkit/host makes a tarball that
`ansible-galaxy collection install` puts on a controller without p2pkit, and that tarball holds every
role, module and playbook as regular files (a link into p2pkit's own tree is carried as the file it
points at). tests/test_roles.py runs site.yml from such an installed copy."""

import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from p2pkit.core.ansible import COLLECTION
from tests.conftest import REPO

SRC = REPO / COLLECTION


def galaxy() -> str:
    return str(Path(sys.executable).parent / "ansible-galaxy")


def build_collection(out: Path) -> Path:
    """`ansible-galaxy collection build` of the collection's tree: the tarball's path."""
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([galaxy(), "collection", "build", str(SRC), "--output-path", str(out), "--force"],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(out),
                                                            "ANSIBLE_HOME": str(out / ".ansible")})
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = out.glob("p2pkit-host-*.tar.gz")
    return tarball


def install_collection(tmp: Path) -> Path:
    """The collection built and installed with `ansible-galaxy collection install` under tmp, offline:
    the directory to give as ANSIBLE_COLLECTIONS_PATH."""
    tarball = build_collection(tmp / "build")
    dest = tmp / "collections"
    r = subprocess.run([galaxy(), "collection", "install", str(tarball), "-p", str(dest), "--offline"],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp),
                                                            "ANSIBLE_HOME": str(tmp / ".ansible")})
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def test_the_built_collection_holds_every_role_module_and_playbook_as_files(tmp_path):
    tarball = build_collection(tmp_path)
    with tarfile.open(tarball) as t:
        members = {m.name: m for m in t.getmembers()}
        manifest = yaml.safe_load(t.extractfile("MANIFEST.json"))
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"]) == ("p2pkit", "host")
    files = {n for n, m in members.items() if m.isfile()}
    roles = sorted(p.name for p in (SRC / "roles").iterdir())
    assert roles == ["p2pkit_common", "p2pkit_driver", "p2pkit_engine", "p2pkit_p2p_module", "p2pkit_service"]
    for role in roles:
        assert f"roles/{role}/meta/main.yml" in files, role
    for src in sorted(SRC.rglob("*")):
        rel = str(src.relative_to(SRC))
        if src.is_file() and "__pycache__" not in rel and rel != "galaxy.yml":  # galaxy.yml becomes MANIFEST.json
            assert rel in files, f"{rel} is missing from the built collection"
    assert not [n for n in members if "__pycache__" in n]
    assert not [n for n, m in members.items() if m.issym() or m.islnk()], "a link left in the tarball"
    for book in ("driver", "p2p_module", "engine", "service", "site"):
        assert f"playbooks/{book}.yml" in files


def test_the_installed_collection_is_what_ansible_finds_without_p2pkit(tmp_path):
    dest = install_collection(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_HOME": str(tmp_path / ".ansible"),
           "ANSIBLE_COLLECTIONS_PATH": str(dest)}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-t", "module", "-l", "p2pkit.host"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert {ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()} == {"p2pkit.host.p2pkit_files",
                                                                               "p2pkit.host.p2pkit_user"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--syntax-check", "-i", "localhost,",
                        "p2pkit.host.site"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
