"""The service role and p2pkit write the engine's files with one writer per format (issue 39 item 3):
p2pkit/core/unitenv.py imports nothing but the standard library and is the file the p2pkit.host
collection's filter plugins import (plugins/module_utils/unitenv.py, a relative symlink to it); what the
role and p2pkit both state (the unit's name, the environment files, the engine's user) is the role's
defaults/main.yml, which p2pkit reads when first asked, never at the import of what doctor imports; a
value the files cannot hold is refused by the role before it writes anything, as p2pkit refuses it
before a playbook runs."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from p2pkit.core import config, unitenv, writers
from p2pkit.host import Host, system
from p2pkit.sim import lifecycle
from p2pkit.stages.service import act as svc
from tests.conftest import REPO

COLLECTION = REPO / "playbooks/collections/ansible_collections/p2pkit/host"
ROLE = COLLECTION / "roles/p2pkit_service"


def test_what_python_and_the_role_both_state_is_the_roles_default():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert defaults["p2pkit_service_unit"] == system.ENGINE_UNIT
    assert defaults["p2pkit_service_env_file"] == system.ENGINE_ENV_FILE
    assert defaults["p2pkit_service_secrets_file"] == system.ENGINE_SECRETS_FILE
    assert defaults["p2pkit_service_user"] == system.ENGINE_USER
    assert (f"/etc/systemd/system/{defaults['p2pkit_service_unit']}",
                                   "/etc/systemd/system/p2pkit.slice", defaults["p2pkit_service_env_file"],
                                   defaults["p2pkit_service_secrets_file"]) == system.ENGINE_FILES
    with pytest.raises(AttributeError):
        _ = system.ENGINE_NOTHING
    # stated once: no Python module of p2pkit spells them out again
    for f in (REPO / "p2pkit").rglob("*.py"):
        if "sim" in f.relative_to(REPO / "p2pkit").parts:
            continue
        # (the launcher's cgroup is named p2pkit-engine too: another thing, its own name)
        text = "\n".join(ln for ln in f.read_text().splitlines() if not ln.startswith("CGROUP_NAME = "))
        for value in ('"/etc/p2pkit/engine.env"', '"/etc/p2pkit/engine.secrets.env"', '"p2pkit-engine.service"',
                      '"p2pkit-engine"'):
            assert value not in text, (f, value)


def test_doctors_modules_read_no_yaml_at_import():
    code = ("import sys; import p2pkit.cli.main, p2pkit.app.doctor, p2pkit.host.system, p2pkit.facts.probes; "
            "from p2pkit.core import role_defaults as rd; "
            "print(int('yaml' in sys.modules), rd.role_defaults.cache_info().currsize)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert r.stdout.split() == ["0", "0"], r.stdout + r.stderr


def test_unitenv_imports_only_the_standard_library_and_the_collection_links_to_it():
    tree = ast.parse((REPO / "p2pkit/core/unitenv.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
    link = COLLECTION / "plugins/module_utils/unitenv.py"
    assert link.is_symlink() and not os.readlink(link).startswith("/"), "a relative symlink"
    assert link.resolve() == (REPO / "p2pkit/core/unitenv.py").resolve()
    # the filter plugin imports it from the collection, and p2pkit's writers and flag words are its functions
    plugin = (COLLECTION / "plugins/filter/unitenv.py").read_text()
    assert "from ansible_collections.p2pkit.host.plugins.module_utils import unitenv" in plugin
    from p2pkit.rules.engines import flags

    assert flags.words is unitenv.words and writers.unit_exec.__wrapped__ is unitenv.unit_exec
    assert writers.env_file.__wrapped__ is unitenv.env_file


def test_a_refusal_keeps_p2pkits_message_and_exit_code():
    with pytest.raises(writers.UnsafeValue) as e:
        writers.env_line("X", "a\nb", "serve.env.X")
    assert e.value.message == "serve.env.X holds a newline (\\n), which cannot be written into an environment file"
    assert e.value.hint == "remove it from serve.env.X" and e.value.code == 2
    with pytest.raises(unitenv.Refused) as r:
        unitenv.env_line("1X", "v")
    assert r.value.message == "1X: '1X' is not an environment variable name"
    with pytest.raises(unitenv.Refused):  # a regex's `$` matches before a final newline: the name is checked to its end
        unitenv.env_line("X\n", "v")


@pytest.mark.parametrize("user,said", [
    ("p2pkit-engine", None), ("_eng_2", None), ("a" * 31, None),
    ("", "is empty"),
    ("a" * 32, "is 32 characters long, more than a user name may be"),
    ("2eng", "starts with the character '2', which a user name cannot start with"),
    ("-eng", "starts with the character '-', which a user name cannot start with"),
    ("eng%i", "holds the character '%', which a user name cannot hold"),
    ("eng\n", "holds a newline (\\n), which a user name cannot hold"),
    ("root\nExecStartPre=/bin/sh", "holds a newline (\\n), which a user name cannot hold"),
    ("Eng", "holds the character 'E', which a user name cannot hold"),
    ("eng$", "holds the character '$', which a user name cannot hold"),
    ("a:b", "holds the character ':', which a user name cannot hold"),
    ("a b", "holds the character ' ', which a user name cannot hold"),
])
def test_a_user_name_is_one_systemd_and_useradd_both_take_as_it_is(user, said):
    """User= and Group= expand specifiers and end at a newline; the name is also useradd's argument."""
    if said is None:
        assert unitenv.unit_user("the user", user) == user
        return
    with pytest.raises(unitenv.Refused) as e:
        unitenv.unit_user("p2pkit_service_user", user)
    assert e.value.message == f"p2pkit_service_user {said}"
    assert e.value.hint == ("give p2pkit_service_user a user name: lowercase letters, digits, _ and -, starting with "
                            "a letter or _, at most 31 characters, like p2pkit-engine")


