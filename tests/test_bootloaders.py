"""Issue 29, item 3: the bootloader is found up front (GRUB, systemd-boot, kernelstub), the IOMMU option
goes where each one takes it, an unknown one stops before any reboot, and a reboot that did not bring
the option fails after that one reboot."""

import json

import pytest

from p2pkit.core.ansible import COLLECTION
from p2pkit.core.errors import P2pkitError
from p2pkit.parse import boot as pb
from p2pkit.stages.p2p_module import act as acting

# kernelstub's make_loader_entry (pop-os/kernelstub, kernelstub/installer.py) writes these four lines
POP_ENTRY = ("title Pop!_OS\nlinux /EFI/Pop_OS-5d0c7a51/vmlinuz.efi\ninitrd /EFI/Pop_OS-5d0c7a51/initrd.img\n"
             "options root=UUID=5d0c7a51 ro quiet loglevel=0 systemd.show_status=false splash\n")
# the padded `key  value` lines of systemd's 90-loaderentry.install; the options of the Arch entry
# `bootctl status` shows in systemd issue #22580
SD_ENTRY = ("title      Arch Linux (manual entry)\nversion    manual entry\n"
            "options    root=LABEL=ARCHFS rw ipv6.disable=1 mce=nobootlog\nlinux      /vmlinuz-linux\n"
            "initrd     /intel-ucode.img\ninitrd     /initramfs-linux.img\n")
# kernelstub's config_default (kernelstub/config.py), saved as json.dump(..., indent=2) does
KERNELSTUB_DEFAULT = {"default": {"kernel_options": ["quiet", "splash"], "esp_path": "/boot/efi",
                                  "setup_loader": False, "manage_mode": False, "force_update": False,
                                  "live_mode": False, "unified_kernel": False, "config_rev": 4}}


def test_loader_entry_options_are_read_and_appended_to_the_options_line_only():
    assert pb.entry_options(SD_ENTRY) == ["root=LABEL=ARCHFS", "rw", "ipv6.disable=1", "mce=nobootlog"]
    new = pb.entry_with_options(POP_ENTRY, ["amd_iommu=on", "iommu=pt", "quiet"])
    assert new.splitlines()[:3] == POP_ENTRY.splitlines()[:3]
    assert new.splitlines()[3].endswith("splash amd_iommu=on iommu=pt")  # quiet was there: not twice
    assert pb.entry_with_options(new, ["iommu=pt"]) == new
    assert pb.entry_options(pb.entry_with_options("title x\nlinux /v\n", ["iommu=pt"])) == ["iommu=pt"]


def test_kernelstub_options_and_kernel_install_cmdline():
    assert pb.kernelstub_options(json.dumps(KERNELSTUB_DEFAULT, indent=2)) == ["quiet", "splash"]
    doc = {**KERNELSTUB_DEFAULT, "user": {**KERNELSTUB_DEFAULT["default"], "kernel_options": "quiet iommu=pt"}}
    assert pb.kernelstub_options(json.dumps(doc)) == ["quiet", "iommu=pt"]  # a string before config_rev 3
    with pytest.raises(ValueError):
        pb.kernelstub_options("[]")
    assert pb.kernel_install_cmdline("initrd=\\a\\initrd.img BOOT_IMAGE=/boot/vmlinuz root=UUID=1 ro quiet") == \
        ["root=UUID=1", "ro", "quiet"]


def test_which_bootloader():
    assert pb.which({"grub": True})[0] == "grub"
    assert pb.which({"loader": True})[0] == "systemd-boot"
    assert pb.which({"grub": True, "loader": True})[0] == "grub"  # an ESP's leftovers; GRUB booted
    assert pb.which({"grub": True, "loader": True, "loader_info": "systemd-boot 255.4-1ubuntu8"})[0] == "systemd-boot"
    assert pb.which({"loader": True, "kernelstub": True})[0] == "kernelstub"
    assert pb.which({})[0] == "unknown"


