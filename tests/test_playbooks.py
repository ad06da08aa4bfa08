"""The real ansible-playbook against simulated hosts: idempotence, check mode, bad checksums, lint."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from p2pkit.app.pipeline import Ctx
from p2pkit.core import ansible, config
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import P2pkitError
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.stages.driver import act as driver_act
from p2pkit.stages.p2p_module import act as acting
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def ctx_for(root: Path, profile=None) -> Ctx:
    host = Host.at(root)
    prof = profile or config.load(host.sim["profile"])
    return Ctx(profile=prof, host=host, store=Store(root / "var/lib/p2pkit"), out=Output())


def tree_digest(root: Path) -> dict[str, str]:
    skip = (".p2pkit-sim", "var/lib/p2pkit", "proc", "sys")
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and not p.is_symlink() and not rel.startswith(skip):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_driver_and_p2p_playbooks_are_idempotent_and_check_mode_is_clean(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    first = driver_act.driver(ctx)
    assert first["changed"] > 0 and first["failed"] == 0
    second = driver_act.driver(ctx)
    assert second["changed"] == 0, second
    p1 = acting.p2p_module(ctx)
    assert p1["changed"] > 0
    p2 = acting.p2p_module(ctx)
    assert p2["changed"] == 0, p2
    before = tree_digest(root)
    for stage in ("driver", "p2p-module"):
        extra = json.loads((ctx.store.dir / "logs" / f"{stage}.vars.json").read_text())
        res = ansible.run_playbook(ctx, stage, extra, check_mode=True)
        assert res["changed"] == 0 and res["check_mode"], res
    assert tree_digest(root) == before


def stock_driver_repository(where: Path) -> Path:
    """A local apt repository (file:) holding a stand-in of Ubuntu's nvidia-driver-580, built with the
    real dpkg-deb; its Packages index written in apt's own format from the package's control file."""
    pkg = where / "src"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN/control").write_text("Package: nvidia-driver-580\nVersion: 580.95.05-0ubuntu1\nArchitecture: "
                                        "amd64\nMaintainer: p2pkit tests <dev@p2pkit>\nDescription: stand-in for "
                                        "Ubuntu's nvidia-driver-580\n")
    deb = where / "nvidia-driver-580_580.95.05-0ubuntu1_amd64.deb"
    subprocess.run(["dpkg-deb", "-Zgzip", "--build", str(pkg), str(deb)], check=True, capture_output=True)
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    (where / "Packages").write_text(f"{control.rstrip()}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\n"
                                    f"SHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}\n\n")
    return where


def test_what_the_playbooks_leave_on_the_host(sim, tmp_path):
    root = sim("healthy")
    own_dpkg = hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest()
    repo = stock_driver_repository(tmp_path / "repo")
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")

    def real(tool, *args):  # the simulated host's dpkg and apt are this machine's real ones, on its root
        return subprocess.run([str(root / "usr/bin" / tool), *args], capture_output=True, text=True)

    assert real("apt-get", "update").returncode == 0
    assert "Candidate: 580.95.05-0ubuntu1" in real("apt-cache", "policy", "nvidia-driver-580").stdout  # no pin yet
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    acting.p2p_module(ctx)
    state = json.loads((root / ".p2pkit-sim/state.json").read_text())
    assert state["driver"]["userspace"] == "615.71.09"
    # the pin, judged by the real apt: the stock driver has no candidate, and an install is refused
    policy = real("apt-cache", "policy", "nvidia-driver-580").stdout
    assert "Candidate: (none)" in policy and "580.95.05-0ubuntu1 -1" in policy, policy
    install = real("apt-get", "install", "-y", "nvidia-driver-580")
    assert install.returncode == 100 and "has no installation candidate" in install.stderr, install.stderr
    # the holds, set by ansible's dpkg_selections and read back by the real dpkg
    selections = dict(ln.split() for ln in real("dpkg", "--get-selections").stdout.splitlines())
    assert selections["nvidia-firmware-580-580.95.05"] == "hold"  # installed nvidia packages are held
    assert selections["libnvidia-cfg1-580"] == "deinstall"  # removed (rc), nothing to hold
    assert real("apt-mark", "showhold").stdout.split() == ["nvidia-firmware-580-580.95.05"]
    assert hashlib.sha256(Path("/var/lib/dpkg/status").read_bytes()).hexdigest() == own_dpkg  # this machine's
    assert "Package-Blacklist" in (root / "etc/apt/apt.conf.d/51p2pkit-unattended-upgrades").read_text()
    assert "blacklist nouveau" in (root / "etc/modprobe.d/p2pkit-blacklist-nouveau.conf").read_text()
    assert state["initramfs_updates"] == 2  # the driver (nouveau blacklisted), the p2p module (P28, P34)
    assert "RMForceStaticBar1=1" in (root / "etc/modprobe.d/p2pkit-nvidia.conf").read_text()
    ko = root / "lib/modules/6.8.0-88-generic/kernel/drivers/video/nvidia.ko"
    assert "version=615.71.09" in ko.read_text() and "patched=1" in ko.read_text()
    assert "iommu=pt" in state["next_cmdline"]


def test_wrong_checksum_stops_before_anything_runs_and_keeps_the_file(sim):
    root = sim("healthy")
    good = config.load(Host.at(root).sim["profile"])
    from dataclasses import replace

    bad = replace(good, driver=replace(good.driver, installer_sha256="0" * 64))
    ctx = ctx_for(root, bad)
    with pytest.raises(P2pkitError) as e:
        driver_act.driver(ctx)
    assert "not the pinned 000000" in e.value.message
    name = good.driver.installer_url.rsplit("/", 1)[-1]
    assert (root / "var/cache/p2pkit" / f"{name}.rejected").is_file()
    assert not (root / "var/cache/p2pkit" / name).exists()
    assert not list((root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so.*")) \
        if (root / "usr/lib/x86_64-linux-gnu").exists() else True


def test_missing_kernel_headers_named(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    shutil.rmtree(root / "lib/modules/6.8.0-88-generic/build")
    with pytest.raises(P2pkitError) as e:
        acting.p2p_module(ctx)
    assert "kernel headers for 6.8.0-88-generic are missing" in e.value.message
    assert "install linux-headers-6.8.0-88-generic" in e.value.message


def test_kernel_too_new_for_the_branch_named(sim):
    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    from p2pkit.sim import provision

    provision.make_headers(root, "7.2.0-3-generic")
    with pytest.raises(P2pkitError) as e:
        acting.p2p_module(ctx, kernel="7.2.0-3-generic")
    # the compiler's error, found before make's exit lines (which end the output and name only the target)
    assert "the build's errors: " in e.value.message
    assert "error: too few arguments to function \u2018pci_resize_resource\u2019" in e.value.message
    assert "likely cause: the kernel is newer than the fork's branch supports" in e.value.hint


def test_debian_headers_build_with_the_source_tree_given_apart(sim):
    """Debian's headers split the kernel's tree: /lib/modules/K/source holds the headers, build/ only the
    flavour's output. The fork's conftest finds no header under SYSSRC=build alone (the real build failed so:
    tests/fixtures/fork-570.86.16-p2p/fail-syssrc-build.stderr); the role gives SYSSRC=source SYSOUT=build."""
    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    from p2pkit.sim import provision

    provision.make_headers(root, "6.1.0-57-amd64", split=True)
    acting.p2p_module(ctx, kernel="6.1.0-57-amd64")
    assert "P2PKIT-SIM-KO" in (root / "lib/modules/6.1.0-57-amd64/kernel/drivers/video/nvidia.ko").read_text()


def test_a_new_kernel_rebuilds_kernel_open_only_and_a_new_commit_everything(sim):
    """The fork's OS-agnostic cores (src/nvidia, src/nvidia-modeset: two thirds of the real build's CPU time,
    tests/fixtures/fork-570.86.16-p2p/README.md) do not depend on the kernel: a build of the pinned commit
    for another kernel cleans kernel-open/ alone (the fork's kernel-open.clean); a new commit cleans all."""
    from dataclasses import replace

    from p2pkit.core.config import p2p_src_dir
    from p2pkit.sim import provision

    root = sim("healthy")
    ctx = ctx_for(root)
    driver_act.driver(ctx)
    acting.p2p_module(ctx)
    log = root / p2p_src_dir(ctx.profile).lstrip("/") / ".sim-make.log"
    provision.make_headers(root, "6.8.0-90-generic")
    acting.p2p_module(ctx, kernel="6.8.0-90-generic")
    assert [x.split()[0] for x in log.read_text().splitlines()] == \
        ["modules", "modules_install", "kernel-open.clean", "modules", "modules_install"]
    # the same fork at another commit: everything is built again from clean
    fork = Path(ctx.profile.p2p_module.repo.removeprefix("file://"))
    work = fork.parent / "work"
    (work / "kernel-open/nv-pci.c").write_text("/* SIMULATED: a later commit */\n")
    provision._git(work, "commit", "-q", "-am", "later")
    provision._git(work, "push", "-q", str(fork), f"HEAD:{ctx.profile.p2p_module.branch}")
    commit = provision._git(work, "rev-parse", "HEAD")
    ctx = replace(ctx, profile=replace(ctx.profile, p2p_module=replace(ctx.profile.p2p_module, commit=commit)))
    log.write_text("")
    acting.p2p_module(ctx, kernel="6.8.0-90-generic")
    assert log.read_text().split()[0] == "clean"


def test_syntax_check():
    for book in ("site.yml", "driver.yml", "p2p-module.yml"):
        argv = [ansible.playbook_binary(), "--syntax-check", "-i", "localhost,", str(REPO / "playbooks" / book)]
        env = {"ANSIBLE_CONFIG": str(REPO / "playbooks/ansible.cfg"), "PATH": "/usr/bin:/bin", "HOME": "/tmp"}
        r = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile():
    lint = Path(sys.executable).parent / "ansible-lint"
    if not lint.exists():
        pytest.skip("ansible-lint not installed (pip install 'p2pkit[test]')")
    # the playbooks' own configuration: its collections_path finds the collection p2pkit.host beside them
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "playbooks/ansible.cfg")}
    r = subprocess.run([str(lint), "--offline", "--profile", "production", "playbooks/"], cwd=REPO,
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_driver_on_an_aarch64_spark_node_installs_once(sim):
    """A simulated DGX Spark node is an aarch64 host: `uname -m`, NVIDIA's aarch64 installer, the
    library in /usr/lib/aarch64-linux-gnu; the role's "already installed" guard looks there, so a
    second run changes nothing (it named the x86_64 path and ran the installer on every `up`)."""
    root = sim("spark-head")
    assert subprocess.run([str(root / "usr/bin/uname"), "-m"], capture_output=True, text=True).stdout == "aarch64\n"
    ctx = ctx_for(root)
    assert ctx.profile.driver.installer_url.endswith("/NVIDIA-Linux-aarch64-615.71.09.run")
    assert driver_act.driver(ctx)["changed"] > 0
    assert (root / "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.615.71.09").is_file()
    assert not (root / "usr/lib/x86_64-linux-gnu").exists()
    second = driver_act.driver(ctx)
    assert second["changed"] == 0, second
    log = (ctx.store.dir / "logs/driver.log").read_text()
    assert "Ensure the userspace driver is installed without kernel modules" in log
    from p2pkit.facts import collect as facts
    from p2pkit.stages.driver import checks as driver_checks

    checks = {c.id: c for c in driver_checks.check(facts.collect(ctx.host, ["userspace_driver", "driver_guards",
                                                                            "arch"]), ctx.profile)}
    assert checks["driver.installer_arch"].status == "pass" and checks["driver.userspace_version"].status == "pass"


def test_the_failure_named_is_the_one_that_stopped_the_run_not_one_a_rescue_caught():
    from p2pkit.core.ansible import failed_task

    log = ("TASK [r : Download the installer and check its pinned sha256] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "The checksum did not match"}\n'
           "TASK [r : Keep the download with the wrong checksum aside] ***\nchanged: [localhost]\n"
           "TASK [r : Stop on a wrong checksum] ***\n"
           'fatal: [localhost]: FAILED! => {"msg": "has sha256 ab, not the pinned 00"}\n'
           "TASK [r : Hold packages] ***\n"
           'failed: [localhost] (item=a) => {"msg": "no such package a"}\n'
           'fatal: [localhost]: FAILED! => {"msg": "One or more items failed"}\n')
    assert failed_task(log) == "task 'r : Hold packages': no such package a"  # a loop: its first item's failure
    assert failed_task(log.split("TASK [r : Hold")[0]) == "task 'r : Stop on a wrong checksum': " \
                                                          "has sha256 ab, not the pinned 00"
