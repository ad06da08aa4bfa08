"""Where p2pkit's playbooks and roles are, and what a role and p2pkit both state, stated once: in
the role's defaults/main.yml, which p2pkit reads here (the driver's guarded package names and guard
files, the fork commit's pattern). Read lazily and once per process, never at import: `p2pkit
doctor` imports the modules that use it and must not pay for YAML it does not need."""

from __future__ import annotations

from functools import cache
from pathlib import Path

COLLECTION = "playbooks/collections/ansible_collections/p2pkit/host"  # the roles and modules: collection p2pkit.host


def share_dir() -> Path:
    """playbooks/, templates/, systemd/: inside the wheel, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent  # p2pkit/
    installed = package / "_share"
    return installed if (installed / "playbooks").is_dir() else package.parent


@cache
def role_defaults(role: str) -> dict:
    """The role's defaults/main.yml (role: p2pkit_driver, p2pkit_p2p_module, ...), parsed once."""
    import yaml  # ansible-core's own dependency (PyYAML)

    doc = yaml.safe_load((share_dir() / COLLECTION / "roles" / role / "defaults/main.yml").read_text())
    return doc if isinstance(doc, dict) else {}


def role_default(role: str, name: str):
    """One default of a role; a KeyError names a default that is not there (tests hold each one)."""
    return role_defaults(role)[name]