def test_an_unknown_bootloader_is_refused_by_the_stage_only_where_the_option_is_missing():
    unknown = {"name": "unknown", "why": "nothing found"}
    with pytest.raises(P2pkitError) as e:
        acting.refuse_unknown_bootloader(unknown, ["amd_iommu=on", "iommu=pt"], ["ro", "amd_iommu=on"])
    assert "needs iommu=pt" in e.value.message and "not rebooted" in e.value.message
    assert "add iommu=pt by hand" in e.value.hint
    acting.refuse_unknown_bootloader(unknown, ["iommu=pt"], ["ro", "iommu=pt"])  # already there: goes on
    acting.refuse_unknown_bootloader({"name": "grub", "why": ""}, ["iommu=pt"], ["ro"])


def _state(root):
    return json.loads((root / ".p2pkit-sim/state.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["systemd-boot", "kernelstub"])
def test_the_option_reaches_the_command_line_with_one_reboot(cli, sim, scenario):
    root = sim(scenario)
    pre = cli("--root", str(root), "--json", "verify", "preflight").json()
    loader = next(c for s in pre["stages"] for c in s["checks"] if c["id"] == "preflight.bootloader")
    assert loader["status"] == "pass" and loader["measured"].startswith(f"{scenario} ("), loader
    r = cli("--root", str(root), "up", "--reboot", "--to", "p2p-module")
    assert r.code == 0, r.err
    assert _state(root)["boots"] == 2  # one reboot
    cmdline = (root / "proc/cmdline").read_text().split()
    assert "amd_iommu=on" in cmdline and "iommu=pt" in cmdline
    assert not (root / "etc/default/grub.d/60-p2pkit-iommu.cfg").exists()
    doc = json.loads((root / "var/lib/p2pkit/p2p-module.json").read_text())
    assert (doc["acted"].get("before_reboot") or doc["acted"])["bootloader"]["name"] == scenario
    if scenario == "systemd-boot":  # kernel-install's line for new kernels, from the running one
        assert (root / "etc/kernel/cmdline").read_text() == "root=UUID=5d0c7a51 ro quiet splash amd_iommu=on iommu=pt\n"
    else:
        conf = json.loads((root / "etc/kernelstub/configuration").read_text())
        assert conf["user"]["kernel_options"][-2:] == ["amd_iommu=on", "iommu=pt"]


@pytest.mark.slow
def test_an_unknown_bootloader_stops_before_anything_changes(cli, sim):
    root = sim("unknown-bootloader")
    boot = (root / "proc/sys/kernel/random/boot_id").read_text()
    r = cli("--root", str(root), "up", "--reboot", "--to", "p2p-module")
    assert r.code == 1 and "preflight.bootloader: unknown" in r.err and "add the IOMMU option" in r.err, r.err
    assert (root / "proc/sys/kernel/random/boot_id").read_text() == boot
    assert not (root / "var/lib/p2pkit/driver.json").exists()


@pytest.mark.slow
def test_a_reboot_that_did_not_bring_the_option_fails_after_the_first(cli, sim):
    """GRUB's files are there but a loader p2pkit cannot see boots the box (the simulated rule broken):
    the option is not on /proc/cmdline after the reboot the stage asked for; the stage fails naming
    the bootloader and the fix, and asks for no second reboot (issue 29: it used to reboot three times)."""
    root = sim("other-bootloader")
    r = cli("--root", str(root), "up", "--reboot", "--to", "p2p-module")
    assert r.code == 1, r.err
    assert "p2p-module failed: p2p.iommu" in r.err and "the bootloader is grub" in r.err
    assert "did not apply this" in r.err and "efibootmgr" in r.err and "reboot budget spent" not in r.err
    assert _state(root)["boots"] == 2
    budget = json.loads((root / "var/lib/p2pkit/reboots.json").read_text())
    assert len(budget["boots"]) == 1 and not budget["exhausted"]


def test_bootentry_imports_only_the_standard_library_and_the_collection_links_to_it():
    """systemd-boot's options lines have one definition: p2pkit.core.bootentry, which p2pkit reads them with
    (parse.boot names its functions) and the p2p-module role's filters write them with (the very file)."""
    import ast
    import os
    import sys

    from p2pkit.core import bootentry
    from tests.conftest import REPO

    tree = ast.parse((REPO / "p2pkit/core/bootentry.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
    link = REPO / COLLECTION / "plugins/module_utils/bootentry.py"
    assert link.is_symlink() and not os.readlink(link).startswith("/"), "a relative symlink"
    assert link.resolve() == (REPO / "p2pkit/core/bootentry.py").resolve()
    assert (pb.entry_options, pb.entry_with_options, pb.kernel_install_cmdline) == \
        (bootentry.entry_options, bootentry.entry_with_options, bootentry.kernel_install_cmdline)
    assert bootentry.kernel_cmdline_file(["root=UUID=1", "ro", "iommu=pt"], ["amd_iommu=on", "iommu=pt"]) == \
        "root=UUID=1 ro iommu=pt amd_iommu=on\n"


def test_the_filters_write_what_p2pkit_reads():
    """The filter plugin loaded as Ansible loads it (from the collection on its path), over the same values."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ansible_collections.p2pkit.host.plugins.filter.bootentry import FilterModule
f = FilterModule().filters()
out = {"entry": f["entry_with_options"](sys.argv[2], ["amd_iommu=on", "iommu=pt", "quiet"]),
       "proc": f["kernel_install_cmdline"]("initrd=\\\\a\\\\initrd.img BOOT_IMAGE=/boot/vmlinuz root=UUID=1 ro"),
       "file": f["kernel_cmdline_file"](["root=UUID=1", "ro"], ["iommu=pt"])}
try:
    f["entry_with_options"](sys.argv[2], "iommu=pt")
except Exception as e:
    from ansible.errors import AnsibleFilterError
    out["refused"] = [isinstance(e, AnsibleFilterError), str(e)]
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code, str(REPO / "playbooks/collections"), POP_ENTRY],
                       capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    assert got["entry"] == pb.entry_with_options(POP_ENTRY, ["amd_iommu=on", "iommu=pt", "quiet"])
    assert got["entry"].splitlines()[3].endswith("splash amd_iommu=on iommu=pt")
    assert got["proc"] == ["root=UUID=1", "ro"] and got["file"] == "root=UUID=1 ro iommu=pt\n"
    assert got["refused"] == [True, "the kernel options must be a list of words, got str"]


@pytest.mark.slow
def test_the_role_writes_systemd_boots_files_from_what_it_reads_and_keeps_their_modes(cli, sim):
    """The p2p-module role reads each loader entry and /etc/kernel/cmdline on the host and writes them with
    the options (p2pkit hands it the entries' paths, not their text): an entry without an options line, one
    with CRLF lines, one that holds Jinja's braces (the host's text, never templated), each in the mode the
    ESP gives it; /etc/kernel/cmdline's own words kept. A second run changes none of them."""
    root = sim("systemd-boot")
    entries = root / "boot/efi/loader/entries"
    (entries / "crlf.conf").write_bytes(b"title x\r\nlinux /v\r\noptions root=/dev/sda1 ro\r\n")
    (entries / "noopts.conf").write_text("title y\nlinux /v")
    (entries / "braces.conf").write_text('title z\noptions iommu=pt\noptions quiet {{ lookup("env","HOME") }}\n')
    for p in entries.glob("*.conf"):
        p.chmod(0o755)
    (root / "etc/kernel").mkdir(parents=True, exist_ok=True)
    (root / "etc/kernel/cmdline").write_text("root=UUID=x  ro\tquiet iommu=pt\n")
    r = cli("--root", str(root), "up", "--to", "p2p-module")
    assert r.code == 4 and "reboot" in r.err, r.err  # the options take effect at the next boot
    # the role reads a file as p2pkit did (Python's universal newlines: CRLF read as LF)
    assert (entries / "crlf.conf").read_bytes() == \
        b"title x\nlinux /v\noptions root=/dev/sda1 ro amd_iommu=on iommu=pt\n"
    assert (entries / "noopts.conf").read_text() == "title y\nlinux /v\noptions amd_iommu=on iommu=pt\n"
    assert (entries / "braces.conf").read_text() == \
        'title z\noptions iommu=pt amd_iommu=on\noptions quiet {{ lookup("env","HOME") }}\n'
    (ubuntu,) = entries.glob("*-generic.conf")
    assert "\noptions    root=UUID=5d0c7a51 ro quiet splash amd_iommu=on iommu=pt\n" in ubuntu.read_text()
    assert {p.name: p.stat().st_mode & 0o777 for p in entries.glob("*.conf")} == \
        {p.name: 0o755 for p in entries.glob("*.conf")}
    assert (root / "etc/kernel/cmdline").read_text() == "root=UUID=x ro quiet iommu=pt amd_iommu=on\n"
    written = {p: p.stat().st_mtime_ns for p in [*entries.glob("*.conf"), root / "etc/kernel/cmdline"]}
    assert cli("--root", str(root), "up", "--to", "p2p-module").code == 4
    assert {p: p.stat().st_mtime_ns for p in written} == written


@pytest.mark.slow
def test_the_role_alone_stops_on_a_loader_entry_it_cannot_read_before_it_writes_anything(sim, tmp_path):
    from tests.test_roles import playbook, profile_vars, write_inventory

    root = sim("systemd-boot")
    given = {**profile_vars(root), "p2pkit_p2p_module_bootloader": "systemd-boot",
             "p2pkit_p2p_module_loader_entries": ["/boot/efi/loader/entries/gone.conf"]}
    before = sorted(str(p) for p in root.rglob("*"))
    r, recap = playbook("p2p-module.yml", write_inventory(tmp_path / "hosts.yml", given), tmp_path)
    assert r.returncode != 0 and recap["failed"] == 1, r.stdout[-3000:]
    assert "/boot/efi/loader/entries/gone.conf: no such systemd-boot loader entry (or not a file)" in r.stdout
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_the_p2p_module_roles_paths_are_stated_once_in_its_defaults():
    """The restore units, the hooks, the GRUB drop-in and the modprobe file: p2pkit reads their paths in the
    role's defaults (p2pkit_p2p_module_paths) when asked, never at import, and spells none of them again."""
    import subprocess
    import sys

    import yaml

    from p2pkit.app import rollback
    from p2pkit.host import system
    from p2pkit.stages.preflight import checks as preflight
    from tests.conftest import REPO

    paths = yaml.safe_load((REPO / COLLECTION / "roles/p2pkit_p2p_module/defaults/main.yml").read_text())[
        "p2pkit_p2p_module_paths"]
    assert (paths["restore_service"], paths["restore_timer"], paths["kernel_hook"], paths["apt_hook"]) == \
        (system.RESTORE_UNIT, system.RESTORE_TIMER, system.KERNEL_HOOK, system.APT_HOOK)
    assert system.TIMER_WANTS == "/etc/systemd/system/timers.target.wants/p2pkit-restore.timer"
    assert rollback._timer() == "p2pkit-restore.timer"
    assert preflight.BOOTLOADER_TAKES["grub"] == f"a GRUB drop-in ({paths['grub_dropin']}) and update-grub"
    for f in (REPO / "p2pkit").rglob("*.py"):
        if "sim" in f.relative_to(REPO / "p2pkit").parts:
            continue
        text = f.read_text()
        for value in [*paths.values(), "p2pkit-restore.timer", "p2pkit-restore.service"]:
            assert value not in text, (f, value)
    code = ("import sys; import p2pkit.app.rollback, p2pkit.stages.preflight.checks, p2pkit.stages.p2p_module.checks, "
            "p2pkit.host.system; print(int('yaml' in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert r.stdout.split() == ["0"], r.stdout + r.stderr
