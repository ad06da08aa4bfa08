"""The container host: a real operating system under p2pkit, only the GPUs stood in.

A Debian root made from Debian's own packages (mmdebstrap) is booted with systemd as PID 1 in a
container (`systemd-nspawn -b --register=no --keep-unit`: this machine kind runs no systemd of its
own, so there is no machined to register with). p2pkit is installed inside it from a wheel of this
tree and run there as root on `/`, as `sudo p2pkit up` runs on a real box: its Ansible connection is
local and every command it runs is the root's own real tool (systemd and journald, dpkg and apt with
their hooks, the kernel's postinst hooks run by a real dpkg install of a kernel package, kbuild
against real headers, sign-file, modinfo, depmod, initramfs-tools, GRUB's grub-mkconfig). Why not
Ansible over ssh into the container: a real box runs p2pkit on itself; the inventory path, which does
go over ssh, is tested against a real sshd elsewhere (tests/test_inventory.py).

What stays simulated is what needs a GPU, its firmware or the running kernel, done inside the root
by p2pkit/sim/guest.py (docs/container-host.md lists each with why): the GPUs' PCI functions and BARs
in sysfs, NVML and nvidia-smi, the GPU-facing part of NVIDIA's .run installer, loading a module into
the kernel (modprobe and rmmod's last step), the running kernel's release (uname -r) and command
line after a reboot (read from the real grub.cfg), the disk GRUB probes, and EFI variables (mokutil).

A container host lives in one directory:
  DIR/root           the root: an overlay of the cached image (below) and this host's own changes
  DIR/upper, work    the overlay's writable layer
  DIR/machine.json   the machine: its supervisor, the running container's pids, the boot count
  DIR/logs/          each boot's console and the supervisor's log

The image is made once per recipe and cached (P2PKIT_CT_CACHE, else ~/.cache/p2pkit-tests/container),
keyed by a digest of the recipe: the packages, the setup script, p2pkit's pinned runtime dependencies.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

SUITE = "bookworm"
MIRRORS = (f"deb http://deb.debian.org/debian {SUITE} main",
           f"deb http://deb.debian.org/debian {SUITE}-updates main",
           f"deb http://deb.debian.org/debian-security {SUITE}-security main")
# What the image holds besides minbase: systemd as PID 1 with dbus and logind; Python for p2pkit's venv;
# kmod, initramfs-tools and GRUB's scripts; what the p2p-module and engine roles install when dpkg lacks
# it (build-essential, git, CMake, Ninja, pkg-config, libcurl's headers: a box that builds has them, and
# the root has no package lists to install from); openssl for the signing key; apt-utils for the local
# repository the kernel upgrade installs from. The kernels are chosen inside (SETUP below).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "libpam-systemd", "python3", "python3-venv", "iproute2", "kmod",
            "procps", "psmisc", "ca-certificates", "initramfs-tools", "zstd", "grub-common", "grub2-common",
            "build-essential", "git", "cmake", "ninja-build", "pkg-config", "libcurl4-openssl-dev", "openssl",
            "apt-utils")
DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
VENV = "/opt/p2pkit"
SIM_DIR = "/var/lib/p2pkit-sim"  # in the root: the image's manifest, the local apt repository
MANIFEST = f"{SIM_DIR}/image.json"
APT_REPO = f"{SIM_DIR}/apt-repo"
UPGRADE_SOURCES = "/etc/apt/sources.list.d/p2pkit-sim-upgrade.list"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's root PATH (login.defs)
REBOOT_EXIT = 133  # systemd-nspawn's exit status when the container asked for a reboot

# grub-probe maps a path to the block device, filesystem and partition GRUB must read at boot. In a
# container the root is an overlay on no block device of its own, and the real grub-probe says so:
#   grub-probe: error: failed to get canonical path of `overlay'.
# (recorded on this image: docs/container-host.md). This stand-in answers for the disk a real box has
# (an ext4 root on the second GPT partition of its first disk), so the real grub-mkconfig and its
# /etc/grub.d scripts run on; the real grub-probe stays beside it, moved aside by dpkg-divert --rename
# (to grub-probe.distrib, dpkg-divert's own name for it: `dpkg-divert --list` says so on the image).
GRUB_PROBE = r"""#!/bin/sh
# SIMULATED grub-probe (p2pkit container host): the disk a real box has; the real one is
# /usr/sbin/grub-probe.distrib (dpkg-divert), which fails in a container: "failed to get canonical path".
target=device
for a in "$@"; do
  case "$a" in
    --target=*) target="${a#--target=}" ;;
  esac
done
prev=
for a in "$@"; do
  [ "$prev" = "-t" ] && target="$a"
  prev="$a"
done
case "$target" in
  device) echo /dev/vda2 ;;
  disk) echo /dev/vda ;;
  fs) echo ext2 ;;
  fs_uuid) echo 5d0c7a51-3b7e-4c1a-9f0e-2a6b8d4e1c07 ;;
  fs_label) echo ;;
  partuuid) echo 0f3c5b2e-8d41-4a6f-b1e2-7c9d0a3e5f12 ;;
  partmap) echo gpt ;;
  abstraction|cryptodisk_uuid|msdos_parttype) ;;
  drive) echo '(hd0,gpt2)' ;;
  compatibility_hint) echo 'hd0,gpt2' ;;
  hints_string) echo '--hint-bios=hd0,gpt2 --hint-efi=hd0,gpt2 --hint-baremetal=ahci0,gpt2' ;;
  gpt_parttype) echo 0fc63daf-8483-4772-8e79-3d69d8477de4 ;;
  *) echo "grub-probe: error: unknown target \`$target' (SIMULATED grub-probe)" >&2; exit 1 ;;
