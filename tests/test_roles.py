"""The driver and p2p-module roles are complete Ansible roles: run by `ansible-playbook` alone from an
operator's own inventory (no p2pkit) they change a simulated host as `up` does and a second run
changes nothing; a missing required variable stops the role at its first task, naming it; p2pkit
hands them the profile, reads back what each task did, and skips a stage's playbook when the
stage's proof already holds (the artifact gate)."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.ansible import COLLECTION, playbook_binary
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import P2pkitError
from p2pkit.core.output import Output
from p2pkit.host import Host, system
from p2pkit.stages import get as get_stage
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.p2p_module import act as acting
from tests.conftest import REPO

KERNEL = "6.8.0-88-generic"
RECAP = re.compile(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)")


def ctx_for(root: Path, profile=None) -> pipeline.Ctx:
    host = Host.at(root)
    return pipeline.Ctx(profile=profile or config.load(host.sim["profile"]), host=host,
                        store=Store(root / "var/lib/p2pkit"), out=Output())


def engine_vars(prof) -> dict:
    """The engine role's values from the profile (NInfer's recipe: no targets, CMake's options as p2pkit
    gives them)."""
    e = prof.engine
    return {"p2pkit_engine_recipe": e.recipe, "p2pkit_engine_build_dir": e.build_dir, "p2pkit_engine_repo": e.repo,
            "p2pkit_engine_commit": e.commit, "p2pkit_engine_pkg_config_path": e.pkg_config_path,
            "p2pkit_engine_cmake_options": ["-DCMAKE_BUILD_TYPE=Release",
                                            f"-DCMAKE_CUDA_ARCHITECTURES={e.cuda_architectures}"]}


def profile_vars(root: Path) -> dict:
    """What an operator writes in an inventory for this host, from its profile: the profile's own values,
    and where the host's root and tools are (a simulated host: its directory, its stand-ins first)."""
    p = config.load(Host.at(root).sim["profile"])
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "p2pkit_root": str(root),
        "p2pkit_path": f"{root}/usr/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "p2pkit_driver_version": p.driver.version,
        "p2pkit_driver_installer_url": p.driver.installer_url,
        "p2pkit_driver_installer_sha256": p.driver.installer_sha256,
        "p2pkit_p2p_module_repo": p.p2p_module.repo,
        "p2pkit_p2p_module_branch": p.p2p_module.branch,
        "p2pkit_p2p_module_commit": p.p2p_module.commit,
        "p2pkit_p2p_module_registry_dwords": p.p2p_module.registry_dwords,
    }


def service_vars_by_hand(root: Path) -> dict:
    """The service role's values as an operator writes them in an inventory from the profile's TOML (no p2pkit
    function, nothing copied from a p2pkit run): ninfer-serve and the model it loads ([engine] build_dir,
    [model] output), [serve.flags] with [serve]'s host and port, the GPUs in bus order, the address it
    listens on; the working directory where the state directory is on the host (/var/lib/p2pkit)."""
    import tomllib

    doc = tomllib.loads(Path(Host.at(root).sim["profile"]).read_text())
    serve = doc["serve"]
    assert doc["engine"]["recipe"] == "ninfer", "this inventory is written for ninfer"
    return {
        "p2pkit_service_recipe": doc["engine"]["recipe"],
        "p2pkit_service_profile": doc["profile"]["name"],
        "p2pkit_service_command": [f"{doc['engine']['build_dir']}/build/apps/ninfer-serve", doc["model"]["output"]],
        "p2pkit_service_flags": {**serve["flags"], "host": serve["host"], "port": serve["port"]},
        "p2pkit_service_env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"},
        "p2pkit_service_listen_host": serve["host"],
        "p2pkit_service_work_dir": "/var/lib/p2pkit/engine",
    }



