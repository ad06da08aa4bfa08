"""Issue 29, item 4: between the kernel hook's rebuild for a new kernel and the reboot into it,
doctor and status say the module waits for that kernel (a warning), not "rerun --from p2p-module";
and they fail when the pending kernel has no patched module (the hook failed or was skipped)."""


import pytest

from p2pkit.sim import lifecycle
from p2pkit.stages.p2p_module import checks as p2p_module
from tests.conftest import FIXTURES

NEW = "6.8.0-90-generic"


def checks_of(doc: dict) -> dict:
    return {c["id"]: c for g in doc["groups"] for c in g["checks"]}


def test_no_pending_kernel_or_one_held_back_passes():
    c = p2p_module.pending_kernel({"running": "6.8.0-88-generic", "kernel": None,
                                   "boot_image": "/boot/vmlinuz -> vmlinuz-6.8.0-88-generic"}, {})
    assert c.id == "p2p.pending_kernel" and c.status == "pass" and "running now" in c.measured
    held = p2p_module.pending_kernel({"running": "6.8.0-88-generic", "kernel": None, "held_for": NEW}, {})
    assert held.status == "pass" and f"held back from {NEW}" in held.measured


@pytest.mark.slow
def test_between_the_hook_and_the_reboot_doctor_and_status_say_reboot(cli, sim):
    root = sim("healthy")
    r = cli("--root", str(root), "up", "--reboot", "--to", "p2p-module")
    assert r.code == 0, r.err
    printed = lifecycle.upgrade(root, NEW, stock_module=True, run_hooks=True)
    assert printed and printed[0].startswith("zz-p2pkit: exit 0"), printed
    assert (root / "boot/vmlinuz").readlink().name == f"vmlinuz-{NEW}"  # what the next boot starts

    r = cli("--root", str(root), "--json", "doctor")
    failing = [(k, v["measured"]) for k, v in checks_of(r.json()).items() if v["status"] == "fail"]
    assert r.code == 0, failing  # a warning, not a failure
    c = checks_of(r.json())
    note = f"module built for the pending kernel {NEW}; reboot to load it"
    assert c["p2p.pending_kernel"]["status"] == "warn" and c["p2p.pending_kernel"]["hint"] == note
    for cid in ("p2p.installed_srcversion", "p2p.loaded_srcversion"):  # no false "rerun --from p2p-module"
        assert c[cid]["status"] == "warn" and c[cid]["hint"] == note, c[cid]
    r = cli("--root", str(root), "--json", "status")
    p2p = {s["stage"]: s for s in r.json()["stages"]}["p2p-module"]
    assert p2p["state"] == "done" and note in p2p["reason"], p2p

    # the hook's module gone (it failed, or was skipped): the reboot would come up without P2P
    (root / f"lib/modules/{NEW}/kernel/drivers/video/nvidia.ko").unlink()
    r = cli("--root", str(root), "--json", "doctor")
    assert r.code == 1
    pk = checks_of(r.json())["p2p.pending_kernel"]
    assert pk["status"] == "fail" and pk["pitfall"] == "P02"
    assert f"`p2pkit --root {root} restore --kernel {NEW}`" in pk["hint"]
    assert "reboot to load it" not in checks_of(r.json())["p2p.installed_srcversion"]["hint"]
    r = cli("--root", str(root), "--json", "status")
    p2p = {s["stage"]: s for s in r.json()["stages"]}["p2p-module"]
    assert p2p["state"] == "stale" and "p2p.pending_kernel" in p2p["reason"]

    # as the hook leaves a failed build (P36): the boot default held at the running kernel; doctor reads the
    # new kernel's module from modinfo -k, and names the restore that lifts the hold
    hold = root / "etc/default/grub.d/61-p2pkit-boot-default.cfg"
    hold.write_text("# p2pkit-kernel=6.8.0-88-generic\n# p2pkit-new_kernel=" + NEW + "\n"
                    'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux 6.8.0-88-generic"\n')
    bd = checks_of(cli("--root", str(root), "--json", "doctor").json())["field.boot_default"]
    assert bd["status"] == "warn" and f"modinfo -k {NEW}: " in bd["measured"] and "restore --kernel" in bd["hint"]
    # the fix the hint names (run by hand): it builds for NEW, lifts the hold and runs update-grub itself (a
    # headers package's hook has no update-grub after it); then the reboot: the new kernel runs the patched
    # module, nothing pending
    r = cli("--root", str(root), "--json", "restore", "--kernel", NEW)
    assert r.code == 0, r.err
    assert not hold.exists() and f"vmlinuz-{NEW}" in (root / "boot/grub/grub.cfg").read_text()
    assert any("hold for " + NEW + " lifted" in str(a.get("boot_default")) for a in r.json()["actions"]), r.json()
    assert checks_of(cli("--root", str(root), "--json", "doctor").json())["field.boot_default"]["status"] == "pass"
    lifecycle.reboot(root)
    r = cli("--root", str(root), "--json", "doctor")
    c = checks_of(r.json())
    assert c["p2p.pending_kernel"]["status"] == "pass" and c["p2p.loaded_srcversion"]["status"] == "pass"


