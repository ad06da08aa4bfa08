"""The top-level layout the person we build for named (pyproject.toml, playbooks/, p2pkit/, templates/,
systemd/, tests/, docs/) holds with the roles complete on their own: each file p2pkit writes onto a
host lives once, in the role that writes it (or in templates/ when p2pkit renders it itself, the
resume unit); templates/ indexes every template and systemd/ every unit, each a link to that one
file. The index cannot go stale: every link resolves, and every role template and unit is indexed."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROLES = REPO / "playbooks/collections/ansible_collections/p2pkit/host/roles"
UNIT_SUFFIXES = (".service", ".timer", ".slice", ".service.j2", ".timer.j2", ".slice.j2")


def test_the_named_top_level_folders_are_there():
    for name in ("pyproject.toml", "playbooks", "p2pkit", "templates", "systemd", "tests", "docs"):
        assert (REPO / name).exists(), name


def _owned() -> list[Path]:
    """Every file a role writes onto a host from its own tree (templates/ and files/), and the one p2pkit
    renders itself."""
    return [*ROLES.glob("*/templates/*"), *ROLES.glob("*/files/*"), REPO / "templates/p2pkit-resume.service.j2"]


def test_every_index_entry_links_to_the_one_file_and_resolves():
    for folder in ("templates", "systemd"):
        for entry in sorted((REPO / folder).iterdir()):
            if entry.name == "p2pkit-resume.service.j2" and folder == "templates":
                assert not entry.is_symlink()  # p2pkit renders it itself: its one copy lives here
                continue
            assert entry.is_symlink(), f"{folder}/{entry.name} is a copy: link it to the file its role owns"
            target = entry.resolve()
            assert target.is_file(), f"{folder}/{entry.name} points at nothing ({entry.readlink()})"
            assert target in {p.resolve() for p in _owned()}, f"{folder}/{entry.name} -> {target}"


def test_every_template_and_unit_is_indexed():
    templates = {p.resolve() for p in (REPO / "templates").iterdir()}
    units = {p.resolve() for p in (REPO / "systemd").iterdir()}
    for f in _owned():
        if f.suffix == ".j2":
            assert f.resolve() in templates, f"link {f.relative_to(REPO)} from templates/"
        if f.name.endswith(UNIT_SUFFIXES):
            assert f.resolve() in units, f"link {f.relative_to(REPO)} from systemd/"