@pytest.mark.parametrize("unit,said", [
    ("p2pkit-engine.service", None), ("engine@gpu0.service", None), ("a:b_c.d-e\\x2d.service", None),
    ("../x.service", "holds the character '/', which a unit name cannot hold"),
    ("p2pkit-engine.timer", "is not NAME.service"), (".service", "is not NAME.service"),
    ("a@b@c.service", "is not NAME.service"), ("eng%i.service", "holds the character '%'"),
    ("x\n.service", "holds a newline"), ("a" * 248 + ".service", "is longer than 255 bytes"),
    ("-Hroot@10.0.0.5:x.service", "starts with '-', which systemctl reads as an option"),
    ("x@.service", "is not NAME.service"),
])
def test_a_unit_name_is_one_file_under_etc_systemd_system(unit, said):
    if said is None:
        assert unitenv.unit_name("the unit", unit) == unit
        return
    with pytest.raises(unitenv.Refused) as e:
        unitenv.unit_name("p2pkit_service_unit", unit)
    assert e.value.message.startswith(f"p2pkit_service_unit {said}"), e.value.message


def test_the_filters_write_what_p2pkits_writers_write():
    """The filter plugin loaded as Ansible loads it (from the collection on its path), over the same values."""
    code = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.p2pkit.host.plugins.filter.unitenv import FilterModule
f = FilterModule().filters()
out = {"exec": f["unit_exec"](["/opt/e/serve", "a b", "100%", "$HOME"] + f["flag_words"](
           {"tp": 2, "vision": True, "quiet": False, "x": None, "name": 'q"x'})),
       "env": f["env_file"]({"A": "1", "B": 'x"$`y'}, "h"), "ip": f["ip_filter"]("127.0.0.1", "head", "10.0.0.0/24"),
       "value": f["unit_value"]("50%", "w"), "path": f["unit_path"]("/var/lib/p2pkit/engine", "w"),
       "user": f["unit_user"]("p2pkit-engine", "w"), "unit": f["unit_name"]("p2pkit-engine.service", "w")}