def test_a_pending_kernels_module_signature_read_from_real_modinfo_output():
    """kmod's modinfo of a signed module (tests/fixtures/mok, a real Ubuntu 6.2 kernel's overlay.ko):
    its sig_key, colon-separated with the DER integer's leading 00, is the signing certificate's serial
    as openssl prints it (no colons, no leading zeros); the pending-kernel check passes it to a reboot
    note when it is p2pkit's key and fails it before the reboot when it is another."""
    from p2pkit.parse import system as ps
    from p2pkit.stages.p2p_module import checks as p2p

    fields = ps.modinfo_fields((FIXTURES / "mok/modinfo-signed-overlay-6.2.0-25.txt").read_text())
    assert fields["sig_key"] == "03:91:76:66:F0:D5:23:99:A0:4F:17:5E:BD:A8:42:D6:08:A9:5F:71"
    kernel = "6.8.0-90-generic"
    pk = {"kernel": kernel, "boot_image": f"/boot/vmlinuz -> vmlinuz-{kernel}", "running": "6.8.0-88-generic",
          "modinfo_filename": p2p.module_file(kernel), "modinfo_srcversion": fields["srcversion"],
          "modinfo_sig_key": fields["sig_key"]}
    built = {"kernel": kernel, "srcversion": fields["srcversion"]}
    ours = {"needed": True, "cert": "/var/lib/p2pkit/mok/p2pkit-mok.der",
            "cert_id": {"serial": "3917666F0D52399A04F175EBDA842D608A95F71", "cn": "p2pkit"}}
    c = p2p.pending_kernel(pk, built, ours)
    assert c.status == "warn" and "built and signed for the pending kernel" in c.hint
    other = {**ours, "cert_id": {"serial": "8A3F00112233445566778899AABBCCDDEEFF0011", "cn": "p2pkit"}}
    c = p2p.pending_kernel(pk, built, other)
    assert c.status == "fail" and fields["sig_key"] in c.measured and f"restore --kernel {kernel}" in c.hint
    assert p2p.pending_kernel(pk, built, {"needed": False}).status == "warn"  # Secure Boot off: no key asked


GRUB_CFG = (FIXTURES / "grub/debian12-grub.cfg").read_text()  # Debian 12's grub-mkconfig, one kernel
OLD_K, NEW_K = "6.1.0-56-cloud-amd64", "6.1.0-57-cloud-amd64"


def two_kernels(default: str = "0") -> str:
    """The fixture as grub-mkconfig writes it once NEW_K is installed too: the top entry and the submenu's first
    entries boot the newest kernel, the older one's follow in the submenu (10_linux's order)."""
    start = GRUB_CFG.index("\tmenuentry 'Debian GNU/Linux, with Linux " + OLD_K + "'")
    end = GRUB_CFG.index("\n}\n", start)  # the submenu's end: the old kernel's two entries in it
    old_entries = GRUB_CFG[start:end + 1]
    cfg = GRUB_CFG[:start] + old_entries.replace(OLD_K, NEW_K) + old_entries + GRUB_CFG[end + 1:]
    top = cfg.index("menuentry 'Debian GNU/Linux' ")
    cfg = cfg[:top] + cfg[top:start].replace(OLD_K, NEW_K) + cfg[start:]
    return cfg.replace('set default="0"', f'set default="{default}"')


