"""What a role and p2pkit both state lives in the role's defaults/main.yml, and p2pkit reads it there
(issue 39 item 3): the driver's guarded package names and guard files, the fork commit's pattern.
Each value p2pkit uses equals the role's default; none is read at import."""

import re
import subprocess
import sys

import pytest
import yaml

from p2pkit.core import config
from p2pkit.core.errors import ProfileError
from p2pkit.core.role_defaults import COLLECTION, share_dir
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.driver import checks as driver_checks

ROLES = share_dir() / COLLECTION / "roles"


def default(role: str, name: str):
    return yaml.safe_load((ROLES / role / "defaults/main.yml").read_text())[name]


def test_guarded_packages_are_the_driver_roles():
    want = default("p2pkit_driver", "p2pkit_driver_guarded_packages")
    assert driver_checks.GUARDED_PACKAGES == driver_checks.guarded_packages() == tuple(want)
    assert "nvidia-" in want and "libnvidia-" in want
    # the holds check judges by them: a guarded package unheld fails, another package is not counted
    c = driver_checks.holds({"installed": ["libnvidia-compute-580", "zlib1g"], "held": []})
    assert c.status == "fail" and "libnvidia-compute-580" in str(c) and "1 of 1 without an apt hold" in str(c)


def test_guard_files_are_the_driver_roles(tmp_path):
    from p2pkit.facts import probes
    from p2pkit.host import Host

    files = default("p2pkit_driver", "p2pkit_driver_guard_files")
    assert files == {"nouveau_blacklist": "/etc/modprobe.d/p2pkit-blacklist-nouveau.conf",
                     "apt_pin": "/etc/apt/preferences.d/p2pkit-nvidia",
                     "unattended_upgrades": "/etc/apt/apt.conf.d/51p2pkit-unattended-upgrades"}
    assert driver_act.guard_files() == list(files.values())  # what the driver stage backs up
    # the guard facts read the same paths: each file, as the role's template writes it, counts
    root = tmp_path / "root"
    for path, text in ((files["nouveau_blacklist"], "blacklist nouveau\n"), (files["apt_pin"], "Pin-Priority: -1\n"),
                       (files["unattended_upgrades"], "Unattended-Upgrade::Package-Blacklist {\n};\n")):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_text(text)
    assert probes._guards(Host.at(root)) == {"nouveau_blacklisted": True, "apt_pin": True,
                                             "unattended_upgrades_blacklist": True}
    (root / files["apt_pin"].lstrip("/")).unlink()
    assert probes._guards(Host.at(root))["apt_pin"] is False


def test_the_fork_commit_pattern_is_the_p2p_module_roles():
    """One statement: 40 hex digits (the profile's rule; the role's assert said 7 to 40). A prefix is no pin."""
    body = default("p2pkit_p2p_module", "p2pkit_p2p_module_commit_pattern")
    assert body == "[0-9a-f]{40}"
    assert config.fork_commit_pattern() == f"^({body})?$"
    meta = next(f.metadata for f in config.fields(config.P2pModule) if f.name == "commit")
    assert config.pattern_of(meta) == config.fork_commit_pattern()
    main = (ROLES / "p2pkit_p2p_module/tasks/main.yml").read_text()
    assert "p2pkit_p2p_module_commit_pattern" in main and "7,40" not in main
    full = "a" * 40
    assert config.load("dual-5090-ninfer", overrides=[f"p2p_module.commit={full}"]).p2p_module.commit == full
    with pytest.raises(ProfileError, match=r'p2p_module.commit: expected a full git commit id \(40 hex digits\)'):
        config.load("dual-5090-ninfer", overrides=["p2p_module.commit=abcdef1"])
    from p2pkit.schemas import profile_schema

    schema = profile_schema()
    assert re.search(re.escape(config.fork_commit_pattern()), str(schema))


def test_the_engine_commit_pattern_is_the_engine_roles():
    """engine.commit the same way: the engine role's default, read by its checkout assert and the profile."""
    body = default("p2pkit_engine", "p2pkit_engine_commit_pattern")
    assert body == default("p2pkit_p2p_module", "p2pkit_p2p_module_commit_pattern")
    meta = next(f.metadata for f in config.fields(config.Engine) if f.name == "commit")
    assert config.pattern_of(meta) == config.engine_commit_pattern() == f"^({body})?$"
    checkout = (ROLES / "p2pkit_engine/tasks/checkout.yml").read_text()
    assert "p2pkit_engine_commit_pattern" in checkout and "7,40" not in checkout
    with pytest.raises(ProfileError, match=r'engine.commit: expected a full git commit id \(40 hex digits\)'):
        config.load("dual-5090-ninfer", overrides=["engine.commit=abcdef1"])


def test_the_dpkg_installed_pattern_is_the_common_roles():
    """How dpkg's database says a package is installed, stated once for the three roles that read it and for
    p2pkit (tests/test_dpkg_status.py reads it over real stanzas): the common role's default, read when first
    asked."""
    from p2pkit.stages.engine import common as engine_act

    body = default("p2pkit_common", "p2pkit_dpkg_installed")
    assert engine_act.dpkg_installed_pattern() == body
    assert re.compile(body).groups == 2  # the package and its selection (the driver role skips the held ones)


def test_no_role_default_is_read_at_import():
    """`p2pkit doctor` imports these modules: the roles' defaults are read when a value is first needed."""
    code = ("import p2pkit.core.config, p2pkit.stages.driver.checks, p2pkit.stages.driver.act, "
            "p2pkit.facts.probes, p2pkit.stages.p2p_module.act, p2pkit.cli.main\n"
            "from p2pkit.core.role_defaults import role_defaults\n"
            "print(role_defaults.cache_info().currsize, 'yaml' in __import__('sys').modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "0", out