esac
"""

# Run inside the new root (mmdebstrap's customize hook, chrooted) after the packages above are in.
SETUP = r"""set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
# A container has no root device for initramfs-tools' MODULES=dep to find; MODULES=list builds the
# image from /etc/initramfs-tools/modules (and every hook p2pkit adds) in seconds.
mkdir -p /etc/initramfs-tools/conf.d
echo MODULES=list > /etc/initramfs-tools/conf.d/p2pkit-sim.conf
# The two newest 6.1 cloud kernels: the older one is installed and boots; the newer one's packages wait
# in a local apt repository for the kernel upgrade (a real `apt-get install` of it runs the real hooks).
abis=$(apt-cache pkgnames linux-image-6.1.0- | sed -n 's/^linux-image-\(6\.1\.0-[0-9]*\)-cloud-amd64$/\1/p' \
       | sort -V | tail -n 2)
old=$(echo "$abis" | head -n 1)
new=$(echo "$abis" | tail -n 1)
[ -n "$old" ] && [ "$old" != "$new" ] || { echo "no two 6.1 cloud kernels in the archive: $abis" >&2; exit 1; }
apt-get install -y -q "linux-image-$old-cloud-amd64" "linux-headers-$old-cloud-amd64"
mkdir -p @APT_REPO@/partial
apt-get install -y -q --download-only -o Dir::Cache::Archives=@APT_REPO@ \
    "linux-image-$new-cloud-amd64" "linux-headers-$new-cloud-amd64"
rmdir @APT_REPO@/partial
(cd @APT_REPO@ && apt-ftparchive packages . > Packages)
# GRUB's scripts, with grub-probe answering for the disk (see p2pkit/sim/container.py)
dpkg-divert --local --rename --add /usr/sbin/grub-probe
cp /tmp/p2pkit-image/grub-probe /usr/sbin/grub-probe
chmod 755 /usr/sbin/grub-probe
mkdir -p /boot/grub /etc/default/grub.d
[ -f /etc/default/grub ] || cp /usr/share/grub/default/grub /etc/default/grub
update-grub
# p2pkit's pinned runtime dependencies (p2pkit/requirements.lock), from wheels downloaded outside
python3 -m venv @VENV@
@VENV@/bin/pip install -q --no-index --find-links /tmp/p2pkit-image/wheels --require-hashes \
    -r /tmp/p2pkit-image/requirements.lock
ln -sf @VENV@/bin/p2pkit /usr/local/bin/p2pkit
printf '{"running_kernel": "%s-cloud-amd64", "upgrade_kernel": "%s-cloud-amd64", "suite": "@SUITE@"}\n' \
    "$old" "$new" > @MANIFEST@
""".replace("@APT_REPO@", APT_REPO).replace("@VENV@", VENV).replace("@MANIFEST@", MANIFEST).replace("@SUITE@", SUITE)


# A layer over the image: what a user installed before p2pkit came, made once per recipe and cached beside the
# image (layer-NAME-KEY, an overlay's upper directory taken as a lower one by the hosts made with it). Its
# script runs in the image (and the layers below it), not booted (systemd-nspawn without -b), with this machine's
# network: apt fetches from Debian's archive.
#   distro-nvidia: Debian's own open NVIDIA kernel module, nvidia-open-kernel-dkms (bookworm contrib; its
#     firmware-nvidia-gsp in non-free-firmware, nvidia-kernel-common and friends in non-free), installed as a user
#     enables those components and installs it. Its postinst runs the real DKMS build against the installed 6.1
#     cloud kernel's headers, which fails (tests/fixtures/distro-nvidia-dkms: pci_resize_resource() gained an
#     argument in a 6.1 stable backport): dpkg leaves the package half-configured, DKMS holds it "added". Only
#     the bookworm suite's components are added: bookworm-security carries a newer nvidia-alternative (535.309)
#     that no longer provides the nvidia-alternative-535.261.03 nvidia-open-kernel-support depends on.
#   distro-nvidia-built: over it, that one line of the package's source given the fourth argument (SIMULATED:
#     the fixed upload the archive does not carry), `dpkg --configure -a` (the package's own postinst and the
#     real DKMS build, a compile of NVIDIA's open modules: many minutes), and the user's early KMS: the distro's
#     modules listed in /etc/initramfs-tools/modules and the initramfs rebuilt with them.
DISTRO_SRC = "/usr/src/nvidia-current-open-535.261.03"
LAYERS: dict[str, tuple[str | None, str]] = {
    "distro-nvidia": (None, r"""set -u
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
echo "deb http://deb.debian.org/debian @SUITE@ contrib non-free non-free-firmware" \
    > /etc/apt/sources.list.d/debian-nonfree.list
apt-get update -q || exit 1
t0=$(date +%s)
apt-get install -y -q --no-install-recommends nvidia-open-kernel-dkms
echo "p2pkit layer: apt-get install nvidia-open-kernel-dkms exited $? after $(( $(date +%s) - t0 )) s"
dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' nvidia-open-kernel-dkms || exit 1
dkms status
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
""".replace("@SUITE@", SUITE)),
    "distro-nvidia-built": ("distro-nvidia", r"""set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