def playbook(book: str, inventory: Path, tmp: Path, *extra: str,
             collections: Path | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """ansible-playbook on its own (no p2pkit): the operator's inventory, and either the checkout's playbooks
    with their ansible.cfg, or (collections given) the installed collection's playbook by its name, from a
    directory that holds nothing of p2pkit."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "ANSIBLE_HOME": str(tmp / ".ansible"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible/tmp"), "ANSIBLE_NOCOLOR": "1"}
    if collections is None:
        env["ANSIBLE_CONFIG"] = str(REPO / "playbooks/ansible.cfg")
        target = str(REPO / "playbooks" / book)
    else:
        env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
        target = book
    r = subprocess.run([playbook_binary(), "-i", str(inventory), *extra, target],
                       capture_output=True, text=True, env=env, cwd=tmp)
    m = RECAP.search(r.stdout)
    return r, dict(zip(("ok", "changed", "unreachable", "failed", "skipped"), map(int, m.groups()))) if m else {}


def write_inventory(path: Path, hostvars: dict) -> Path:
    path.write_text(yaml.safe_dump({"all": {"hosts": {"sim": hostvars}}}, sort_keys=False))  # flags in their order
    return path


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# files both ways write with the same content (the restore unit and hook carry p2pkit's command line,
# the GRUB drop-in the CPU vendor's switch p2pkit adds: given by p2pkit, not by this inventory)
SAME = ["etc/modprobe.d/p2pkit-blacklist-nouveau.conf", "etc/apt/preferences.d/p2pkit-nvidia",
        "etc/apt/apt.conf.d/51p2pkit-unattended-upgrades", "etc/modprobe.d/p2pkit-nvidia.conf",
        "etc/systemd/system/p2pkit-restore.timer", "etc/apt/apt.conf.d/99p2pkit-restore",
        f"lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko", "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.615.71.09"]


@pytest.mark.slow
def test_each_role_alone_changes_the_host_as_up_does_and_a_second_run_changes_nothing(sim, tmp_path):
    alone, by_p2pkit = sim("healthy", "alone"), sim("healthy", "p2pkit")
    inventory = write_inventory(tmp_path / "hosts.yml", profile_vars(alone))
    for book in ("driver.yml", "p2p-module.yml"):
        r, recap = playbook(book, inventory, tmp_path)
        assert r.returncode == 0 and recap["changed"] > 0 and recap["failed"] == 0, r.stdout[-3000:]
        r, recap = playbook(book, inventory, tmp_path)
        assert r.returncode == 0 and recap["changed"] == 0, r.stdout[-3000:]  # idempotent: changed=0
    ctx = ctx_for(by_p2pkit)
    driver_act.driver(ctx)
    acting.p2p_module(ctx)
    for rel in SAME:
        assert sha(alone / rel) == sha(by_p2pkit / rel), rel
    state = {name: json.loads((root / ".p2pkit-sim/state.json").read_text()) for name, root in
             (("alone", alone), ("p2pkit", by_p2pkit))}
    for key in ("driver", "initramfs_updates"):
        assert state["alone"][key] == state["p2pkit"][key], key
    assert "iommu=pt" in state["alone"]["next_cmdline"]  # update-grub ran on the drop-in
    assert (alone / "etc/systemd/system/timers.target.wants/p2pkit-restore.timer").is_symlink()
    held = subprocess.run([str(alone / "usr/bin/apt-mark"), "showhold"], capture_output=True, text=True).stdout
    assert held.split() == ["nvidia-firmware-580-580.95.05"]
    assert (alone / "var/lib/p2pkit/restore-units.reloaded").is_file()  # under the host's root, never this machine's


@pytest.mark.slow
@pytest.mark.parametrize("book,missing,task", [
    ("driver.yml", "p2pkit_driver_version", "Ensure p2pkit_driver_version is given"),
    ("driver.yml", "p2pkit_driver_installer_sha256", "Ensure p2pkit_driver_installer_sha256 is pinned"),
    ("p2p-module.yml", "p2pkit_p2p_module_commit", "Ensure p2pkit_p2p_module_commit is pinned"),
])
def test_a_role_without_a_required_variable_stops_at_its_first_task_naming_it(sim, tmp_path, book, missing, task):
    """Not given: Ansible's check of the role's meta/argument_specs.yml, the role's first task, names it.
    Given empty: the role's own task for it names it."""
    root = sim("healthy")
    hostvars = profile_vars(root)
    del hostvars[missing]
    before = sorted(str(p) for p in (root / "etc").rglob("*"))
    r, recap = playbook(book, write_inventory(tmp_path / "hosts.yml", hostvars), tmp_path)
    assert r.returncode != 0 and recap["failed"] == 1 and recap["changed"] == 0
    tasks = re.findall(r"^TASK \[(?:\S+ : )?(.+?)\]", r.stdout, re.M)
    assert len(tasks) == 1 and tasks[0].startswith("Validating arguments against arg spec 'main'"), tasks
    assert f"missing required arguments: {missing}" in r.stdout  # its message names the variable
    assert sorted(str(p) for p in (root / "etc").rglob("*")) == before  # nothing was written
    r, recap = playbook(book, write_inventory(tmp_path / "hosts.yml", {**hostvars, missing: ""}), tmp_path)
    assert r.returncode != 0 and recap["failed"] == 1 and recap["changed"] == 0
    tasks = re.findall(r"^TASK \[(?:\S+ : )?(.+?)\]", r.stdout, re.M)
    assert tasks[-1] == task and missing in task, tasks  # the first task that names it, and the last that ran
    failed = r.stdout.rsplit(f" : {task}]", 1)[1]
    assert f"{missing} is" in failed  # its message names the variable
    assert sorted(str(p) for p in (root / "etc").rglob("*")) == before  # nothing was written


@pytest.mark.slow
def test_a_profile_value_the_role_cannot_use_carries_ansibles_message_and_the_fix(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    p = ctx.profile
    ctx.profile = replace(p, p2p_module=replace(p.p2p_module, commit="release-615"))  # not a commit
    with pytest.raises(P2pkitError) as e:
        acting.p2p_module(ctx)
    msg = e.value.message
    assert msg.startswith("the p2p-module playbook failed: task 'p2pkit.host.p2pkit_p2p_module : Ensure "
                          "p2pkit_p2p_module_commit is pinned'"), msg
    assert 'p2pkit_p2p_module_commit is "release-615": pin the fork commit you reviewed' in msg
    assert "p2p-module.log" in e.value.hint
    # through the pipeline: a failed check whose measured value is Ansible's message, never a traceback
    doc = pipeline.run_stage(ctx, get_stage("p2p-module"), "driver")
    act = next(c for c in doc["checks"] if c["id"] == "p2p-module.act")
    assert act["status"] == "fail" and "pin the fork commit you reviewed" in act["measured"]


@pytest.mark.slow
def test_the_roles_put_right_exactly_what_differs_and_say_so_per_task(sim):
    """Each task decides its own work from the host: one thing off, that task changes it (and its
    follow-ups run), every other task reports ok or skipped; then nothing is left to change."""
    root = sim("healthy")
    ctx = ctx_for(root)
    assert driver_act.driver(ctx)["changed"] > 0 and acting.p2p_module(ctx)["changed"] > 0

    def changed(res: dict) -> set[str]:
        return {name for name, c in res["tasks"].items() if c["changed"]}

    pin = root / "etc/apt/preferences.d/p2pkit-nvidia"
    good_pin = pin.read_text()
    pin.write_text(good_pin.replace("Pin-Priority: -1", "Pin-Priority: 1"))
    installer = root / "var/cache/p2pkit" / ctx.profile.driver.installer_url.rsplit("/", 1)[-1]
    installer.chmod(0o644)
    apt_mark = str(root / "usr/bin/apt-mark")  # the real apt-mark on the simulated root's dpkg database
    held = subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split()
    subprocess.run([apt_mark, "unhold", *held], check=True, capture_output=True)
    res = driver_act.driver(ctx)
    assert changed(res) == {"Ensure the installer cache directory, nouveau's blacklist, the apt pin and the "
                            "unattended-upgrades blacklist are in place", "Download the installer and check its "
                            "pinned sha256", "Ensure installed NVIDIA packages are held"}, res["tasks"]
    assert res["tasks"]["Ensure installed NVIDIA packages are held"]["changed"] == len(held)
    assert pin.read_text() == good_pin and installer.stat().st_mode & 0o777 == 0o755
    assert subprocess.run([apt_mark, "showhold"], check=True, capture_output=True, text=True).stdout.split() == held

    lib = root / "usr/lib/x86_64-linux-gnu" / f"libnvidia-ml.so.{ctx.profile.driver.version}"
    lib.unlink()
    res = driver_act.driver(ctx)
    assert changed(res) == {"Ensure the userspace driver is installed without kernel modules"} and lib.is_file()

    grub = root / "etc/default/grub.d/60-p2pkit-iommu.cfg"
    good_grub = grub.read_text()
    grub.write_text("# emptied by hand\n")
    subprocess.run(["systemctl", f"--root={root}", "disable", "p2pkit-restore.timer"], check=True,
                   capture_output=True)
    ko = root / f"lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko"
    good_ko = ko.read_bytes()
    ko.write_bytes(good_ko.replace(b"patched=1", b"patched=0"))
    res = acting.p2p_module(ctx)
    assert changed(res) == {"Ensure the driver parameters, the IOMMU options, the restore units and the hooks are "
                            "in place", "Ensure the restore timer is enabled", "Ensure the built modules are installed",
                            "Ensure depmod's map lists the installed modules", "Ensure the initramfs holds the patched "
                            "module and its parameters", "Ensure grub.cfg carries the IOMMU drop-in's options"}, \
        res["tasks"]
    assert res["tasks"]["Build the modules"] == {"ok": 0, "changed": 0, "failed": 0, "skipped": 1}
    assert res["tasks"]["Ensure systemd has read the restore units"]["skipped"] == 1
    assert grub.read_text() == good_grub and ko.read_bytes() == good_ko
    assert (root / "etc/systemd/system/timers.target.wants/p2pkit-restore.timer").is_symlink()
    assert driver_act.driver(ctx)["changed"] == 0 and acting.p2p_module(ctx)["changed"] == 0


@pytest.mark.slow
def test_the_roles_read_a_package_installed_whatever_fields_dpkg_writes_before_its_status(sim):
    """dpkg writes Essential: and Protected: between a stanza's Package: and Status: lines (Debian 12's bash and
    libgcc-s1, tests/fixtures/dpkg). With a Protected: line there, the guarded NVIDIA package is still held by the
    driver role, and the p2p-module role finds its build dependencies installed (no apt-get)."""
    root = sim("healthy")
    status = root / "var/lib/dpkg/status"

    def protected(*names: str) -> None:  # the simulator writes its stanzas again as the host changes: each time
        text = status.read_text()
        for name in names:
            assert f"Package: {name}\nStatus: install ok installed\n" in text, name
            text = text.replace(f"Package: {name}\n", f"Package: {name}\nProtected: yes\n")
        status.write_text(text)

    protected("nvidia-firmware-580-580.95.05")
    ctx = ctx_for(root)
    res = driver_act.driver(ctx)
    hold = res["tasks"].get("Ensure installed NVIDIA packages are held", {})  # absent: nothing to loop over
    assert hold.get("changed") == 1, res["tasks"]
    held = subprocess.run([str(root / "usr/bin/apt-mark"), "showhold"], capture_output=True, text=True).stdout
    assert held.split() == ["nvidia-firmware-580-580.95.05"]
    protected("build-essential", "git")
    res = acting.p2p_module(ctx)
    assert res["tasks"]["Ensure build dependencies are installed"]["skipped"] == 1, res["tasks"]


@pytest.mark.slow
def test_the_artifact_gate_skips_the_playbook_while_the_proof_holds(cli, sim):
    root = sim("healthy")
    assert cli("--root", str(root), "up", "--to", "driver").code == 0
    store = Store(root / "var/lib/p2pkit")
    log = store.dir / "logs/driver.log"
    first = log.read_text()
    store.delete("driver")  # the artifact gone (a run killed after its act, before its write): the proof decides
    r = cli("--root", str(root), "up", "--to", "driver")
    assert r.code == 0 and "not acting: its proof holds before acting" in r.err, r.err
    doc = store.read("driver")
    assert doc["status"] == "passed" and doc["acted"]["started"] is False
    assert doc["acted"]["why"].startswith("the artifact gate: the stage's proof held before acting")
    assert log.read_text() == first  # no ansible-playbook ran

    # a run killed while acting on the stage: its marker is left, and the role runs again
    store.delete("driver")
    (store.dir / pipeline.RUNNING_FILE).write_text(json.dumps({"stage": "driver", "started": "x"}))
    assert cli("--root", str(root), "up", "--to", "driver").code == 0
    assert "returncode" in store.read("driver")["acted"] and log.read_text() != first

    # the proof fails (the GSP firmware gone): the playbook runs and mends it
    for f in (root / "lib/firmware/nvidia/615.71.09").glob("gsp_*.bin"):
        f.unlink()
    store.delete("driver")
    assert cli("--root", str(root), "up", "--to", "driver").code == 0
    doc = store.read("driver")
    assert doc["acted"]["tasks"]["Ensure the userspace driver is installed without kernel modules"]["changed"] == 1

    # --force acts whatever the proof says
    r = cli("--root", str(root), "up", "--from", "driver", "--to", "driver", "--force")
    assert r.code == 0 and store.read("driver")["acted"]["returncode"] == 0


def load_files_module():
    spec = importlib.util.spec_from_file_location("p2pkit_files", REPO / COLLECTION / "plugins/modules/p2pkit_files.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_files_module_probes_what_the_tasks_decide_from(tmp_path):
    mod = load_files_module()
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot/initrd.img-1").write_text("a")
    (tmp_path / "boot/initrd.img-2").write_text("b")
    os.utime(tmp_path / "boot/initrd.img-2", ns=(5, 5))
    (tmp_path / "status").write_text("Package: a\nStatus: hold ok installed\n\nPackage: b\nStatus: install ok "
                                     "config-files\n\nPackage: c\nStatus: install ok installed\n")
    got = mod.probe(str(tmp_path), {"path": "/boot", "glob": "initrd.img-*"})
    assert [m["path"] for m in got["matches"]] == ["/boot/initrd.img-1", "/boot/initrd.img-2"]
    assert got["matches"][1]["mtime_ns"] == 5 and got["matches"][0]["mode"] == "0644"
    found = mod.probe(str(tmp_path), {"path": "/status", "findall": r"^Package: (\S+)\nStatus: (\S+) ok installed$"})
    assert found["found"] == [["a", "hold"], ["c", "install"]]
    assert mod.probe(str(tmp_path), {"path": "/status", "sha256": True})["sha256"] == sha(tmp_path / "status")
    assert mod.probe(str(tmp_path), {"path": "/nothing"}) == {"path": "/nothing", "exists": False, "mtime_ns": None,
                                                             "mode": None}
    absolute = mod.probe("/no/such/root", {"path": str(tmp_path / "status"), "content": True, "absolute": True})
    assert absolute["content"].startswith("Package: a")
    with pytest.raises(ValueError):
        mod.probe(str(tmp_path), {"path": "relative"})


def test_the_files_module_probes_what_a_path_is_and_where_its_links_lead(tmp_path):
    """type: the path itself, a link not followed (the engine role's checkout and its HEAD); realpath: the
    path on this machine with its links resolved, as `realpath -m` (what CMake is given)."""
    mod = load_files_module()
    (tmp_path / "real/sub").mkdir(parents=True)
    (tmp_path / "real/HEAD").write_text("abc\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "link/HEADLINK").symlink_to(tmp_path / "real/HEAD")
    kinds = {p: mod.probe(str(tmp_path), {"path": p, "type": True})["type"]
             for p in ("/real", "/real/HEAD", "/link", "/link/HEADLINK", "/nothing")}
    assert kinds == {"/real": "directory", "/real/HEAD": "file", "/link": "link", "/link/HEADLINK": "link",
                     "/nothing": None}
    assert mod.probe(str(tmp_path), {"path": "/link/sub/x/y", "realpath": True})["realpath"] == \
        subprocess.run(["realpath", "-m", "--", str(tmp_path / "link/sub/x/y")], capture_output=True,
                       text=True).stdout.strip() == str(tmp_path.resolve() / "real/sub/x/y")
    assert "type" not in mod.probe(str(tmp_path), {"path": "/real"})  # only when asked


@pytest.mark.slow
def test_site_yml_alone_brings_a_host_through_every_acting_role_and_then_nothing(sim, tmp_path):
    """`ansible-galaxy collection install` of p2pkit.host, then `ansible-playbook -i INVENTORY p2pkit.host.site`
    without p2pkit: driver, p2p-module, engine and service roles in one run from an operator's inventory,
    then a second run that changes nothing. The engine role checks the engine out and builds it (CMake,
    Ninja); the model is placed as the model stage would write it."""
    from p2pkit.sim import lifecycle
    from p2pkit.stages.service import act as svc
    from tests.test_collection import install_collection

    hand = sim("healthy", "site")
    prof = config.load(Host.at(hand).sim["profile"])
    lifecycle.place_engine(hand, replace(prof, serve=replace(prof.serve, health_timeout_s=30.0)))
    shutil.rmtree(hand / prof.engine.build_dir.lstrip("/"))  # the engine role checks it out and builds it
    hostvars = {**profile_vars(hand), **service_vars_by_hand(hand), **engine_vars(prof)}
    inventory = write_inventory(tmp_path / "hosts.yml", hostvars)
    collections = install_collection(tmp_path / "controller")
    try:
        r, recap = playbook("p2pkit.host.site", inventory, tmp_path, collections=collections)
        assert r.returncode == 0 and recap["failed"] == 0 and recap["changed"] > 0, r.stdout[-3000:]
        plays = re.findall(r"^PLAY \[(.+?)\]", r.stdout, re.M)
        assert len(plays) == 4, plays
        assert svc.unit_alive(Host.at(hand)) and (hand / "etc/p2pkit/engine.env").is_file()
        # the role wrote from the profile's values the very command line p2pkit starts the engine with
        from p2pkit.rules import engine_cmd

        unit = (hand / "etc/systemd/system/p2pkit-engine.service").read_text()
        assert f"\nExecStart={svc.exec_start(engine_cmd.argv(prof))}\n" in unit, unit
        assert "\nIPAddressDeny=any\nIPAddressAllow=localhost\n" in unit
        assert (hand / f"lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko").is_file()
        r, recap = playbook("p2pkit.host.site", inventory, tmp_path, collections=collections)
        assert r.returncode == 0 and recap["changed"] == 0, r.stdout[-3000:]  # every role idempotent
    finally:
        subprocess.run([str(hand / "usr/bin/systemctl"), "stop", system.ENGINE_UNIT], capture_output=True)


def host_tree(root: Path) -> dict[str, tuple]:
    """Everything on a simulated host as it stands: each path with its kind, mode and content (or link
    target), the simulator's own state file included."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[str(p.relative_to(root))] = ("link", os.readlink(p))
        elif p.is_dir():
            out[str(p.relative_to(root))] = ("dir", st.st_mode)
        else:
            out[str(p.relative_to(root))] = ("file", st.st_mode, st.st_uid, sha(p))
    return out


@pytest.mark.slow
def test_each_role_and_site_yml_run_in_check_mode_on_a_fresh_host_and_change_nothing(sim, tmp_path):
    """`ansible-playbook --check` on a host nothing has run on yet: each role alone and site.yml report
    what they would change, and none fails on a path an earlier task would have made (the installer's
    cache directory, the fork's checkout `make` runs in, the unit systemd is asked about). Nothing on
    the host changes."""
    from p2pkit.stages.service import act as svc

    root = sim("healthy")
    prof = config.load(Host.at(root).sim["profile"])
    hostvars = {**profile_vars(root), **svc.service_vars(ctx_for(root, prof)), **engine_vars(prof)}
    inventory = write_inventory(tmp_path / "hosts.yml", hostvars)
    before = host_tree(root)
    for book in ("driver.yml", "p2p-module.yml", "engine.yml", "service.yml", "site.yml"):
        r, recap = playbook(book, inventory, tmp_path, "--check")
        assert r.returncode == 0 and recap["failed"] == 0, (book, r.stdout[-3000:])
        assert recap["changed"] > 0, (book, r.stdout[-3000:])  # what it would change is reported
        assert "does not exist" not in r.stdout and "Unable to change directory" not in r.stdout, r.stdout[-3000:]
        assert host_tree(root) == before, book
    changed = re.findall(r"^TASK \[\S+ : (.+?)\] \**\nchanged:", r.stdout, re.M)
    assert "Ensure the installer cache directory, nouveau's blacklist, the apt pin and the unattended-upgrades " \
           "blacklist are in place" in changed and "Ensure the fork is checked out at the pinned commit" in changed \
           and "Ensure the engine's directories, slice, environment file and unit are in place" in changed, changed
