"""The roles own their contract (issue 39 item 3): each role's meta/argument_specs.yml names every
variable p2pkit hands it, and nothing p2pkit does not hand it unless defaults/main.yml gives it a
value. What p2pkit hands a role is read from a simulated `p2pkit up --reboot` (the vars each stage's
playbook was given, <state>/logs/<stage>.vars.json), on a host with systemd and on one without (the
launcher's path hands the service role its manager). A value a role's spec does not allow stops the
role at its first task (Ansible's argument validation) naming the variable and the allowed values,
and p2pkit carries that message as its own one-paragraph error."""

import json
import re
from pathlib import Path

import pytest
import yaml

from p2pkit.core.ansible import COLLECTION, PlaybookFailed, run_playbook
from p2pkit.sim import lifecycle
from p2pkit.stages.service import act as svc
from tests.conftest import REPO, make_sim, p2pkit_proc
from tests.test_roles import ctx_for, playbook, profile_vars, write_inventory

ROLES = REPO / "playbooks/collections/ansible_collections/p2pkit/host/roles"
# each role and the stage playbook that runs it
STAGES = {"p2pkit_driver": "driver", "p2pkit_p2p_module": "p2p-module", "p2pkit_engine": "engine",
          "p2pkit_service": "service"}
# the variables every role may read, not of one role's prefix (p2pkit/core/ansible.py base_vars, the
# host's architecture); their defaults are in the p2pkit_common role
SHARED = ("p2pkit_root", "p2pkit_state_dir", "p2pkit_path", "p2pkit_arch")


def spec_options(role: str) -> dict:
    doc = yaml.safe_load((ROLES / role / "meta/argument_specs.yml").read_text())
    return doc["argument_specs"]["main"]["options"]


def defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults/main.yml").read_text()) or {}


def shared_defaults() -> dict:
    return yaml.safe_load((REPO / COLLECTION / "roles/p2pkit_common/defaults/main.yml").read_text())


def shared_read(role: str) -> set[str]:
    """The shared variables the role's own files (tasks, templates, defaults, vars) mention."""
    text = "\n".join(p.read_text() for p in (ROLES / role).rglob("*")
                     if p.is_file() and "meta" not in p.parts)
    return {name for name in SHARED if re.search(rf"\b{name}\b", text)}


def contract_gaps(role: str, handed: set[str], options: dict) -> list[str]:
    """Where the role's argument_specs and what p2pkit hands it differ, one line each; [] when they agree."""
    prefix = role + "_"
    own = {k for k in handed if k.startswith(prefix)}
    gaps = [f"{k}: p2pkit hands it to {role}, its argument_specs do not name it" for k in sorted(own - set(options))]
    given = {**defaults(role), **shared_defaults()}
    for k in sorted(set(options) - handed):
        if k not in given:
            gaps.append(f"{k}: in {role}'s argument_specs, but p2pkit hands it no value and no default gives one")
    for k, spec in sorted(options.items()):
        if spec.get("required") and k not in handed:
            gaps.append(f"{k}: required by {role}'s argument_specs, but p2pkit does not hand it over")
        if spec.get("required") and k in given:
            gaps.append(f"{k}: required by {role}'s argument_specs, yet defaults/main.yml gives it a value")
        if not k.startswith(prefix) and k not in SHARED:
            gaps.append(f"{k}: in {role}'s argument_specs, neither the role's own nor a shared variable")
    reads = shared_read(role)
    gaps += [f"{k}: {role} reads it and p2pkit hands it over, its argument_specs do not name it"
             for k in sorted((reads & handed) - set(options))]
    gaps += [f"{k}: in {role}'s argument_specs, but the role never reads it"
             for k in sorted(set(options) & set(SHARED) - reads)]
    return gaps


@pytest.fixture(scope="module")
def handed(tmp_path_factory) -> dict[str, set[str]]:
    """Per role, every variable a simulated `p2pkit up --reboot` handed its playbook, on a host with
    systemd (healthy) and one without (no-systemd: the service role through p2pkit's launcher)."""
    seen: dict[str, set[str]] = {role: set() for role in STAGES}
    for scenario in ("healthy", "no-systemd"):
        root = make_sim(tmp_path_factory.mktemp("contract") / scenario, scenario)
        try:
            r = p2pkit_proc("--root", str(root), "up", "--reboot")
            assert r.returncode == 0, r.stderr[-3000:]
        finally:
            lifecycle.stop_services(root)
        logs = root / "var/lib/p2pkit/logs"
        for role, stage in STAGES.items():
            seen[role] |= set(json.loads((logs / f"{stage}.vars.json").read_text()))
    assert "p2pkit_service_manager" in seen["p2pkit_service"]  # the launcher's path was taken
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("role", sorted(STAGES))
def test_each_roles_argument_specs_name_exactly_what_p2pkit_hands_it(handed, role):
    options = spec_options(role)
    assert contract_gaps(role, handed[role], options) == []
    own = {k for k in handed[role] if k.startswith(role + "_")}
    assert own and own <= set(options)
    for name, spec in options.items():  # each with a type and a one-line description
        assert spec.get("type") in ("str", "int", "bool", "list", "dict", "path"), name
        assert spec.get("type") != "list" or spec.get("elements"), name
        assert isinstance(spec.get("description"), str) and "\n" not in spec["description"], name
        assert "default" not in spec, f"{name}: defaults live in defaults/main.yml only"