call='pci_resize_resource(pci_dev, NV_GPU_BAR1, requested_size'
sed -i "s|$call);|$call, 0); /* SIMULATED fix (p2pkit container host) */|" @SRC@/nvidia/nv-pci.c
grep -q 'SIMULATED fix' @SRC@/nvidia/nv-pci.c
t0=$(date +%s)
dpkg --configure -a
echo "p2pkit layer: dpkg --configure -a (the real DKMS build) took $(( $(date +%s) - t0 )) s"
printf '%s\n' nvidia-current-open nvidia-current-open-modeset nvidia-current-open-drm >> /etc/initramfs-tools/modules
update-initramfs -u -k all
dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' nvidia-open-kernel-dkms
dkms status
""".replace("@SRC@", DISTRO_SRC)),
}


def layer_key(name: str) -> str:
    below, script = LAYERS[name]
    h = hashlib.sha256(((layer_key(below) if below else recipe_key()) + "\0" + script).encode())
    return h.hexdigest()[:16]


def layer_stack(name: str, cache: Path | None = None) -> list[Path]:
    """The layers a host of `name` mounts over the image, the top one first (each made or found: layer())."""
    below = LAYERS[name][0]
    return [layer(name, cache), *(layer_stack(below, cache) if below else [])]


def cached_layer(name: str, cache: Path | None = None) -> Path | None:
    """The layer `name` for this recipe if it is made, without making it."""
    d = (cache or cache_dir()) / f"layer-{name}-{layer_key(name)}"
    return d if d.with_suffix(".json").is_file() and d.is_dir() else None


def layer(name: str, cache: Path | None = None) -> Path:
    """The layer `name` over this recipe's image (and the layers below it): made now or found in the cache. One
    maker at a time; a half-made layer is never taken (made aside, renamed when whole)."""
    cache = cache or cache_dir()
    base = image(cache)
    below, script = LAYERS[name]
    lower = [*(layer_stack(below, cache) if below else []), base]
    out = cache / f"layer-{name}-{layer_key(name)}"
    with _locked(cache / f"layer-{name}.lock"):
        if cached_layer(name, cache):
            return out
        for stale in cache.glob(f"layer-{name}-*"):  # this layer of another recipe (not a layer named longer)
            key = stale.name.removeprefix(f"layer-{name}-").split(".")[0]
            if len(key) == 16 and "-" not in key and stale != out:
                shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        for left in cache.glob(f"make-layer-{name}-*"):  # its maker killed half-way (none runs: the lock is ours)
            if left.name.rsplit("-", 1)[0] != f"make-layer-{name}":
                continue
            if os.path.ismount(left / "root"):
                subprocess.run(["umount", str(left / "root")], capture_output=True)
            if not os.path.ismount(left / "root"):
                shutil.rmtree(left, ignore_errors=True)
        work = cache / f"make-layer-{name}-{os.getpid()}"
        for d in ("upper", "work", "root"):
            (work / d).mkdir(parents=True)
        (work / "setup.sh").write_text(script)
        logfile = cache / f"layer-{name}-{layer_key(name)}.log"
        mounted = False
        try:
            r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                                f"lowerdir={':'.join(map(str, lower))},upperdir={work / 'upper'},"
                                f"workdir={work / 'work'}", str(work / "root")], capture_output=True, text=True)
            if r.returncode != 0:
                raise ContainerError(f"make the layer {name}", r.stderr.strip() or f"mount exit {r.returncode}")
            mounted = True
            t0 = time.monotonic()
            _step(["systemd-nspawn", "-q", "-D", str(work / "root"), "--register=no", "--keep-unit", "--pipe",
                   "-E", f"PATH={GUEST_PATH}", "-E", "LANG=C.UTF-8",
                   f"--bind-ro={work / 'setup.sh'}:/tmp/p2pkit-layer.sh", "sh", "/tmp/p2pkit-layer.sh"],
                  f"make the layer {name}", logfile, timeout=5400)
            seconds = round(time.monotonic() - t0)
            subprocess.run(["umount", str(work / "root")], check=True)
            mounted = False
            shutil.rmtree(out, ignore_errors=True)
            os.replace(work / "upper", out)
            out.with_suffix(".json").write_text(json.dumps(  # written last: the mark of a whole layer
                {"layer": name, "below": below, "image": base.name, "seconds": seconds}) + "\n")
        finally:
            if mounted:
                subprocess.run(["umount", str(work / "root")], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    return out


class ContainerError(RuntimeError):
    """A step of the container host failed; `log` names the file that holds its output."""

    def __init__(self, step: str, message: str, log: Path | None = None):
        super().__init__(f"container host: {step}: {message}" + (f" (log: {log})" if log else ""))
        self.step, self.log = step, log


def cannot_boot() -> str | None:
    """Why this machine cannot make and boot a container host, or None when it can."""
    if os.geteuid() != 0:
        return "a container host needs root (mounts, systemd-nspawn)"
    for tool, pkg in (("systemd-nspawn", "systemd-container"), ("mmdebstrap", "mmdebstrap"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {pkg})"
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return "the kernel has no overlay filesystem"
    except OSError as e:
        return f"/proc/filesystems: {e.strerror}"
    return None


# ------------------------------------------------------------------------------------------- image

def cache_dir() -> Path:
    return Path(os.environ.get("P2PKIT_CT_CACHE", Path.home() / ".cache/p2pkit-tests/container"))


def _lockfile() -> Path:
    return Path(__file__).resolve().parent.parent / "requirements.lock"


def recipe_key() -> str:
    h = hashlib.sha256()
    for part in (SUITE, *MIRRORS, *PACKAGES, *DPKG_EXCLUDES, SETUP, GRUB_PROBE, _lockfile().read_text()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def image(cache: Path | None = None, log=None) -> Path:
    """The image's root directory for this recipe: made now (a few minutes) or found in the cache.
    One maker at a time (a lock); a half-made image is never taken (made aside, renamed at the end)."""
    cache = cache or cache_dir()
    key = recipe_key()
    root = cache / f"root-{key}"
    with _locked(cache / "image.lock"):
        if (root / MANIFEST.lstrip("/")).is_file():
            return root
        for stale in cache.glob("root-*"):  # another recipe's image, or a maker that died half-way
            if stale != root:
                shutil.rmtree(stale, ignore_errors=True)
        _make_image(cache, root, log)
    return root


def _make_image(cache: Path, root: Path, log) -> None:
    work = cache / f"make-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    stage = work / "p2pkit-image"  # copied into the root's /tmp for SETUP, removed after
    stage.mkdir(parents=True)
    logfile = cache / f"image-{root.name[5:]}.log"
    try:
        wheels = stage / "wheels"
        shutil.copyfile(_lockfile(), stage / "requirements.lock")
        _step([sys.executable, "-m", "pip", "download", "-q", "--require-hashes",
               "--only-binary=:all:", "-r", str(stage / "requirements.lock"), "-d", str(wheels)],
              "download p2pkit's dependencies", logfile)
        (stage / "grub-probe").write_text(GRUB_PROBE)
        (stage / "setup.sh").write_text(SETUP)
        tmp = work / "root"
        argv = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
                *(f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES),
                f"--customize-hook=copy-in {stage} /tmp",
                "--customize-hook=chroot \"$1\" sh /tmp/p2pkit-image/setup.sh",
                "--customize-hook=rm -rf \"$1/tmp/p2pkit-image\"",
                SUITE, str(tmp), *MIRRORS]
        _step(argv, "make the Debian root (mmdebstrap)", logfile)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _step(argv: list[str], step: str, logfile: Path, timeout: float = 1800) -> None:
    t0 = time.monotonic()
    # this machine's pip and Python settings stay here (the root's pip has its own wheels to install from)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    with open(logfile, "a") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n")
        fh.flush()
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env)
        fh.write(f"# exit {r.returncode} after {time.monotonic() - t0:.1f} s\n")
    if r.returncode != 0:
        raise ContainerError(step, f"exit {r.returncode}", logfile)


def cached_image(cache: Path | None = None) -> Path | None:
    """The image for this recipe if it is made, without making it."""
    root = (cache or cache_dir()) / f"root-{recipe_key()}"
    return root if (root / MANIFEST.lstrip("/")).is_file() else None


def start_background(cache: Path | None = None) -> None:
    """Make the image and then its layers in a process of its own (a test session starts it first and runs beside
    it; each is made under its own lock, so a test that asks for one meanwhile waits for that one)."""
    cache = cache or cache_dir()
    # the layers only where asked for (P2PKIT_CT_LAYERS=1) or made before: Debian's NVIDIA package and its two
    # real DKMS builds take 26 min of two cores cold, more than CI's whole budget leaves (docs/testing.md)
    want = LAYERS if os.environ.get("P2PKIT_CT_LAYERS") == "1" else ()
    if (cached_image(cache) and all(cached_layer(n, cache) for n in want)) or cannot_boot():
        return
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "image-background.log", "ab") as log:
        subprocess.Popen([sys.executable, "-m", "p2pkit.sim.container", "layers" if want else "image"],
                         stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         env={**os.environ, "P2PKIT_CT_CACHE": str(cache),
                              "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def image_manifest(image_root: Path) -> dict:
    return json.loads((image_root / MANIFEST.lstrip("/")).read_text())


# ------------------------------------------------------------------------------------------- a host

class ContainerHost:
    """One container host in `directory`: made from the image, booted, run in, rebooted, stopped."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).resolve()
        self.root = self.dir / "root"
        self.logs = self.dir / "logs"

    # -- the machine's record
    def machine(self) -> dict:
        try:
            return json.loads((self.dir / "machine.json").read_text())
        except (OSError, ValueError):
            return {}

    def _record(self, **kw) -> None:
        doc = {**self.machine(), **kw}
        tmp = self.dir / "machine.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, self.dir / "machine.json")

    # -- make
    @classmethod
    def create(cls, directory: Path, image_root: Path, scenario: str = "healthy", wheel: Path | None = None,
               name: str | None = None, layers: tuple[Path, ...] = (), profile: str | None = None) -> ContainerHost:
        """Lay a host out from the image (and `layers` over it, the top one first: layer()): its own overlay,
        machine id and hostname, p2pkit installed from `wheel` (built from this tree when None), the GPUs of
        `scenario` provisioned inside, for the built-in `profile` (the scenario's own when None). Not booted."""
        host = cls(directory)
        if host.dir.exists() and any(host.dir.iterdir()):
            raise ContainerError("create", f"{host.dir} is not empty")
        for d in ("upper", "work", "root", "logs"):
            (host.dir / d).mkdir(parents=True, exist_ok=True)
        name = name or f"p2pkit-ct-{uuid.uuid4().hex[:8]}"
        # made: False until the last step is done: a host whose making stopped half-way is refused by boot
        host._record(image=str(image_root), layers=[str(x) for x in layers], name=name, state="off", boots=0,
                     scenario=scenario, made=False, profile=profile)
        host.mount()
        try:
            (host.root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
            (host.root / "etc/hostname").write_text(name + "\n")
            host.install(wheel)
            host.run_once([f"{VENV}/bin/python", "-m", "p2pkit.sim.guest", "provision", "--scenario", scenario,
                           *(("--profile", profile) if profile else ())], "provision the simulated GPUs")
        except BaseException as e:
            host._record(failed=str(e) or type(e).__name__)
            host.unmount()
            raise
        host._record(made=True)
        return host

    def half_made(self) -> str | None:
        """Why this directory is not a whole host (its making stopped half-way), or None."""
        m = self.machine()
        if m.get("made") is False:
            return f"its making stopped half-way ({m.get('failed') or 'killed before it finished'})"
        if os.path.ismount(self.root) and not (self.root / VENV.lstrip("/") / "bin/p2pkit").is_file():
            return f"p2pkit is not installed in it ({VENV}/bin/p2pkit is missing)"
        return None

    def install(self, wheel: Path | None = None) -> None:
        """p2pkit from `wheel` (a wheel of this tree when None) into the root's venv, as `pip install .`
        installs it on a real box (its dependencies are in the image); the host booted or not."""
        wheel = wheel or build_wheel(self.dir / "wheel")
        dest = self.root / "var/tmp" / wheel.name
        shutil.copyfile(wheel, dest)
        argv = [f"{VENV}/bin/pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
                f"/var/tmp/{wheel.name}"]
        try:
            if self.machine().get("state") == "running":
                self.run(argv)
            else:
                self.run_once(argv, "install p2pkit")
        finally:
            dest.unlink(missing_ok=True)

    def mount(self) -> None:
        if os.path.ismount(self.root):
            return
        lower = ":".join([*self.machine().get("layers", []), self.machine()["image"]])
        r = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                            f"lowerdir={lower},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}",
                            str(self.root)], capture_output=True, text=True)
        if r.returncode != 0:
            raise ContainerError("mount the root", r.stderr.strip() or f"mount exit {r.returncode}")

    def unmount(self) -> None:
        for _ in range(50):
            if not os.path.ismount(self.root):
                return
            r = subprocess.run(["umount", str(self.root)], capture_output=True, text=True)
            if r.returncode == 0:
                return
            time.sleep(0.2)
        raise ContainerError("unmount the root", f"{self.root} is still busy")

    def run_once(self, argv: list[str], step: str, timeout: float = 600) -> str:
        """Run a command in the root in a container of its own that is not booted (systemd-nspawn
        without -b): for setting the root up before its first boot."""
        log = self.logs / "setup.log"
        with open(log, "a") as fh:
            fh.write(f"\n$ {' '.join(argv)}\n")
            fh.flush()
            r = subprocess.run(["systemd-nspawn", "-q", "-D", str(self.root), "--register=no", "--keep-unit",
                                "--pipe", "-E", f"PATH={GUEST_PATH}", "-E", "LANG=C.UTF-8", *argv],
                               stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        if r.returncode != 0:
            raise ContainerError(step, f"exit {r.returncode}", log)
        return log.read_text()

    # -- boot, run, stop
    def boot(self, timeout: float = 120) -> None:
        """Start the machine (its supervisor restarts the container when the OS inside reboots) and wait
        until systemd inside says it is up."""
        self.mount()
        why = self.half_made()
        if why:
            self.unmount()
            raise ContainerError("boot", f"{self.dir} is not a whole container host: {why}; remove it (`p2pkit sim "
                                 f"container stop {self.dir}`, then `rm -rf {self.dir}`) and boot it again",
                                 self.logs / "setup.log" if (self.logs / "setup.log").is_file() else None)
        m = self.machine()
        if m.get("state") in ("booting", "running") and _alive(m.get("supervisor_pid")):
            return self.wait_up(timeout)
        with open(self.logs / "machine.log", "a") as log:  # the supervisor keeps its own copy of the file
            sup = subprocess.Popen([sys.executable, "-m", "p2pkit.sim.container", "machine", str(self.dir)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True,
                                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        self._record(supervisor_pid=sup.pid, state="booting")
        self.wait_up(timeout)

    def wait_up(self, timeout: float = 120, after_boot: int = 0) -> None:
        """Until the container of boot number > after_boot runs and systemd inside finished starting up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.machine()
            if m.get("state") == "off":
                raise ContainerError("boot", f"the container stopped (exit {m.get('exit')})",
                                     self.logs / f"console-{m.get('boots', 0)}.log")
            if m.get("state") == "running" and m.get("boots", 0) > after_boot and _alive(m.get("leader_pid")):
                left = max(1.0, deadline - time.monotonic())
                try:
                    r = self.run(["systemctl", "is-system-running", "--wait"], timeout=left, check=False)
                except subprocess.TimeoutExpired:  # still starting at the deadline: said below, with its log
                    break
                if r.stdout.strip() in ("running", "degraded"):
                    return
                if r.stdout.strip() not in ("starting", "initializing", ""):
                    raise ContainerError("boot", f"systemd says {r.stdout.strip()!r}",
                                         self.logs / f"console-{m.get('boots')}.log")
            time.sleep(0.2)
        raise ContainerError("boot", f"not up within {timeout:g} s", self.logs / "machine.log")

    def diagnose(self, lines: int = 40) -> str:
        """The machine's record and the last lines of its log and of the current boot's console, for a
        message about a step that failed."""
        m = self.machine()
        out = [f"machine: {json.dumps(m)}"]
        for f in (self.logs / "machine.log", self.logs / f"console-{m.get('boots', 0)}.log"):
            try:
                out.append(f"--- {f}:\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:]))
            except OSError:
                pass
        if _alive(m.get("nspawn_pid")):
            held = namespace_processes(m.get("pidns"))
            out.append(f"--- the container's processes ({len(held)}):\n" + "\n".join(held[-lines:]))
        return "\n".join(out)

    def leader(self) -> int:
        m = self.machine()
        pid = m.get("leader_pid")
        if m.get("state") != "running" or not _alive(pid):
            raise ContainerError("run", "the container is not running")
        return int(pid)

    def command(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The argv that runs `argv` inside the running container as root, with a login's environment and the
        container's capabilities: the capability bounding set of its PID 1 (systemd-nspawn's, without
        CAP_SYS_MODULE, CAP_SYS_TIME, ...), so that a command run from here (the first half of `up --reboot`,
        every hook apt runs for it) has no more privilege than the units the container's systemd starts."""
        base = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", "COLUMNS": "200"}
        leader = self.leader()
        return [sys.executable, "-c", DROP_CAPS, _bounding_set(leader), "nsenter", "-t", str(leader), "-a", "--",
                "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in {**base, **(env or {})}.items()), *argv]

    def run(self, argv: list[str], timeout: float = 600, check: bool = True, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(self.command(argv, env), capture_output=True, text=True, timeout=timeout,
                           input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise ContainerError(" ".join(argv), f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
        return r

    def p2pkit(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        return self.run([f"{VENV}/bin/p2pkit", *args], timeout=timeout, check=False)

    def ended_by(self, returncode: int, leader: int, boots: int, wait_s: float = 15.0) -> tuple[int, str]:
        """`sim container exec`'s exit code and what to say, for a command inside that ended with `returncode`
        while the container's boot `boots` (its PID 1 `leader`) ran. A command ended by a signal because the OS
        went down under it (`up --reboot` rebooting it: SIGTERM) is exit 4, as that `up` on a real box that
        reboots; another signal is 128+N, as a shell says it; never a negative number that wraps to 241."""
        if returncode >= 0:
            return returncode, ""
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        deadline = time.monotonic() + wait_s
        while True:
            m = self.machine()
            if not _alive(leader) or m.get("boots", 0) > boots or m.get("state") != "running":
                what = "powered off" if m.get("state") == "off" else "rebooted"
                return REBOOTED, (f"the container host went down under the command (boot {boots} ended: its "
                                          f"OS {what}), which ended it with {name}; where it rebooted, p2pkit's "
                                          "resume unit carries on inside: `p2pkit sim container exec "
                                          f"{self.dir} -- p2pkit status` shows where it is")
            if time.monotonic() >= deadline:
                return 128 + sig, f"the command inside was ended by {name} (exit {128 + sig}, as a shell says it)"
            time.sleep(0.2)

    def reboot(self, timeout: float = 120) -> None:
        boots = self.machine().get("boots", 0)
        self.run(["systemctl", "reboot"], check=False)
        self.wait_up(timeout, after_boot=boots)

    def wait_reboot(self, boots: int, timeout: float = 300) -> None:
        """After something inside rebooted the machine: until boot number boots+1 is up."""
        self.wait_up(timeout, after_boot=boots)

    def manifest(self) -> dict:
        return image_manifest(Path(self.machine()["image"]))

    def upgrade_kernel(self) -> subprocess.CompletedProcess:
        """The newer kernel of the image, installed for real: apt-get from the local repository the image
        keeps (its own sources only: nothing is fetched), dpkg running every package's maintainer scripts
        and the kernel's postinst hooks. Returns apt-get install's result."""
        new = self.manifest()["upgrade_kernel"]
        self.run(["sh", "-c", f"echo 'deb [trusted=yes] file:{APT_REPO} ./' > {UPGRADE_SOURCES}"])
        opts = ["-o", f"Dir::Etc::SourceList={UPGRADE_SOURCES}", "-o", "Dir::Etc::SourceParts=/nonexistent",
                "-o", "APT::Get::List-Cleanup=false"]
        self.run(["apt-get", "-q", *opts, "update"])
        return self.run(["apt-get", "-q", *opts, "install", "-y", f"linux-image-{new}", f"linux-headers-{new}"],
                        check=False, env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=900)

    def stop(self, timeout: float = 60) -> None:
        """Power the container off (systemctl poweroff inside; SIGTERM then SIGKILL to systemd-nspawn if it
        does not stop) and unmount the root. Nothing is left running or mounted."""
        m = self.machine()
        if m.get("state") in ("running", "booting") and _alive(m.get("leader_pid")):
            with contextlib.suppress(ContainerError, subprocess.TimeoutExpired):
                self.run(["systemctl", "poweroff"], check=False, timeout=10)
        sup, nsp, leader = m.get("supervisor_pid"), m.get("nspawn_pid"), m.get("leader_pid")
        deadline = time.monotonic() + timeout
        while _alive(sup) and time.monotonic() < deadline:
            time.sleep(0.2)
        # a container that will not stop: the supervisor first (it would boot it again), then systemd-nspawn
        # (SIGTERM asks the container's systemd to power off), then the container's PID 1 itself (SIGKILL to
        # a PID namespace's init ends every process in it)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in (sup, nsp, leader if sig == signal.SIGKILL else None):
                if _alive(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
            end = time.monotonic() + 10
            while any(_alive(p) for p in (sup, nsp, leader)) and time.monotonic() < end:
                time.sleep(0.2)
        self._record(state="off")
        self.unmount()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# Drops every capability outside a bounding set (hex, as /proc/PID/status's CapBnd) from this process's bounding
# set (prctl(2) PR_CAPBSET_DROP, 24) and the ambient set, then execs the rest of its argv: a root process's
# permitted and effective sets after execve are its bounding set (capabilities(7), "Transformation of
# capabilities during execve()"). nsenter needs CAP_SYS_ADMIN and CAP_SYS_CHROOT, which the container keeps.
DROP_CAPS = """import ctypes, os, sys
keep = int(sys.argv[1], 16)
libc = ctypes.CDLL(None, use_errno=True)
last = int(open("/proc/sys/kernel/cap_last_cap").read())
for cap in range(last + 1):
    if not keep >> cap & 1 and libc.prctl(24, cap, 0, 0, 0) != 0:
        sys.exit(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _bounding_set(pid: int) -> str:
    """The capability bounding set of a process of this machine (CapBnd of /proc/PID/status, hex)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("CapBnd:"):
                return line.split()[1]
    except OSError as e:
        raise ContainerError("run", f"the container's PID 1 ({pid}): {e.strerror}") from None
    raise ContainerError("run", f"no CapBnd in /proc/{pid}/status")


def _stat_state_ppid(text: str) -> tuple[str, int]:
    """State letter and parent PID of /proc/PID/stat (proc(5): fields 3 and 4, after the command name,
    which may hold spaces and parentheses, so read from its last ")"). The container host states this
    itself: it is part of no product rule (tests/test_sim_rules.py)."""
    state, ppid = text[text.rindex(")") + 1:].split()[:2]
    return state, int(ppid)


REBOOTED = 4  # p2pkit's exit code for "reboot needed" (p2pkit.core.errors.Exit.REBOOT): what exec exits with when
# the container went down under its command, as `p2pkit --yes up --reboot` exits on a real box that goes down


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            return _stat_state_ppid(fh.read())[0] != "Z"
    except (OSError, ValueError):
        return False


def build_wheel(out: Path) -> Path:
    """A wheel of this p2pkit (what `pip install .` installs), for the host to install inside: built by pip
    from the source tree it runs from (a checkout, an editable install), or, where it runs from an installed
    wheel (`pip install .` puts the package in site-packages: no pyproject.toml there to build from), packed
    again from the installed distribution's own files as its RECORD lists them. What pip said is kept in
    OUT/build-wheel.log, which an error names."""
    src = Path(__file__).resolve().parents[2]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build-wheel.log"
    if (src / "pyproject.toml").is_file():
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                           capture_output=True, text=True)
        log.write_text(f"$ pip wheel --no-deps -w {out} {src}\n{r.stdout}{r.stderr}# exit {r.returncode}\n")
        wheels = sorted(out.glob("p2pkit-*.whl"))
        if r.returncode != 0 or not wheels:
            raise ContainerError("build p2pkit's wheel", f"pip wheel {src}: "
                                 + ((r.stderr or r.stdout).strip().splitlines() or [f"exit {r.returncode}"])[-1], log)
        return wheels[-1]
    try:
        return repack_installed(out)
    except (OSError, ValueError, KeyError) as e:
        log.write_text(f"p2pkit runs from {src}, which is no source tree (no pyproject.toml), and its installed "
                       f"distribution could not be packed again: {e}\n")
        raise ContainerError("build p2pkit's wheel", f"p2pkit runs from {src} (no pyproject.toml) and its installed "
                             f"files could not be packed into a wheel ({e}): install it from its checkout "
                             "(`pip install -e .`) or run `python -m p2pkit sim container boot` from the checkout",
                             log) from None


def repack_installed(out: Path) -> Path:
    """The wheel the installed p2pkit came from, packed again: every file its RECORD lists inside the
    installation (the package and its .dist-info; not byte code, INSTALLER, REQUESTED or direct_url.json,
    which the installer adds), and the `p2pkit` script the wheel carries as shared data
    (`p2pkit-V.data/scripts/p2pkit`, pyproject.toml) from the bin/ it was installed into, its first line put
    back to `#!python` (the wheel format: the installer points it at its Python); a new RECORD of their sha256
    and sizes (PEP 427, PEP 376). Raises ValueError where the distribution found is not the one this module
    belongs to, or an installed script is not where its RECORD line says with its hash."""
    import base64
    import importlib.metadata
    import zipfile

    dist = importlib.metadata.distribution("p2pkit")
    here = Path(__file__).resolve()
    if Path(dist.locate_file("p2pkit/sim/container.py")).resolve() != here:
        raise ValueError(f"the installed p2pkit distribution ({dist.locate_file('')}) is not the one running here")
    info = next(f for f in dist.files if f.parts[0].endswith(".dist-info"))
    info_dir = info.parts[0]
    tag = next((ln.split(":", 1)[1].strip() for ln in dist.read_text("WHEEL").splitlines()
                if ln.startswith("Tag:")), "py3-none-any")
    name = f"p2pkit-{dist.version}-{tag}.whl"
    skip = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
    files = {str(f): Path(dist.locate_file(f)).read_bytes() for f in dist.files
             if ".." not in f.parts and "__pycache__" not in f.parts and not str(f).endswith(".pyc")
             and not (f.parts[0] == info_dir and f.name in skip)}
    for f in dist.files:  # the scripts, installed outside site-packages (`../../../bin/p2pkit` in a venv)
        if ".." in f.parts and f.parent.name == "bin":
            files[f"p2pkit-{dist.version}.data/scripts/{f.name}"] = _installed_script(dist, f)
    tmp = out / (name + ".part")
    record = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, data in sorted(files.items()):
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        record.append(f"{info_dir}/RECORD,,")
        z.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    os.replace(tmp, out / name)
    return out / name


def _installed_script(dist, f) -> bytes:
    """An installed script as its wheel held it: the file its RECORD line names (pip --target moves bin/ into
    the target, away from the path the line says), found by its recorded hash, with `#!python` first again."""
    import base64
    import sysconfig

    want = (f.hash.value if f.hash else None)
    for p in (Path(dist.locate_file(f)), Path(dist.locate_file(f"bin/{f.name}")),
              Path(sysconfig.get_path("scripts")) / f.name, Path(sys.executable).parent / f.name):
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if want is None or base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() == want:
            first, nl, rest = data.partition(b"\n")
            return (b"#!python" + nl + rest) if first.startswith(b"#!") and b"python" in first else data
    raise ValueError(f"the installed script {f} is not where its RECORD line says, nor in a bin/ beside it")


# ------------------------------------------------------------------------------------------- machine

def machine_loop(directory: Path) -> int:
    """The machine: boot the container, and boot it again when the OS inside reboots, until it powers
    off. Run detached by ContainerHost.boot (`python -m p2pkit.sim.container machine DIR`).

    An OS that said its last word ("Rebooting.", "Powering off.") is off even where systemd-nspawn does
    not end: the kernel ends a PID namespace only once every process in it is reaped, and one the OS
    could not kill (asleep in the kernel: an fsync on a loaded disk) or whose parent outside never reaps
    it holds the old container's PID 1 in its exit. After SHUTDOWN_GRACE_S the supervisor writes what
    holds it to its log (pid, state, kernel wait channel, parent), ends systemd-nspawn and goes on as
    systemd-nspawn would have (seen once in CI: a boot that never came back, its console ending in
    "Rebooting." after "Waiting for process: 46 (p2pkit)")."""
    host = ContainerHost(directory)
    rc = 0
    while True:
        boots = host.machine().get("boots", 0) + 1
        argv = ["systemd-nspawn", "-D", str(host.root), "-b", "--register=no", "--keep-unit",
                "--console=read-only", "-M", host.machine().get("name", "p2pkit-ct")]
        console_log = host.logs / f"console-{boots}.log"
        with open(console_log, "w") as console:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)
            host._record(boots=boots, nspawn_pid=proc.pid, leader_pid=None, pidns=None, state="booting")
            leader = None
            while leader is None and proc.poll() is None:
                leader = _child(proc.pid)
                time.sleep(0.05)
            pidns = _pidns(leader)
            if leader is not None:
                host._record(leader_pid=leader, pidns=pidns, state="running")
            rc = _wait_nspawn(proc, console_log, pidns)
        print(f"boot {boots}: systemd-nspawn exit {rc}", flush=True)
        if rc != REBOOT_EXIT:
            break
    host._record(state="off", exit=rc, leader_pid=None, nspawn_pid=None)
    return 0


SHUTDOWN_GRACE_S = float(os.environ.get("P2PKIT_CT_SHUTDOWN_GRACE_S", "30"))
LAST_WORDS = {"Rebooting.": REBOOT_EXIT, "Powering off.": 0, "Halting.": 0}  # systemd-shutdown's, src/shutdown


def _last_word(console_log: Path) -> str | None:
    """The OS's last line on the console where it is one of systemd-shutdown's final words."""
    try:
        with open(console_log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            tail = fh.read().decode(errors="replace").replace("\r", "\n").split("\n")
    except OSError:
        return None
    lines = [ln.strip() for ln in tail if ln.strip()]
    return lines[-1] if lines and lines[-1] in LAST_WORDS else None


def _wait_nspawn(proc: subprocess.Popen, console_log: Path, pidns: str | None) -> int:
    said_at = None
    while True:
        try:
            return proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
        word = _last_word(console_log)
        if word is None:
            said_at = None
            continue
        said_at = said_at or time.monotonic()
        if time.monotonic() - said_at < SHUTDOWN_GRACE_S:
            continue
        print(f"the OS said {word!r} {SHUTDOWN_GRACE_S:g} s ago and systemd-nspawn has not ended; what holds "
              f"its PID namespace {pidns}:", flush=True)
        for line in namespace_processes(pidns):
            print(f"  {line}", flush=True)
        proc.kill()
        proc.wait()
        print(f"ended systemd-nspawn; going on as after {word!r}", flush=True)
        return LAST_WORDS[word]


def _pidns(pid: int | None) -> str | None:
    try:
        return os.readlink(f"/proc/{int(pid)}/ns/pid") if pid else None
    except OSError:
        return None


def namespace_processes(pidns: str | None) -> list[str]:
    """Every process of the PID namespace `pidns` as this machine sees it: pid, name, state, the kernel
    function it waits in, its parent (and whether that parent is outside the namespace)."""
    out = []
    if not pidns:
        return out
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if os.readlink(d / "ns/pid") != pidns:
                continue
            stat = (d / "stat").read_text()
            comm = (d / "comm").read_text().strip()
            state, ppid = _stat_state_ppid(stat)
            wchan = (d / "wchan").read_text().strip() or "-"
            outside = _pidns(ppid) != pidns
        except (OSError, ValueError):
            continue
        out.append(f"pid {d.name} ({comm}) state {state} wchan {wchan} parent {ppid}"
                   + (" (outside the container)" if outside else ""))
    return out


def _child(pid: int) -> int | None:
    """The container's PID 1 as this machine numbers it: the child of systemd-nspawn that runs systemd
    (until it execs, the child is still systemd-nspawn's own)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for k in kids:
            if Path(f"/proc/{k}/comm").read_text().strip() == "systemd":
                return int(k)
    except OSError:
        pass
    return None


if __name__ == "__main__":
    if sys.argv[1:2] == ["machine"]:
        sys.exit(machine_loop(Path(sys.argv[2])))
    if sys.argv[1:2] == ["image"]:  # the image made (or found) under the cache's lock; its path printed
        print(image(), flush=True)
        sys.exit(0)
    if sys.argv[1:2] == ["layers"]:  # the image, then every layer over it
        print(image(), *(layer(n) for n in LAYERS), sep="\n", flush=True)
        sys.exit(0)
    if sys.argv[1:2] == ["layer"] and sys.argv[2:3] and sys.argv[2] in LAYERS:  # likewise a layer over it
        print(layer(sys.argv[2]), flush=True)
        sys.exit(0)
    sys.exit(f"usage: {sys.argv[0]} machine DIR | image | layers | layer {'|'.join(LAYERS)}")
