"""Condition guards (issue 30 item 4): a test for each condition inside a check that
`bench/check_guard.py --conditions` found no test noticing when it was removed (replaced by True or
by False). Each calls the check by a stable name (doctor's judge, the check id, the engine's own
counters' check) so that it survives checks moving between modules; docs/guards.md lists what is
left and why."""

from __future__ import annotations

import json
import os


def finding(doc: dict, id_: str) -> dict:
    """A check of a doctor document by its id, whichever group (stage) judges it."""
    found = [c for g in doc["groups"] for c in g["checks"] if c["id"] == id_]
    assert len(found) == 1, (id_, [c["id"] for g in doc["groups"] for c in g["checks"]])
    return found[0]


def doctor(cli, root) -> dict:
    r = cli("--root", str(root), "--json", "doctor")
    return json.loads(r.out)


# ------------------------------------------------------------------------------------------- P34

def test_p34_an_initramfs_older_than_the_installed_patched_module_fails(cli, sim):
    """The simulated host with the patched module up (its initramfs rebuilt after the install): the
    sources check passes. The installed nvidia.ko made newer than the initramfs (a reinstall without
    update-initramfs): the initramfs still holds the module before it, a fail naming both. With no
    installed module there is no age to compare; an initramfs that holds no nvidia.ko at all cannot
    load an old one: its age does not matter."""
    from p2pkit.sim.lifecycle import STOCK_KO
    from p2pkit.sim.standins import write_initramfs, write_modules_dep

    root = sim("p2p-up")
    kver = (root / "proc/sys/kernel/osrelease").read_text().strip()
    image = root / f"boot/initrd.img-{kver}"
    ko = root / f"lib/modules/{kver}/kernel/drivers/video/nvidia.ko"
    # what the p2p-module stage leaves (the simulator's module file, depmod, update-initramfs)
    ko.parent.mkdir(parents=True, exist_ok=True)
    ko.write_text(STOCK_KO.format(kernel=kver).replace("patched=0", "patched=1"))
    write_modules_dep(root, kver)
    write_initramfs(root, kver)
    before = image.stat().st_mtime - 3600
    os.utime(ko, (before, before))
    assert f"lib/modules/{kver}/kernel/drivers/video/nvidia.ko" in image.read_text()
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "pass", c
    later = image.stat().st_mtime + 3600
    os.utime(ko, (later, later))
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "fail" and c["pitfall"] == "P34", c
    assert f"/boot/initrd.img-{kver} is older than the installed patched module" in c["measured"]
    assert "update-initramfs -u" in c["hint"]
    # no installed module to compare with (removed by hand): no age to judge, and no crash
    ko.unlink()
    c = finding(doctor(cli, root), "field.module_sources")
    assert "older" not in c["measured"], c
    # the same age, and no nvidia.ko in the image: nothing old can load from it
    ko.write_text(STOCK_KO.format(kernel=kver).replace("patched=0", "patched=1"))
    os.utime(ko, (later, later))
    stamp = image.stat().st_mtime
    image.write_text("".join(x + "\n" for x in image.read_text().splitlines() if "nvidia" not in x))
    os.utime(image, (stamp, stamp))
    c = finding(doctor(cli, root), "field.module_sources")
    assert c["status"] == "pass", c
