"""Condition guards for the p2p-module stage (bench/check_guard.py --conditions --only p2p_module): each
condition of p2pkit.stages.p2p_module.checks judged on the facts where it decides the finding, the check
function called directly with typed facts (p2pkit.facts.types: Module, PendingKernel, BuiltModule, Mok,
ModuleSources, DriverParams, BootHold) and the built-in profile, so a condition replaced by True or by
False changes a status, a measured or expected text or a hint asserted here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.rules.findings import FAIL, Check
from p2pkit.stages.p2p_module import checks as p2p_module

P = config.load(None)  # dual-5090-ninfer: a patched pair, iommu passthrough, RegistryDwords RMForceStaticBar1=1
ONE_GPU = config.load(None, ["gpus.count=1"])
STOCK = replace(P, p2p_module=replace(P.p2p_module, patched=False))
NO_DWORDS = replace(P, p2p_module=replace(P.p2p_module, registry_dwords=""))

RUN = "6.8.0-88-generic"  # the running kernel
NEW = "6.8.0-90-generic"  # a kernel an upgrade installed, the next boot's
WANT_RUN = f"/lib/modules/{RUN}/kernel/drivers/video/nvidia.ko"
WANT_NEW = f"/lib/modules/{NEW}/kernel/drivers/video/nvidia.ko"
DKMS_NEW = f"/lib/modules/{NEW}/updates/dkms/nvidia.ko"
DKMS_RUN = f"/lib/modules/{RUN}/updates/dkms/nvidia.ko"
NOT_FOUND = "modinfo: ERROR: Module nvidia not found."

CERT = "/var/lib/p2pkit/mok/p2pkit-mok.der"
SERIAL = "8A3F00112233445566778899AABBCCDDEEFF0011"
SIG = "00:8A:3F:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11"  # modinfo's sig_key of that serial


def built_module(srcversion: str | None = "AAA", kernel: str = RUN) -> dict:
    return {"path": "/var/lib/p2pkit/fork/kernel-open/nvidia.ko", "srcversion": srcversion, "kernel": kernel}


def module(loaded: str | None = "AAA", filename: str | None = WANT_RUN, srcversion: str | None = "AAA", **kw) -> dict:
    return {"loaded_srcversion": loaded, "modinfo_filename": filename, "modinfo_srcversion": srcversion, **kw}


def pending(filename: str | None = WANT_NEW, srcversion: str | None = "BBB", **kw) -> dict:
    """The pending_kernel fact: NEW installed, what modinfo finds for it."""
    return {"running": RUN, "kernel": NEW, "boot_image": f"/boot/vmlinuz -> vmlinuz-{NEW}",
            "modinfo_filename": filename, "modinfo_srcversion": srcversion, "modinfo_sig_key": None, **kw}


def mok(**kw) -> dict:
    return {"needed": True, "key": "/var/lib/p2pkit/mok/p2pkit-mok.priv", "cert": CERT, "key_exists": True,
            "cert_exists": True, "kernel": RUN, "cert_id": {"serial": SERIAL, "cn": "p2pkit"}, **kw}


def by_id(checks: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in checks}


# ------------------------------------------------------------------------------------------ precheck

def test_precheck_names_the_pinned_commit_or_says_it_is_empty():
    c = p2p_module.precheck(P)
    assert (c[0].id, c[0].status, c[0].measured) == ("p2p.commit", "fail", "(empty)")
    pinned = replace(P, p2p_module=replace(P.p2p_module, commit="b" * 40))
    c = p2p_module.precheck(pinned)
    assert (c[0].id, c[0].status, c[0].measured) == ("p2p.commit", "pass", "b" * 40)


# ------------------------------------------------------------------------------------ install_checks

@pytest.mark.parametrize("built, why", [
    (None, "no build"),  # no built_module fact at all
    ({"error": "make: *** [Makefile:34: modules] Error 2"}, "make: *** [Makefile:34: modules] Error 2"),
    (built_module(srcversion=None), None),  # a build that left no srcversion to compare
])
def test_install_checks_without_a_built_srcversion_is_one_unknown(built, why):
    f = {"kernel": RUN, "module": module()}
    if built is not None:
        f["built_module"] = built
    c = p2p_module.install_checks(f, P)
    assert [(x.id, x.status) for x in c] == [("p2p.built", "fail")]
    if why is not None:
        assert c[0].measured == f"could not determine: {why}"


@pytest.mark.parametrize("m, status, measured", [
    (module(), "pass", WANT_RUN),
    (module(filename=DKMS_RUN), "fail", DKMS_RUN),
    (module(filename=None, srcversion=None, modinfo_error=NOT_FOUND), "fail", NOT_FOUND),
    (module(filename=None, srcversion=None), "fail", "none"),
])
def test_install_checks_modinfo_file_says_what_modprobe_picks(m, status, measured):
    c = by_id(p2p_module.install_checks({"kernel": RUN, "module": m, "built_module": built_module()}, P))
    mf = c["p2p.modinfo_file"]
    assert (mf.status, mf.measured, mf.expected, mf.pitfall) == (status, measured, WANT_RUN, "P02")


def test_install_checks_with_the_tree_built_for_the_pending_kernel_warn_and_add_guards_and_pending():
    """The kernel hook rebuilt the tree for NEW (installed for it): the running kernel's module (AAA)
    is not held to that build (BBB): a warning that says reboot; the safeguards and the pending kernel
    are judged when their facts are there."""
    guards = {"restore.service": True, "restore.timer": True, "postinst hook": True, "apt hook": True}
    f = {"kernel": RUN, "module": module(), "built_module": built_module("BBB", NEW), "pending_kernel": pending(),
         "restore_guards": guards}
    c = p2p_module.install_checks(f, P)
    assert [x.id for x in c] == ["p2p.modinfo_file", "p2p.installed_srcversion", "p2p.safeguards",
                                 "p2p.pending_kernel"]
    inst = by_id(c)["p2p.installed_srcversion"]
    assert (inst.status, inst.measured, inst.expected) == ("warn", "AAA", "BBB")
    assert inst.hint == f"module built for the pending kernel {NEW}; reboot to load it"
    assert by_id(c)["p2p.safeguards"].status == "pass" and by_id(c)["p2p.pending_kernel"].status == "warn"
    # the same module against a build for the running kernel: the installed one is not it
    c = by_id(p2p_module.install_checks({**f, "built_module": built_module("BBB", RUN)}, P))
    assert c["p2p.installed_srcversion"].status == "fail"
    assert "p2p.safeguards" in c and "p2p.pending_kernel" in c


# ------------------------------------------------------------------------------------ pending_kernel

def test_pending_kernel_not_read_is_a_skip():
    c = p2p_module.pending_kernel({"error": "/boot/vmlinuz unreadable"}, built_module())
    assert (c.id, c.status, c.measured, c.pitfall) == ("p2p.pending_kernel", "skip",
                                                       "could not determine: /boot/vmlinuz unreadable", "P02")


@pytest.mark.parametrize("pk, built, status, measured", [
    # the hook built and installed the tree's build for NEW: reboot to load it (no mok fact: no signing)
    (pending(), built_module("BBB", NEW), "warn", f"{NEW}: {WANT_NEW} (BBB)"),
    # the tree holds another build for NEW than the one installed for it
    (pending(srcversion="CCC"), built_module("BBB", NEW), "fail",
     f"{NEW} (/boot/vmlinuz -> vmlinuz-{NEW}): modprobe would load {WANT_NEW}, srcversion CCC is not the build's BBB"),
    # the tree was built for the running kernel: NEW's module (built by its hook) is not compared with it
    (pending(srcversion="CCC"), built_module("AAA", RUN), "warn", f"{NEW}: {WANT_NEW} (CCC)"),
    # modprobe would load a stock DKMS copy for NEW
    (pending(filename=DKMS_NEW, srcversion="DDD"), built_module("AAA", RUN), "fail",
     f"{NEW} (/boot/vmlinuz -> vmlinuz-{NEW}): modprobe would load {DKMS_NEW}"),
    (pending(filename=DKMS_NEW, srcversion="DDD"), built_module("BBB", NEW), "fail",
     f"{NEW} (/boot/vmlinuz -> vmlinuz-{NEW}): modprobe would load {DKMS_NEW}"),
    # no nvidia.ko for NEW at all
    (pending(filename=None, srcversion=None, modinfo_error=NOT_FOUND), built_module("AAA", RUN), "fail",
     f"{NEW} (/boot/vmlinuz -> vmlinuz-{NEW}): modprobe would load {NOT_FOUND}"),
    (pending(filename=None, srcversion=None), built_module("AAA", RUN), "fail",
     f"{NEW} (/boot/vmlinuz -> vmlinuz-{NEW}): modprobe would load nothing"),
])
def test_pending_kernel_judges_what_modprobe_would_load_at_the_next_boot(pk, built, status, measured):
    c = p2p_module.pending_kernel(pk, built)
    assert (c.id, c.status, c.measured, c.expected, c.pitfall) == ("p2p.pending_kernel", status, measured,
                                                                    WANT_NEW, "P02")
    if status == "warn":
        assert c.hint == f"module built for the pending kernel {NEW}; reboot to load it"
    else:
        assert c.hint.startswith(f"the kernel hook did not build the patched module for {NEW}")


def test_pending_kernel_with_secure_boot_wants_it_signed_by_the_key():
    built = built_module("BBB", NEW)
    c = p2p_module.pending_kernel(pending(), built, mok())
    assert (c.status, c.measured) == ("fail", f"{NEW}: {WANT_NEW} (BBB) signed by nobody")
    assert c.expected == f"{WANT_NEW} signed by {CERT} (serial {SERIAL})"
    assert f"sudo p2pkit restore --kernel {NEW}" in c.hint and c.pitfall == "P02"
    c = p2p_module.pending_kernel(pending(modinfo_sig_key=SIG), built, mok())
    assert (c.status, c.hint) == ("warn", f"module built and signed for the pending kernel {NEW}; reboot to load it")


# ---------------------------------------------------------------------------------------- safeguards

@pytest.mark.parametrize("g, status, measured", [
    ({"error": "systemctl: not found"}, "fail", "could not determine: systemctl: not found"),
    ({"restore.service": True, "restore.timer": True, "apt hook": True}, "pass", "all in place"),
    ({"restore.service": True, "restore.timer": False, "apt hook": False}, "fail", "missing: restore.timer, apt hook"),
])
def test_safeguards_name_what_is_missing(g, status, measured):
    c = p2p_module.safeguards(g)
    assert (c.id, c.status, c.measured, c.pitfall) == ("p2p.safeguards", status, measured, "P02")


# ------------------------------------------------------------------------------------ runtime_checks

def runtime(**kw) -> dict[str, Check]:
    f = {"kernel": RUN, "nvidia_version": {"loaded": True, "version": "615.71.09", "open_module": True},
         "module": module(), "built_module": built_module(), "secure_boot": "off",
         "nvml": {"driver_version": "615.71.09", "cuda_driver_version": 13000, "gpus": [], "p2p": []},
         "iommu": {"intent": "passthrough", "detail": "iommu=pt"}, "bootloader": {"name": "grub"}, **kw}
    return by_id(p2p_module.runtime_checks(f, P))


@pytest.mark.parametrize("v, status, measured", [
    ({"loaded": True, "version": "615.71.09", "open_module": True}, "pass", "615.71.09 Open Kernel Module"),
    ({"loaded": True, "version": "615.71.09", "open_module": False}, "fail", "615.71.09 Kernel Module"),
    ({"loaded": False}, "fail", "no nvidia module loaded"),
    ({"error": "/proc/driver/nvidia/version: No such file"}, "fail",
     "could not determine: /proc/driver/nvidia/version: No such file"),
])
def test_runtime_loaded_version_says_which_module_is_loaded(v, status, measured):
    c = runtime(nvidia_version=v)["p2p.loaded_version"]
    assert (c.status, c.measured, c.expected) == (status, measured, "615.71.09 Open Kernel Module")


@pytest.mark.parametrize("m, built, status, measured", [
    (module(), built_module(), "pass", "AAA"),
    (module(loaded="CCC"), built_module(), "fail", "CCC"),  # another module is loaded
    (module(loaded=None), {"error": "no build"}, "fail", "not loaded"),  # neither side to compare
])
def test_runtime_loaded_srcversion_against_the_build(m, built, status, measured):
    c = runtime(module=m, built_module=built)["p2p.loaded_srcversion"]
    assert (c.status, c.measured) == (status, measured)
    if status == "fail":  # the fix follows what was read: another module, or none
        assert c.hint.startswith("no nvidia module is loaded: reboot" if measured == "not loaded" else
                                 "a different nvidia module is loaded: reboot")


@pytest.mark.parametrize("m, status, measured", [
    (module(), "warn", "AAA"),  # the running kernel's installed module is the loaded one
    (module(loaded="CCC"), "fail", "CCC"),  # loaded is neither the installed one nor the build
    (module(loaded=None, filename=None, srcversion=None, modinfo_error=NOT_FOUND), "fail", "not loaded"),
])
def test_runtime_loaded_srcversion_with_the_tree_built_for_the_pending_kernel(m, status, measured):
    c = runtime(module=m, built_module=built_module("BBB", NEW), pending_kernel=pending())["p2p.loaded_srcversion"]
    assert (c.status, c.measured, c.expected) == (status, measured, "BBB")
    if status == "warn":
        assert c.hint == f"module built for the pending kernel {NEW}; reboot to load it"


@pytest.mark.parametrize("nv, status, measured, fix", [
    ({"driver_version": "615.71.09", "cuda_driver_version": 13000, "gpus": [], "p2p": []}, "pass", "ok", ""),
    # NVML initialised; a later call failed (nvml.facts records it beside what it read): still initialised
    ({"driver_version": "615.71.09", "cuda_driver_version": 13000, "gpus": [], "p2p": [],
      "error": "GPU 1: Unknown Error"}, "pass", "ok", ""),
    # the fix follows NVML's own reason (nvmlErrorString)
    ({"error": "NVML did not initialise: Driver/library version mismatch"}, "fail",
     "NVML did not initialise: Driver/library version mismatch", "the loaded module and the userspace driver differ"),
    ({"error": "NVML did not initialise: Driver Not Loaded"}, "fail", "NVML did not initialise: Driver Not Loaded",
     "no nvidia module is loaded"),
    ({"error": "NVML did not initialise: NVML Shared Library Not Found"}, "fail",
     "NVML did not initialise: NVML Shared Library Not Found", "the userspace driver (libnvidia-ml.so.1) is not"),
])
def test_runtime_nvml_initialises(nv, status, measured, fix):
    c = runtime(nvml=nv)["p2p.nvml"]
    assert (c.status, c.measured) == (status, measured)
    assert c.hint.startswith(fix) if fix else c.hint == ""


# ---------------------------------------------------------------------------------------- _secure_boot

def test_secure_boot_unread_state_or_mok_is_unknown():
    c = p2p_module._secure_boot({"secure_boot": {"error": "mokutil: not found"}})
    assert [(x.id, x.title, x.status, x.measured) for x in c] == [
        ("p2p.secure_boot", "Secure Boot off", "fail", "could not determine: mokutil: not found")]
    c = p2p_module._secure_boot({"secure_boot": "on"})  # no mok fact
    assert [(x.id, x.title, x.status, x.measured) for x in c] == [
        ("p2p.secure_boot", "the module is signed by p2pkit's key", "fail", "could not determine: not read")]


def test_secure_boot_on_names_the_signer_its_key_and_the_cert_serial():
    c = by_id(p2p_module._secure_boot({"secure_boot": "on", "mok": mok(
        enrolment="enrolled", module_sig_key=SIG, module_signer="p2pkit")}))
    s = c["p2p.secure_boot"]
    assert s.status == "pass" and s.measured == f"on; nvidia.ko signed by p2pkit (sig_key {SIG})"
    assert s.expected == f"{CERT} (serial {SERIAL})"
    c = by_id(p2p_module._secure_boot({"secure_boot": "on", "mok": mok(enrolment="enrolled", module_sig_key=None,
                                                                           module_signer=None)}))
    assert (c["p2p.secure_boot"].status, c["p2p.secure_boot"].measured) == (
        "fail", "on; nvidia.ko signed by nobody (sig_key none)")


@pytest.mark.parametrize("state, status, hint", [
    ("enrolled", "pass", ""),
    ("queued", "fail", "a queued key is enrolled at the next boot"),
    ("not-enrolled", "fail", "no enrolment is queued: run `p2pkit up --from p2p-module`"),
    (None, "fail", "no enrolment is queued: run `p2pkit up --from p2p-module`"),
])
def test_secure_boot_enrolment_hint_says_whether_a_reboot_enrols_it(state, status, hint):
    m = mok(module_sig_key=SIG, module_signer="p2pkit", **({"enrolment": state} if state else {}))
    c = by_id(p2p_module._secure_boot({"secure_boot": "on", "mok": m}))["p2p.mok_enrolled"]
    assert (c.status, c.measured) == (status, f"{CERT}: {state or 'no key'}")
    assert c.hint.startswith(hint)


# ----------------------------------------------------------------------------------------- not_applied

BOOT = "0123456789abcdef0123456789abcdef"
HEAD = "the reboot (from boot 01234567) did not apply this"


def test_not_applied_a_check_other_than_the_iommu_fails_with_its_own_hint():
    c = Check("p2p.loaded_version", "loaded driver version", FAIL, "no nvidia module loaded",
              "615.71.09 Open Kernel Module", "the patched module is not loaded yet: reboot")
    got = p2p_module.not_applied({"bootloader": {"name": "grub"}}, c, BOOT)
    assert (got.status, got.measured) == ("fail", "no nvidia module loaded")
    assert got.hint == f"{HEAD}: the patched module is not loaded yet: reboot"


@pytest.mark.parametrize("bootloader, name, fix", [
    ({"name": "grub", "why": "/etc/default/grub"}, "grub", p2p_module.FIX_BY["grub"]),
    ({"name": "systemd-boot"}, "systemd-boot", p2p_module.FIX_BY["systemd-boot"]),
    (None, "unknown", "set the option by hand in the bootloader that boots this box"),
    ("grub", "unknown", "set the option by hand in the bootloader that boots this box"),  # not a dict
])
def test_not_applied_the_iommu_names_the_bootloader_and_its_fix(bootloader, name, fix):
    c = Check("p2p.iommu", "IOMMU mode on the running command line", FAIL, "default (no IOMMU option)",
              "passthrough", "the GRUB drop-in is written; reboot")
    f = {} if bootloader is None else {"bootloader": bootloader}
    got = p2p_module.not_applied(f, c, BOOT)
    assert got.status == "fail" and got.measured == f"default (no IOMMU option); the bootloader is {name}"
    assert got.hint == (f"{HEAD}: /proc/cmdline lacks the option the stage set for {name}. {fix}; reboot, then run "
                        "`p2pkit up` again (p2pkit does not reboot for it again)")


# ----------------------------------------------------------------------------------- static_bar1 (P28)

NO_DWORDS_LIVE = {"loaded": True, "params": {"RegistryDwords": ""}, "registry_dwords": {}}


@pytest.mark.parametrize("p", [ONE_GPU, STOCK, NO_DWORDS], ids=["one-gpu", "stock-module", "no-registry-dwords"])
def test_static_bar1_only_for_a_patched_pair_that_sets_registry_dwords(p):
    assert p2p_module.static_bar1({"driver_params": NO_DWORDS_LIVE}, p) == []
    assert p2p_module.static_bar1({"driver_params": NO_DWORDS_LIVE}, P)[0].status == "fail"


def test_static_bar1_with_no_module_loaded_is_a_skip():
    c = p2p_module.static_bar1({"driver_params": {"loaded": False, "params": {}, "registry_dwords": {}}}, P)
    assert [(x.id, x.status, x.measured, x.pitfall) for x in c] == [
        ("field.static_bar1", "skip", "no nvidia module loaded", "P28")]


# -------------------------------------------------------------------------------- module_sources (P34)

IMAGE = f"/boot/initrd.img-{RUN}"
IR_PATCHED = f"usr/lib/modules/{RUN}/kernel/drivers/video/nvidia.ko"
IR_DKMS = f"usr/lib/modules/{RUN}/updates/dkms/nvidia.ko"
FINE = f"no copy under updates/, {IMAGE} holds {IR_PATCHED}"  # what lsinitramfs listed, as it is
HOLDERS = ["nvidia_uvm", "nvidia_modeset"]


def sources(initramfs: dict | None = None, **kw) -> dict:
    """The module_sources fact: nothing under updates/, an initramfs rebuilt (2000) after the install (1000)."""
    ir = {"path": IMAGE, "nvidia": [IR_PATCHED], "mtime": 2000.0} if initramfs is None else initramfs
    return {"kernel": RUN, "updates": [], "holders": [], "installed_mtime": 1000.0, "initramfs": ir, **kw}


def ms(p=P, **facts) -> list[Check]:
    f = {"module_sources": sources(), "module": module(), "built_module": built_module(), **facts}
    return p2p_module.module_sources(f, p)


def test_module_sources_clean_passes_and_names_the_initramfs():
    c = ms()
    assert [(x.id, x.status, x.measured, x.hint, x.pitfall) for x in c] == [
        ("field.module_sources", "pass", FINE, "", "P34")]


@pytest.mark.parametrize("p", [ONE_GPU, STOCK], ids=["one-gpu", "stock-module"])
def test_module_sources_only_for_a_patched_pair(p):
    assert ms(p, module_sources=sources(updates=[DKMS_RUN])) == []


def test_module_sources_unread_is_could_not_check():
    c = ms(module_sources={"error": "/proc/sys/kernel/osrelease unreadable"})
    assert [(x.id, x.status, x.measured, x.pitfall) for x in c] == [
        ("field.module_sources", "warn", "could not check, because /proc/sys/kernel/osrelease unreadable", "P34")]


def test_module_sources_initramfs_unread_is_its_own_could_not_check():
    c = ms(module_sources=sources(initramfs={"error": "lsinitramfs: not found"}))
    assert [(x.id, x.status, x.measured) for x in c] == [
        ("field.module_sources.initramfs", "warn", "could not check, because lsinitramfs: not found"),
        ("field.module_sources", "pass", "no copy under updates/")]


OLDER = f"{IMAGE} is older than the installed patched module: it still holds the one before it"
HELD = ("loaded srcversion AAA is not the built BBB; nvidia_uvm, nvidia_modeset hold nvidia (rmmod nvidia fails "
        "until they are unloaded)")


@pytest.mark.parametrize("facts, status, measured", [
    # a stock copy in the initramfs beside the patched one
    ({"module_sources": sources({"path": IMAGE, "nvidia": [IR_PATCHED, IR_DKMS], "mtime": 2000.0})},
     "fail", f"initramfs {IMAGE}: {IR_DKMS}"),
    # an initramfs older than the installed module (a reinstall without update-initramfs)
    ({"module_sources": sources({"path": IMAGE, "nvidia": [IR_PATCHED], "mtime": 500.0})}, "fail", OLDER),
    # an older initramfs that holds no nvidia.ko cannot load an old one
    ({"module_sources": sources({"path": IMAGE, "nvidia": [], "mtime": 500.0})}, "pass", None),
    # no installed module: no age to compare
    ({"module_sources": sources({"path": IMAGE, "nvidia": [IR_PATCHED], "mtime": 500.0}, installed_mtime=None)},
     "pass", FINE),
    # the loaded module is not the build, and other modules hold it
    ({"module_sources": sources(holders=HOLDERS), "built_module": built_module("BBB")}, "fail", HELD),
    # ... with nothing built to compare, no module loaded, the built one loaded, or none holding it: no problem
    ({"module_sources": sources(holders=HOLDERS), "built_module": {"error": "no build"}}, "pass", FINE),
    ({"module_sources": sources(holders=HOLDERS), "built_module": built_module("BBB"), "module": module(loaded=None)},
     "pass", FINE),
    ({"module_sources": sources(holders=HOLDERS), "built_module": built_module("AAA")}, "pass", FINE),
    ({"module_sources": sources(), "built_module": built_module("BBB")}, "pass", FINE),
])
def test_module_sources_problems(facts, status, measured):
    c = ms(**facts)
    assert [(x.id, x.status) for x in c] == [("field.module_sources", status)]
    if measured is not None:
        assert c[0].measured == measured


# --------------------------------------------------------------------------------- boot_default (P36)

def test_boot_default_hold_names_the_new_kernel_in_the_hint():
    c = p2p_module.boot_default({"boot_hold": {"held": {"kernel": RUN, "new_kernel": NEW}}}, P)
    assert [(x.id, x.status, x.pitfall) for x in c] == [("field.boot_default", "warn", "P36")]
    assert c[0].measured == f"booting {RUN}: the P2P module did not build for {NEW} (modinfo -k {NEW}: nothing)"
    assert c[0].hint.startswith(f"the new kernel {NEW} breaks the module build")
    assert f"then `sudo p2pkit restore --kernel {NEW}`: it lifts the hold and runs update-grub" in c[0].hint


def test_an_empty_initramfs_is_said_to_hold_no_nvidia_ko():
    """Issue 49 item 5: an initramfs that holds no nvidia.ko was said to hold the patched module."""
    c = ms(module_sources=sources({"path": IMAGE, "nvidia": [], "mtime": 2000.0}))
    assert [(x.status, x.measured) for x in c] == [("pass", f"no copy under updates/, {IMAGE} holds no nvidia.ko")]


# --------------------------------------------------------------------- restore_timer (P02, issue 49 item 8)

def units(timer: dict | None = None, service: dict | None = None) -> dict:
    """The restore_units fact as systemctl show gives it on a host whose timer runs."""
    t = {"name": "p2pkit-restore.timer", "path": "/etc/systemd/system/p2pkit-restore.timer", "LoadState": "loaded",
         "ActiveState": "active", "SubState": "waiting", "UnitFileState": "enabled", "NeedDaemonReload": "no",
         "FragmentPath": "/etc/systemd/system/p2pkit-restore.timer", "Triggers": "p2pkit-restore.service",
         "NextElapseUSecRealtime": "Thu 2026-12-10 00:07:41 UTC", "LastTriggerUSec": ""}
    s = {"name": "p2pkit-restore.service", "path": "/etc/systemd/system/p2pkit-restore.service",
         "LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "static", "NeedDaemonReload": "no",
         "FragmentPath": "/etc/systemd/system/p2pkit-restore.service",
         "ExecStart": "{ path=/opt/p2pkit/bin/p2pkit ; argv[]=/opt/p2pkit/bin/p2pkit --yes restore ; ... }"}
    return {"systemd": True, "timer": {**t, **(timer or {})}, "service": {**s, **(service or {})}}


@pytest.mark.parametrize("timer, service, measured", [
    ({}, {}, "p2pkit-restore.timer active (waiting), next run Thu 2026-12-10 00:07:41 UTC, triggers "
             "p2pkit-restore.service; p2pkit-restore.service loaded"),
    ({"NeedDaemonReload": "yes"}, {}, "p2pkit-restore.timer changed on disk since systemd read it"),
    ({"LoadState": "not-found", "UnitFileState": "bad"}, {}, "p2pkit-restore.timer not-found"),
    ({"ActiveState": "inactive", "SubState": "dead"}, {}, "p2pkit-restore.timer inactive (it runs from the next boot"),
    ({"Triggers": "other.service"}, {}, "triggers other.service, not p2pkit-restore.service"),
    ({}, {"FragmentPath": "/run/systemd/system/p2pkit-restore.service"}, "loaded from /run/systemd/system/"),
    ({}, {"ExecStart": "{ path=/bin/true ; argv[]=/bin/true ; }"}, "p2pkit-restore.service runs { path=/bin/true"),
])
def test_restore_timer_is_judged_from_systemds_own_view(timer, service, measured):
    c = p2p_module.restore_timer(units(timer, service))
    assert c.id == "p2p.restore_timer" and c.pitfall == "P02" and measured in c.measured, c.measured
    assert c.status == ("pass" if not timer and not service else "fail")
    assert c.status == "pass" or "systemctl daemon-reload && sudo systemctl enable --now p2pkit-restore.timer" in c.hint


def test_restore_timer_without_systemd_is_skipped_and_unread_is_could_not_check():
    assert p2p_module.restore_timer({"systemd": False}).status == "skip"
    c = p2p_module.restore_timer({"error": "systemctl show: exit 1"})
    assert c.status == "fail" and c.measured == "could not determine: systemctl show: exit 1"
