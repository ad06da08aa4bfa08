"""Condition guards for the preflight stage (bench/check_guard.py --conditions --only preflight): each
condition of p2pkit.stages.preflight.checks judged on the facts where it decides the finding, the check
function called directly with typed facts (p2pkit.facts.types) and the built-in profiles, so a condition
replaced by True or by False changes a status, a measured or expected text or a hint asserted here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from p2pkit.core import config
from p2pkit.stages.preflight import checks as preflight

P = config.load(None)  # dual-5090-ninfer: ubuntu 24.04, kernel >= 6.8, 150 GiB, root, 2x RTX 5090 (0x2b85)
LLAMA = config.load("dual-5090-llamacpp")
SPARK = config.load("dual-spark-vllm")
GIB = 1 << 30
ERR = {"error": "permission denied"}
GPU = {"bdf": "0000:01:00.0", "device_id": "0x2b85", "name": "NVIDIA GeForce RTX 5090", "iommu_group": "passthrough"}
GPU2 = {**GPU, "bdf": "0000:81:00.0"}
IOMMU_PT = {"intent": "passthrough", "detail": "iommu=pt", "cmdline_tokens": ["iommu=pt"], "cpu_vendor": "AuthenticAMD"}
IOMMU_DEFAULT = {"intent": "default", "detail": "no IOMMU option on the kernel command line", "cmdline_tokens": [],
                 "cpu_vendor": "GenuineIntel"}


def host(p=P, **kw):
    return replace(p, host=replace(p.host, **kw))


def gpus(p=P, **kw):
    return replace(p, gpus=replace(p.gpus, **kw))


def pinned(p=P, **engine):
    """The profile with the driver's installer and the fork's commit pinned (the engine as given)."""
    return replace(p, driver=replace(p.driver, installer_sha256="a" * 64),
                   p2p_module=replace(p.p2p_module, commit="b" * 40), engine=replace(p.engine, **engine))


# ------------------------------------------------------------------------------------------ check

def test_the_bootloader_finding_only_where_the_fact_was_recorded():
    base = {"os": {"ID": "ubuntu", "VERSION_ID": "24.04"}, "kernel": "6.8.0-45-generic", "is_root": True,
            "disk": {"path": "/var/lib", "free_bytes": 500 * GIB}, "secure_boot": "off", "pci_gpus": [GPU, GPU2],
            "iommu": IOMMU_PT, "dpkg_nvidia": [], "cgroup": {"v2_path": "/", "v1_memory_path": None,
                                                           "memory_caps": []}, "tools": {}}
    ids = [c.id for c in preflight.check(base, P)]
    assert "preflight.bootloader" not in ids and ids[0] == "preflight.gpu_count"
    with_loader = preflight.check({**base, "bootloader": {"name": "grub", "why": "/etc/default/grub"}}, P)
    loader = {c.id: c for c in with_loader}["preflight.bootloader"]
    assert loader.status == "pass" and loader.measured.startswith("grub (/etc/default/grub)")
    assert len(with_loader) == len(ids) + 1


# ------------------------------------------------------------------------------------------- pins

def test_pins_all_set():
    c = preflight._pins(pinned(commit="c" * 40))
    assert (c.id, c.status, c.measured, c.hint) == ("preflight.pins", "pass", "all pinned", "")


def test_pins_each_empty_pin_named_with_the_pin_line():
    c = preflight._pins(P)
    assert c.status == "fail"
    assert c.measured == ("empty: driver.installer_sha256 (driver), p2p_module.commit (p2p-module), "
                          "engine.commit (engine)")
    assert "`p2pkit pin --installer https://us.download.nvidia.com/" in c.hint
    assert "--fork-remote --engine-remote --out ./dual-5090-ninfer.toml --yes`" in c.hint
    assert "engine.source_sha256 is yours to set" not in c.hint


def test_pins_an_unpinned_source_archive_is_the_owners_to_set():
    c = preflight._pins(pinned(LLAMA, source_sha256=""))
    assert c.status == "fail" and c.measured == "empty: engine.source_sha256 (engine)"
    assert c.hint.endswith("; engine.source_sha256 is yours to set: the sha256 of the source archive you reviewed")
    only_fork = preflight._pins(replace(LLAMA, driver=replace(LLAMA.driver, installer_sha256="a" * 64)))
    assert only_fork.status == "fail" and only_fork.measured == "empty: p2p_module.commit (p2p-module)"
    assert "--fork-remote" in only_fork.hint and "engine.source_sha256" not in only_fork.hint


# ------------------------------------------------------------------------------------------ tools

ALL_TOOLS = {t: f"/usr/bin/{t}" for t in preflight.TOOL_NEEDS}


def test_tools_all_found():
    c = preflight._tools({"tools": ALL_TOOLS}, P)
    assert (c.id, c.status, c.measured, c.hint) == ("preflight.tools", "pass", "all found", "")
    assert c.expected == "every tool a later stage runs: " + ", ".join(preflight.TOOL_NEEDS)


def test_tools_a_missing_one_named_with_its_package():
    c = preflight._tools({"tools": {**ALL_TOOLS, "ninja": None}}, P)
    assert c.status == "fail" and c.measured == "missing: ninja (engine: build)"
    assert c.hint == "install them before anything runs: `sudo apt-get install -y ninja-build`"


@pytest.mark.parametrize("fact, status, measured", [
    (None, "skip", "could not determine: not recorded"),
    (ERR, "fail", "could not determine: permission denied"),
    ("which: not run", "fail", "could not determine: which: not run"),
])
def test_tools_unread(fact, status, measured):
    f = {} if fact is None else {"tools": fact}
    c = preflight._tools(f, P)
    assert (c.id, c.status, c.measured) == ("preflight.tools", status, measured)


# --------------------------------------------------------------------------------------------- os

@pytest.mark.parametrize("os_, allow, status, measured", [
    ({"ID": "ubuntu", "VERSION_ID": "24.04"}, False, "pass", "ubuntu 24.04"),
    ({"ID": "ubuntu", "VERSION_ID": "24.04"}, True, "pass", "ubuntu 24.04"),
    ({"ID": "debian", "VERSION_ID": "12"}, False, "fail", "debian 12"),
    ({"ID": "debian", "VERSION_ID": "12"}, True, "warn", "debian 12"),
    (ERR, False, "fail", "could not determine: permission denied"),
])
def test_os(os_, allow, status, measured):
    c = preflight._os({"os": os_}, host(allow_other_os=allow))
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.os", status, measured, "ubuntu 24.04")
    if status == "warn":
        assert c.hint.startswith("host.allow_other_os is set")
    elif status == "fail" and not measured.startswith("could not"):
        assert "set host.allow_other_os = true" in c.hint
    elif status == "pass":
        assert c.hint == ""


# ----------------------------------------------------------------------------------------- kernel

@pytest.mark.parametrize("k, status, measured", [
    ("6.8.0-45-generic", "pass", "6.8.0-45-generic"),
    ("6.17.0-5-generic", "pass", "6.17.0-5-generic"),
    ("5.15.0-91-generic", "fail", "5.15.0-91-generic"),
    (ERR, "fail", "could not determine: permission denied"),
])
def test_kernel(k, status, measured):
    c = preflight._kernel({"kernel": k}, P)
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.kernel", status, measured, ">= 6.8")


# ------------------------------------------------------------------------------------------- root

@pytest.mark.parametrize("r, required, status, expected", [
    (True, True, "pass", True),
    (False, True, "fail", True),
    (True, False, "pass", "root (not required)"),
    (False, False, "warn", "root (not required)"),
    (ERR, True, "fail", True),
])
def test_root(r, required, status, expected):
    c = preflight._root({"is_root": r}, host(require_root=required))
    assert (c.id, c.status, c.expected) == ("preflight.root", status, expected)
    assert c.measured == ("could not determine: permission denied" if r is ERR else r)


# ------------------------------------------------------------------------------------------- disk

def test_disk():
    c = preflight._disk({"disk": {"path": "/var/lib", "free_bytes": 100 * GIB}}, P)
    assert (c.id, c.status, c.value, c.measured) == ("preflight.disk", "fail", 100.0, "100.0 GiB (free under /var/lib)")
    assert c.hint.startswith("free at least 50.0 GiB more under /var/lib")
    u = preflight._disk({"disk": ERR}, P)
    assert (u.status, u.measured, u.expected) == ("fail", "could not determine: permission denied", ">= 150 GiB free")


# ------------------------------------------------------------------------------------ secure boot

MOK = {"needed": True, "key": "/var/lib/p2pkit/mok/p2pkit.key", "cert": "/var/lib/p2pkit/mok/p2pkit.der",
       "key_exists": True, "cert_exists": True,
       "sign_file": "/usr/src/linux-headers-6.8.0-45-generic/scripts/sign-file", "mokutil": True,
       "password_given": False, "kernel": "6.8.0-45-generic"}
SB_WANT = "off, or a signing key p2pkit can enrol"
CERT = MOK["cert"]


@pytest.mark.parametrize("sb, status, measured, expected", [
    ("off", "pass", "off", "off"),
    ("legacy-bios", "pass", "legacy-bios", "off"),
    (ERR, "skip", "could not determine: permission denied", "off"),
])
def test_secure_boot_off_or_unread(sb, status, measured, expected):
    c = preflight._secure_boot({"secure_boot": sb, "mok": {"needed": False}}, P)
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.secure_boot", status, measured, expected)


@pytest.mark.parametrize("mok, status, measured, hint_has", [
    (None, "fail", "could not determine: not read", "fix the cause"),
    (ERR, "fail", "could not determine: permission denied", "fix the cause"),
    ({**MOK, "sign_file": None}, "fail", "on; no scripts/sign-file in the headers of 6.8.0-45-generic",
     "install linux-headers-6.8.0-45-generic"),
    ({**MOK, "mokutil": False}, "fail", "on; mokutil is not installed", "sudo apt-get install mokutil; "),
    ({**MOK, "cert_error": "openssl: bad certificate"}, "fail", "on; openssl: bad certificate", "mokutil --import"),
    ({**MOK, "enrolment": "enrolled"}, "pass", f"on; key {CERT} enrolled", ""),
    ({**MOK, "enrolment": "in-db"}, "pass", f"on; key {CERT} enrolled", ""),
    ({**MOK, "enrolment": "queued"}, "warn", f"on; key {CERT} queued for enrolment", "MokManager enrols it"),
    ({**MOK, "enrolment": "not-enrolled", "password_given": True}, "warn",
     f"on; key {CERT} not enrolled: p2pkit queues its enrolment (P2PKIT_MOK_PASSWORD is set)", "mokutil --import"),
    ({**MOK, "cert_exists": False, "key_exists": False, "password_given": True}, "warn",
     "on; no key yet: p2pkit queues its enrolment (P2PKIT_MOK_PASSWORD is set)", "mokutil --import"),
    ({**MOK, "enrolment": "not-enrolled"}, "fail",
     f"on; key {CERT} not enrolled and no enrolment password (P2PKIT_MOK_PASSWORD)", "mokutil --import"),
    ({**MOK, "cert_exists": False, "key_exists": False}, "fail",
     "on; no signing key yet and no enrolment password (P2PKIT_MOK_PASSWORD)", "mokutil --import"),
])
def test_secure_boot_on(mok, status, measured, hint_has):
    f = {"secure_boot": "on"} if mok is None else {"secure_boot": "on", "mok": mok}
    c = preflight._secure_boot(f, P)
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.secure_boot", status, measured, SB_WANT)
    assert hint_has in c.hint if hint_has else c.hint == ""


# ------------------------------------------------------------------------------------- GPU count

def test_gpu_count():
    c = preflight._gpu_count({"pci_gpus": [GPU, GPU2]}, P)
    assert (c.id, c.status, c.value, c.measured) == ("preflight.gpu_count", "pass", 2,
                                                     "2 (0000:01:00.0, 0000:81:00.0)")
    one = preflight._gpu_count({"pci_gpus": [GPU]}, P)
    assert (one.status, one.value, one.measured) == ("fail", 1, "1 (0000:01:00.0)")
    assert one.hint.startswith("the profile expects 2 GPU(s) and P2P needs two")
    none = preflight._gpu_count({"pci_gpus": []}, P)
    assert (none.status, none.value, none.measured) == ("fail", 0, "0")
    assert none.hint.startswith("no NVIDIA GPU was found") and "p2pkit sim init" in none.hint
    u = preflight._gpu_count({"pci_gpus": ERR}, P)
    assert (u.status, u.measured, u.expected) == ("fail", "could not determine: permission denied", 2)


# ------------------------------------------------------------------------------------- GPU model

H200 = {**GPU, "device_id": "0x2335", "name": "NVIDIA H200"}


@pytest.mark.parametrize("gpus_, ids, status, measured", [
    ([GPU, GPU2], ["0x2b85"], "pass", "NVIDIA GeForce RTX 5090 (0x2b85)"),
    ([H200], ["0x2b85"], "fail", "NVIDIA H200 (0x2335)"),
    ([GPU, H200], ["0x2b85"], "fail", "NVIDIA GeForce RTX 5090, NVIDIA H200 (0x2335, 0x2b85)"),
    ([GPU, H200], ["0x2b85", "0x2335"], "pass", "NVIDIA GeForce RTX 5090, NVIDIA H200 (0x2335, 0x2b85)"),
    ([H200], [], "pass", "NVIDIA H200 (0x2335)"),
    ([{**GPU, "device_id": None}], ["0x2b85"], "fail", "NVIDIA GeForce RTX 5090 (?)"),
    ([], ["0x2b85"], "skip", "no GPU to judge"),
    (ERR, ["0x2b85"], "skip", "no GPU to judge"),
])
def test_gpu_model(gpus_, ids, status, measured):
    c = preflight._gpu_model({"pci_gpus": gpus_}, gpus(pci_device_ids=ids))
    want = "NVIDIA GeForce RTX 5090 (" + (", ".join(ids) or "any id") + ")"
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.gpu_model", status, measured, want)


# ----------------------------------------------------------------------------------------- IOMMU

@pytest.mark.parametrize("io, gpus_, status, measured", [
    (IOMMU_PT, [GPU, GPU2], "pass", "command line: passthrough (iommu=pt); GPUs: passthrough"),
    (IOMMU_DEFAULT, [{**GPU, "iommu_group": "none"}, {**GPU2, "iommu_group": "passthrough"}], "pass",
     "command line: default (no IOMMU option on the kernel command line); GPUs: none, passthrough"),
    ({**IOMMU_DEFAULT, "intent": "translating", "detail": "intel_iommu=on"}, [{**GPU, "iommu_group": "none"}], "warn",
     "command line: translating (intel_iommu=on); GPUs: none"),
    (IOMMU_DEFAULT, [{**GPU, "iommu_group": "translating"}], "warn",
     "command line: default (no IOMMU option on the kernel command line); GPUs: translating"),
    (IOMMU_PT, [], "pass", "command line: passthrough (iommu=pt); GPUs: n/a"),
    (IOMMU_PT, ERR, "pass", "command line: passthrough (iommu=pt); GPUs: n/a"),
])
def test_iommu(io, gpus_, status, measured):
    c = preflight._iommu({"iommu": io, "pci_gpus": gpus_}, P)
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.iommu", status, measured,
                                                        "passthrough (the p2p-module stage sets it)")
    assert ("IO_PAGE_FAULT" in c.hint and "iommu=pt" in c.hint) if status == "warn" else c.hint == ""


def test_iommu_unread():
    c = preflight._iommu({"iommu": ERR, "pci_gpus": [GPU]}, P)
    assert (c.status, c.measured) == ("skip", "could not determine: permission denied")


# ------------------------------------------------------------------------------------ bootloader

@pytest.mark.parametrize("name, how", sorted(preflight.BOOTLOADER_TAKES.items()))
def test_bootloader_known(name, how):
    c = preflight.bootloader({"bootloader": {"name": name, "why": "found"}, "iommu": IOMMU_DEFAULT}, P)
    assert (c.id, c.status, c.hint) == ("preflight.bootloader", "pass", "")
    assert c.measured == f"{name} (found): the IOMMU option goes into {how}"


@pytest.mark.parametrize("io, status", [(IOMMU_PT, "pass"), (IOMMU_DEFAULT, "fail"), (ERR, "fail")])
def test_bootloader_unknown(io, status):
    b = {"name": "unknown", "why": "no GRUB, systemd-boot or kernelstub found"}
    c = preflight.bootloader({"bootloader": b, "iommu": io}, P)
    assert (c.id, c.status, c.expected) == ("preflight.bootloader", status, "GRUB, systemd-boot or kernelstub")
    if status == "pass":
        assert c.measured == f"unknown: {b['why']}; the running command line already has the IOMMU option"
        assert c.hint == ""
    else:
        assert c.measured == f"unknown: {b['why']}" and c.hint.startswith("p2pkit cannot set the kernel command line")


def test_bootloader_unread():
    c = preflight.bootloader({"bootloader": ERR, "iommu": IOMMU_PT}, P)
    assert (c.status, c.measured) == ("fail", "could not determine: permission denied")


# ------------------------------------------------------------------------------------------ dpkg

@pytest.mark.parametrize("d, status, measured", [
    ([], "pass", "none"),
    ([{"package": "nvidia-dkms-580", "status": "install ok half-configured"},
      {"package": "nvidia-utils-580", "status": "install ok unpacked"}], "fail",
     "nvidia-dkms-580 (install ok half-configured), nvidia-utils-580 (install ok unpacked)"),
    (None, "skip", "no dpkg database"),
    (ERR, "skip", "could not determine: permission denied"),
])
def test_dpkg(d, status, measured):
    c = preflight._dpkg({"dpkg_nvidia": d})
    assert (c.id, c.status, c.measured, c.expected) == ("preflight.nvidia_packages", status, measured, "none")
    assert "dpkg --configure -a" in c.hint if status == "fail" else c.hint == ""


# ---------------------------------------------------------------------------------------- cgroup

def test_cgroup_the_tightest_cap_first():
    caps = [{"file": "/sys/fs/cgroup/a/memory.max", "limit_bytes": 64 * GIB},
            {"file": "/sys/fs/cgroup/a/b/memory.max", "limit_bytes": 8 * GIB}]
    c = preflight._cgroup({"cgroup": {"v2_path": "/a/b", "v1_memory_path": None, "memory_caps": caps}}, P)
    assert (c.id, c.status, c.value, c.unit, c.pitfall) == ("preflight.cgroup", "warn", 8.0, "GiB", "P12")
    assert c.measured == "/sys/fs/cgroup/a/b/memory.max = 8.0 GiB, /sys/fs/cgroup/a/memory.max = 64.0 GiB"


def test_cgroup_no_cap_and_unread():
    c = preflight._cgroup({"cgroup": {"v2_path": "/", "v1_memory_path": None, "memory_caps": []}}, P)
    assert (c.status, c.value, c.measured, c.hint) == ("pass", None, "no memory cap", "")
    u = preflight._cgroup({"cgroup": ERR}, P)
    assert (u.status, u.measured, u.pitfall) == ("skip", "could not determine: permission denied", "P12")


@pytest.mark.parametrize("manager,booted,says", [
    ("auto", True, "the engine runs as a system service in its own slice"),
    ("auto", False, "systemd is not PID 1 here, so p2pkit's launcher starts the engine in a memory cgroup of its own"),
    ("auto", None, "its systemd slice, or where systemd is not PID 1 the one p2pkit's launcher makes"),
    ("launcher", True, "p2pkit's launcher starts the engine in a memory cgroup of its own"),
    ("systemd", False, "the engine runs as a system service in its own slice"),
])
def test_cgroup_fix_says_where_the_engine_will_run(manager, booted, says):
    """The fix names the engine's cgroup as the host will give it: a systemd slice where systemd is PID 1,
    the launcher's own cgroup where it is not (serve.manager forces either); a recording without the
    reading names both."""
    cg = {"v2_path": "/a", "v1_memory_path": None, "memory_caps": [{"file": "/sys/fs/cgroup/a/memory.max",
                                                                     "limit_bytes": 8 * GIB}]}
    if booted is not None:
        cg["systemd_booted"] = booted
    c = preflight._cgroup({"cgroup": cg}, replace(P, serve=replace(P.serve, manager=manager)))
    assert c.status == "warn" and says in c.hint, c.hint
    assert ("slice" in c.hint) == ("launcher" not in says or booted is None)  # never both stories but unread
