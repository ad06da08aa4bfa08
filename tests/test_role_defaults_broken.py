"""A role's defaults that p2pkit reads (core/role_defaults.py) missing, unparsable, not a mapping or without
the value asked for: a broken installation, refused with the file and what to do (exit 1, one paragraph),
never a traceback or an internal error."""

import shutil
import subprocess
import sys

import pytest

from p2pkit.core import role_defaults as rd
from p2pkit.core.errors import P2pkitError
from tests.conftest import REPO


@pytest.fixture
def share(tmp_path, monkeypatch):
    """A copy of the roles' defaults under a share directory of its own."""
    roles = tmp_path / rd.COLLECTION / "roles"
    for d in (REPO / rd.COLLECTION / "roles").iterdir():
        if (d / "defaults/main.yml").is_file():
            (roles / d.name / "defaults").mkdir(parents=True)
            shutil.copy(d / "defaults/main.yml", roles / d.name / "defaults/main.yml")
    monkeypatch.setattr(rd, "share_dir", lambda: tmp_path)
    rd.role_defaults.cache_clear()
    yield roles
    rd.role_defaults.cache_clear()


@pytest.mark.parametrize("breakage, said", [
    ("missing", "cannot read it"),
    ("not yaml", "it is not YAML"),
    ("a list", "it is not a mapping of defaults"),
    ("no such key", "it has no p2pkit_engine_commit_pattern"),
])
def test_a_broken_role_default_is_refused_naming_the_file_and_the_fix(share, breakage, said):
    f = share / "p2pkit_engine/defaults/main.yml"
    if breakage == "missing":
        f.unlink()
    elif breakage == "not yaml":
        f.write_text("p2pkit_engine_commit_pattern: [unclosed\n")
    elif breakage == "a list":
        f.write_text("- a\n- b\n")
    else:
        f.write_text("p2pkit_engine_build_subdir: build\n")
    with pytest.raises(P2pkitError) as e:
        rd.role_default("p2pkit_engine", "p2pkit_engine_commit_pattern")
    assert said in e.value.message and str(f) in e.value.message, e.value.message
    assert "reinstall p2pkit" in e.value.hint
    assert "\n" not in e.value.message


def test_the_cli_says_it_as_an_error_not_an_internal_one(tmp_path):
    """Through `p2pkit profile show` (every profile read asks the fork's commit pattern): exit 1, the
    paragraph, no traceback."""
    code = ("import sys; from p2pkit.core import role_defaults as rd; from pathlib import Path; "
            f"rd.share_dir = lambda: Path({str(tmp_path)!r}); "
            "from p2pkit.cli.main import main; sys.argv = ['p2pkit', 'profile', 'show']; sys.exit(main())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert "role states from" in r.stderr and "cannot read it" in r.stderr, r.stderr


def test_an_engine_unit_name_that_is_a_path_is_refused_as_a_broken_installation(share):
    """p2pkit reads the engine unit's name from the service role's defaults and writes, reads and removes
    /etc/systemd/system/NAME: a name holding a / is a broken installation, never a path p2pkit acts on."""
    from p2pkit.host import system

    f = share / "p2pkit_service/defaults/main.yml"
    f.write_text(f.read_text().replace("p2pkit_service_unit: p2pkit-engine.service",
                                       "p2pkit_service_unit: ../../cron.d/p2pkit.service"))
    with pytest.raises(P2pkitError) as e:
        _ = system.ENGINE_UNIT_FILE
    assert "its p2pkit_service_unit holds the character '/'" in e.value.message and str(f) in e.value.message
    assert "reinstall p2pkit" in e.value.hint