from ansible.errors import AnsibleFilterError
try:
    f["unit_exec"](["/opt/e/serve", "a\\nb"], "the command line of the engine")
except Exception as e:
    out["refused"] = [isinstance(e, AnsibleFilterError), str(e)]
try:
    f["unit_user"]("eng%i", "p2pkit_service_user")
except Exception as e:
    out["user_refused"] = [isinstance(e, AnsibleFilterError), str(e)]
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code, str(REPO / "playbooks/collections")], capture_output=True,
                       text=True, check=True)
    got = json.loads(r.stdout)
    argv = ["/opt/e/serve", "a b", "100%", "$HOME", "--tp", "2", "--vision", "--name", 'q"x']
    assert got["exec"] == writers.unit_exec(argv) == svc.exec_start(argv)
    assert got["env"] == writers.env_file({"A": "1", "B": 'x"$`y'}, "h")
    assert got["ip"] == ["any", "localhost 10.0.0.0/24"]
    assert got["value"] == "50%%" and got["path"] == "/var/lib/p2pkit/engine" and got["user"] == "p2pkit-engine"
    assert got["unit"] == "p2pkit-engine.service"
    assert got["refused"] == [True, "the command line of the engine holds a newline (\\n), which "
                              "cannot be written into a systemd unit (remove it from the command line of the engine)"]
    with pytest.raises(unitenv.Refused) as e:
        unitenv.unit_user("p2pkit_service_user", "eng%i")
    assert got["user_refused"] == [True, f"{e.value.message} ({e.value.hint})"]


@pytest.mark.parametrize("key,value,said", [
    ("p2pkit_service_flags", {"model-id": "a\nExecStartPre=/bin/evil"},
     "the command line of the engine holds a newline (\\n), which cannot be written into a systemd unit"),
    ("p2pkit_service_env", {"1BAD": "x"}, "p2pkit_service_env.1BAD: '1BAD' is not an environment variable name"),
    ("p2pkit_service_secrets", {"HF_TOKEN": "s3cret\u2028X=1"},
     "p2pkit_service_secrets.HF_TOKEN holds U+2028 LINE SEPARATOR (a line break), which cannot be written into an "
     "environment file"),
    ("p2pkit_service_env", {"NCCL_DEBUG\n": "INFO"}, "'NCCL_DEBUG\\n' is not an environment variable name"),
    # the unit's own text and its user, given by hand from an inventory (p2pkit bounds them before a playbook runs)
    ("p2pkit_service_recipe", 'ninfer\nExecStartPre=/bin/sh -c "id >/tmp/p"\n[Service]',
     "p2pkit_service_recipe holds a newline (\\n), which cannot be written into a systemd unit "
     "(remove it from p2pkit_service_recipe)"),
    ("p2pkit_service_profile", "prod\u2028[Service]",
     "p2pkit_service_profile holds U+2028 LINE SEPARATOR (a line break), which cannot be written into a systemd unit"),
    ("p2pkit_service_user", 'root\nExecStartPre=/bin/sh -c "id >/tmp/p"',
     "p2pkit_service_user holds a newline (\\n), which a user name cannot hold (give p2pkit_service_user a user "
     "name: lowercase letters, digits, _ and -, starting with a letter or _, at most 31 characters, like "
     "p2pkit-engine)"),
    ("p2pkit_service_user", "eng%i", "p2pkit_service_user holds the character '%', which a user name cannot hold"),
    # the unit's name is a file under /etc/systemd/system, never a path out of it
    ("p2pkit_service_unit", "../../cron.d/p2pkit.service",
     "p2pkit_service_unit holds the character '/', which a unit name cannot hold"),
    ("p2pkit_service_groups", ["video", "render\nExecStartPre=/bin/evil"],
     "p2pkit_service_groups holds a newline (\\n), which a user name cannot hold"),
    ("p2pkit_service_profile", "lab\\", "p2pkit_service_profile ends with a backslash"),
    # a string where a list belongs (-e p2pkit_service_groups=video) is never read letter by letter
    ("p2pkit_service_groups", "video", "p2pkit_service_groups must be a list of group names"),
])
@pytest.mark.slow
def test_the_role_alone_refuses_a_value_the_files_cannot_hold_before_it_writes_anything(sim, tmp_path, key, value,
                                                                                           said):
    from tests.test_roles import playbook, profile_vars, service_vars_by_hand, write_inventory

    root = sim("healthy")
    given = {**profile_vars(root), **service_vars_by_hand(root)}
    given[key] = {**given.get(key, {}), **value} if isinstance(value, dict) else value
    before = files_of(root)
    r, recap = playbook("service.yml", write_inventory(tmp_path / "hosts.yml", given), tmp_path)
    assert r.returncode != 0 and recap["failed"] == 1 and recap["changed"] == 0, r.stdout[-3000:]
    assert said in r.stdout, r.stdout[-3000:]
    assert "s3cret" not in r.stdout
    # refused by the task that writes the values down, before the user's or any file's task ran
    tasks = re.findall(r"^TASK \[(?:\S+ : )?(.+?)\]", r.stdout, re.M)
    assert tasks[-1].startswith(("Ensure the profile's values can be written", "Ensure p2pkit_service_groups is")) or \
        tasks[-1] == "Ensure the secrets can be written into the secrets file", tasks
    assert files_of(root) == before  # nothing written (no file's content either), no user made