def debian_root(tmp_path, cfg: str | None, link: str | None, where: str = "vmlinuz", hold: bool = False):
    from p2pkit.host import Host

    root = tmp_path / "root"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(OLD_K + "\n")
    (root / "boot/grub").mkdir(parents=True)
    if cfg is not None:
        (root / "boot/grub/grub.cfg").write_text(cfg)
    if link:
        (root / where).symlink_to(f"{'' if where.startswith('boot/') else 'boot/'}vmlinuz-{link}")
    if hold:
        (root / "etc/default/grub.d").mkdir(parents=True)
        (root / "etc/default/grub.d/61-p2pkit-boot-default.cfg").write_text(
            f"# p2pkit-kernel={OLD_K}\n# p2pkit-new_kernel={NEW_K}\n")
    return Host(root=root)


def test_the_pending_kernel_is_read_from_debians_link_and_grubs_own_default(tmp_path):
    """Debian keeps the newest kernel's link at /vmlinuz (not /boot/vmlinuz: that is Ubuntu's link_in_boot),
    and GRUB boots its default entry: a kernel GRUB's menu has not caught up with is pending (update-grub makes
    it the default), one GRUB's default names is pending, one GRUB_DEFAULT keeps away from (P36's hold, or the
    owner's) is held back."""
    from p2pkit.host import kmod

    cases = {  # name: (grub.cfg, link, where the link is, p2pkit's hold) -> (kernel, held_for)
        "Debian's /vmlinuz, the menu not updated yet": ((GRUB_CFG, NEW_K, "vmlinuz", False), (NEW_K, None)),
        "Ubuntu's /boot/vmlinuz, no grub.cfg": ((None, NEW_K, "boot/vmlinuz", False), (NEW_K, None)),
        "GRUB's default entry boots the new kernel": ((two_kernels(), NEW_K, "vmlinuz", False), (NEW_K, None)),
        "GRUB_DEFAULT keeps the running kernel": (
            (two_kernels(f"Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {OLD_K}"), NEW_K,
             "vmlinuz", False), (None, NEW_K)),
        "p2pkit's hold, update-grub still to come": ((GRUB_CFG, NEW_K, "vmlinuz", True), (None, NEW_K)),
        "nothing new": ((GRUB_CFG, OLD_K, "vmlinuz", False), (None, None)),
    }
    for i, (name, ((cfg, link, where, hold), (kernel, held))) in enumerate(cases.items()):
        pk = kmod.pending_kernel(debian_root(tmp_path / str(i), cfg, link, where, hold))
        assert (pk["kernel"], pk.get("held_for")) == (kernel, held), (name, pk)
        assert pk["running"] == OLD_K and (where.lstrip("/") in pk["boot_image"] or cfg is None), (name, pk)
    pk = kmod.pending_kernel(debian_root(tmp_path / "x", two_kernels(), None))
    assert pk["kernel"] == NEW_K and f"GRUB's default entry 'Debian GNU/Linux' boots {NEW_K}" in pk["boot_image"]
    with pytest.raises(Exception, match="neither /vmlinuz nor /boot/vmlinuz is a link"):
        kmod.pending_kernel(debian_root(tmp_path / "y", None, None))


@pytest.mark.slow
def test_a_kernel_installed_before_the_first_bring_up_gets_the_module_without_a_hand_run_restore(cli, sim):
    """Issue 47 item 13: an upgrade installed a kernel (with its headers) before p2pkit's kernel hook was there;
    the first `up` stopped at p2p.pending_kernel asking for `restore --kernel`. The stage now builds for that
    kernel too, and `up --reboot` boots into it with the patched module loaded."""
    root = sim("healthy")
    try:
        assert lifecycle.upgrade(root, NEW, stock_module=False, run_hooks=True) == []  # no hook of p2pkit's yet
        r = cli("--root", str(root), "up", "--reboot")
        assert r.code == 0, r.err[-3000:]
        assert f"the next boot starts kernel {NEW}, installed before p2pkit's kernel hook" in r.err + r.out
        state = lifecycle.load_state(root)
        assert state["kernel"] == NEW and state["module"]["loaded"]["patched"], state["module"]
    finally:
        lifecycle.stop_services(root)
