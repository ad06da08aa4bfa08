"""Where p2pkit's playbooks and roles are, and what a role and p2pkit both state, stated once: in
the role's defaults/main.yml, which p2pkit reads here (the driver's guarded package names and guard
files, the fork commit's pattern). Read lazily and once per process, never at import: `p2pkit
doctor` imports the modules that use it and must not pay for YAML it does not need."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from p2pkit.core.errors import P2pkitError

COLLECTION = "playbooks/collections/ansible_collections/p2pkit/host"  # the roles and modules: collection p2pkit.host


def share_dir() -> Path:
    """playbooks/, templates/, systemd/: inside the wheel, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent  # p2pkit/
    installed = package / "_share"
    return installed if (installed / "playbooks").is_dir() else package.parent


def broken(role: str, why: str) -> P2pkitError:
    path = share_dir() / COLLECTION / "roles" / role / "defaults/main.yml"
    return P2pkitError(f"p2pkit reads what its {role} role states from {path}, and {why}: nothing was done",
                       hint="put that file back as p2pkit ships it (reinstall p2pkit, or `git checkout` it in a "
                            "source checkout), then run the command again")


@cache
def role_defaults(role: str) -> dict:
    """The role's defaults/main.yml (role: p2pkit_driver, p2pkit_p2p_module, ...), parsed once; a missing,
    unreadable or unparsable file is refused with what to do (the roles ship with p2pkit: a broken one
    is an edited installation, never a traceback)."""
    import yaml  # ansible-core's own dependency (PyYAML)

    # libyaml's parser where PyYAML was built with it (its wheels are): the same safe types as safe_load, a
    # fifteenth of the time (doctor reads four roles' defaults: 15.8 ms against 1.1 ms here)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load((share_dir() / COLLECTION / "roles" / role / "defaults/main.yml").read_text(),
                        Loader=loader)  # a safe loader: SafeLoader or libyaml's CSafeLoader
    except OSError as e:
        raise broken(role, f"cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise broken(role, f"it is not YAML ({' '.join(str(e).split())[:200]})") from None
    if not isinstance(doc, dict):
        raise broken(role, "it is not a mapping of defaults")
    return doc


def role_default(role: str, name: str):
    """One default of a role; one that is not there is refused as a broken installation."""
    doc = role_defaults(role)
    if name not in doc:
        raise broken(role, f"it has no {name}")
    return doc[name]