def files_of(root: Path) -> dict[str, str]:
    """Every file under the host's root, by its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.mark.slow
def test_the_role_alone_escapes_a_specifier_in_the_units_text_and_runs_the_user_it_was_given(sim, tmp_path):
    """A `%` in the recipe and the profile's name is written `%%` (systemd expands specifiers in Description=
    and reads comments as they are), a user name as it is; the real systemd-analyze verifies the unit."""
    from tests.test_roles import playbook, profile_vars, service_vars_by_hand, write_inventory

    root = sim("healthy")
    lifecycle.place_engine(root, config.load(Host.at(root).sim["profile"]))  # the engine stage's binary
    given = {**profile_vars(root), **service_vars_by_hand(root), "p2pkit_service_recipe": "ninfer-50%",
             "p2pkit_service_profile": "100%n prod", "p2pkit_service_user": "eng_2", "p2pkit_service_groups": ["video"]}
    r, recap = playbook("service.yml", write_inventory(tmp_path / "hosts.yml", given), tmp_path)
    assert r.returncode == 0 and recap["failed"] == 0, r.stdout[-3000:]
    unit = (root / "etc/systemd/system" / system.ENGINE_UNIT).read_text()
    assert unit.startswith("# Written by p2pkit's service stage: the ninfer-50%% engine as a system service")
    assert "\nDescription=p2pkit: ninfer-50%% inference engine (100%%n prod)\n" in unit
    assert "\nUser=eng_2\nGroup=eng_2\nSupplementaryGroups=video\n" in unit  # the groups it was given
    assert "eng_2:" in (root / "etc/passwd").read_text()
    verified = svc.analyze(Host.at(root))
    assert verified["verify_rc"] == 0 and verified["verify_issues"] == [], verified


@pytest.mark.slow
def test_the_collection_tarball_holds_the_writer_as_a_file(tmp_path):
    """`ansible-galaxy collection build` copies the symlinked module_utils file in as a regular file, so an
    installed collection runs without p2pkit's tree."""
    exe = Path(sys.executable).parent / "ansible-galaxy"
    env = {**os.environ, "ANSIBLE_HOME": str(tmp_path / ".ansible"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t")}
    r = subprocess.run([str(exe), "collection", "build", str(COLLECTION), "--output-path", str(tmp_path)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (tarball,) = tmp_path.glob("p2pkit-host-*.tar.gz")
    with tarfile.open(tarball) as t:
        m = t.getmember("plugins/module_utils/unitenv.py")
        assert m.isfile()
        assert t.extractfile(m).read() == (REPO / "p2pkit/core/unitenv.py").read_bytes()
        assert t.getmember("plugins/filter/unitenv.py").isfile()