@pytest.mark.parametrize("role", sorted(STAGES))
def test_required_options_are_the_ones_the_role_cannot_run_without(role):
    """engine and service list them in vars/main.yml; driver and p2p-module name them in defaults/main.yml's
    comment (no default there), and each has its own assert task for an empty or malformed value."""
    required = {k for k, spec in spec_options(role).items() if spec.get("required")}
    listed = ROLES / role / "vars/main.yml"
    if listed.is_file():
        assert required == set(yaml.safe_load(listed.read_text())[f"{role}_required"])
    else:
        comment = (ROLES / role / "defaults/main.yml").read_text()
        assert required and required == set(re.findall(rf"^#\s+({role}_\w+)\s", comment, re.M))
    assert not required & set(defaults(role))


def test_the_guard_sees_an_option_missing_and_one_too_many():
    """The same function, over a spec with one option removed and one added: both differences named."""
    role = "p2pkit_service"
    options = spec_options(role)
    handed = set(options) - set(defaults(role)) | {"p2pkit_path", "ansible_python_interpreter"}
    assert contract_gaps(role, handed, options) == []
    fewer = {k: v for k, v in options.items() if k != "p2pkit_service_command"}
    assert contract_gaps(role, handed, fewer) == [
        "p2pkit_service_command: p2pkit hands it to p2pkit_service, its argument_specs do not name it"]
    more = {**options, "p2pkit_service_nice": {"type": "int", "description": "x"}}
    assert contract_gaps(role, handed, more) == [
        "p2pkit_service_nice: in p2pkit_service's argument_specs, but p2pkit hands it no value and no default "
        "gives one"]
    no_root = {k: v for k, v in options.items() if k != "p2pkit_root"}
    assert contract_gaps(role, handed | {"p2pkit_root"}, no_root) == [
        "p2pkit_root: p2pkit_service reads it and p2pkit hands it over, its argument_specs do not name it"]


# one value each role's spec does not allow, and the values it does
BAD = {
    "driver.yml": ("p2pkit_arch", "riscv64", ", x86_64, aarch64"),
    "p2p-module.yml": ("p2pkit_p2p_module_bootloader", "lilo", "grub, systemd-boot, kernelstub, unknown"),
    "engine.yml": ("p2pkit_engine_recipe", "tgi", "ninfer, llamacpp, vllm"),
    "service.yml": ("p2pkit_service_manager", "upstart", "systemd, launcher"),
}


@pytest.mark.slow
@pytest.mark.parametrize("book", sorted(BAD))
def test_a_value_the_spec_does_not_allow_stops_the_role_at_its_first_task_naming_it(sim, tmp_path, book):
    root = sim("healthy")
    prof = ctx_for(root).profile
    name, value, allowed = BAD[book]
    hostvars = {**profile_vars(root), **svc.service_vars(ctx_for(root)), "p2pkit_engine_recipe": prof.engine.recipe,
                "p2pkit_engine_build_dir": prof.engine.build_dir, name: value}
    before = sorted(str(p) for p in root.rglob("*"))
    r, recap = playbook(book, write_inventory(tmp_path / "hosts.yml", hostvars), tmp_path)
    assert r.returncode != 0 and recap["failed"] == 1 and recap["ok"] == 0, r.stdout[-3000:]
    tasks = re.findall(r"^TASK \[\S+ : (.+?)\]", r.stdout, re.M)
    assert len(tasks) == 1 and tasks[0].startswith("Validating arguments against arg spec 'main'"), tasks
    assert f"value of {name} must be one of: {allowed}, got: {value}" in r.stdout
    assert sorted(str(p) for p in root.rglob("*")) == before  # nothing was written


@pytest.mark.slow
def test_p2pkit_carries_the_roles_refusal_as_its_own_one_paragraph_error(sim):
    """Through p2pkit's own playbook run (run_playbook, as each stage's act calls it). No value typed
    by a user reaches a role unchecked: p2pkit's profile validation refuses each one the specs restrict
    first (test_the_profile_refuses_what_a_role_would_refuse), so the bad value is handed over here
    as a stage would hand it."""
    root = sim("healthy")
    ctx = ctx_for(root)
    with pytest.raises(PlaybookFailed) as e:
        run_playbook(ctx, "service", {**svc.service_vars(ctx), "p2pkit_service_manager": "upstart"})
    msg = e.value.message
    assert "\n" not in msg and "\n" not in e.value.hint, msg  # one paragraph
    assert msg.startswith("the service playbook failed: task 'p2pkit.host.p2pkit_service : Validating arguments "
                          "against arg spec 'main'"), msg
    assert msg.endswith("the p2pkit_service role refuses its variables (playbooks/collections/ansible_collections/"
                        "p2pkit/host/roles/p2pkit_service/meta/argument_specs.yml): value of "
                        "p2pkit_service_manager must be one of: systemd, launcher, got: upstart"), msg
    assert "nothing on the host was changed" in e.value.hint and "service.log" in e.value.hint
    assert not (root / "etc/p2pkit").exists()


@pytest.mark.parametrize("key,value,expect", [
    ("serve.manager", "upstart", "expected one of auto, systemd, launcher"),
    ("engine.recipe", "tgi", "expected one of ninfer, llamacpp, vllm"),
])
def test_the_profile_refuses_what_a_role_would_refuse(cli, sim, key, value, expect):
    """The values a role's spec restricts to a set come from the profile (engine.recipe, serve.manager)
    or from the host (the architecture, the bootloader): `--set` with one the role would refuse is
    refused by p2pkit itself, exit 2, before any playbook runs."""
    root = sim("healthy")
    r = cli("--root", str(root), "--set", f"{key}={value}", "up")
    assert r.code == 2 and f'{key}: {expect}, got "{value}"' in r.err, r.err
    assert not (root / "var/lib/p2pkit/logs").exists() or not list(Path(root / "var/lib/p2pkit/logs").glob("*.log"))
