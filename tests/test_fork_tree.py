"""The fork-shaped tree (p2pkit/sim/fork_tree.py) held to the real fork's interface, as recorded from
aikitoria/open-gpu-kernel-modules 570.86.16-p2p (tests/fixtures/fork-570.86.16-p2p/README.md): the kbuild
invocation its Makefiles make for each set of variables (make alone), then, against real kernel headers
(a Debian root: tests/kbuild_root.py), its build, install, depmod and signing by the real tools, each
result compared with the real fork's."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from p2pkit.parse import build as pbuild
from p2pkit.parse import mok as pm
from p2pkit.parse import system as ps
from p2pkit.sim import fork_tree
from p2pkit.stages.p2p_module import act, checks
from tests import kbuild_root

FIX = Path(__file__).parent / "fixtures/fork-570.86.16-p2p"
VERSION = "570.86.16"
REAL_SRC = "/var/cache/p2pkit/open-gpu-kernel-modules"  # where the real fork was built (the role's src dir)
REAL_KERNEL = "6.1.0-57-amd64"  # kbuild-invocations.txt's
BUILT_KERNEL = "6.1.0-47-amd64"  # the kernel the real fork built, installed and signed for


def recorded_invocations() -> dict[str, str]:
    """kbuild-invocations.txt: '## make ARGS' then the line the fork's kernel-open/Makefile runs kbuild with."""
    out, head = {}, None
    for line in (FIX / "kbuild-invocations.txt").read_text().splitlines():
        if line.startswith("## make "):
            head = line[len("## make "):]
        elif line.strip() and head:
            out[head], head = line.strip(), None
    return out


def kbuild_args(line: str, tree: str) -> list[str]:
    """The kbuild arguments that make the interface: the compiler and linker names (the kernel's
    .config's on the recording root), the fork's SPECTRE switch and the tree's own path left out."""
    words = line.replace(tree, "<TREE>").split()
    return [w for w in words if not re.match(r"^(CC|LD|OBJDUMP|NV_SPECTRE_V2)=", w)]


def echo_kbuild(work: Path, args: str) -> str:
    """The kbuild line the tree's kernel-open/Makefile makes for `make ARGS`: $(MAKE) replaced by echo."""
    r = subprocess.run(["make", "-s", "-C", str(work / "kernel-open"), *args.split(), "MAKE=echo"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args", [a for a in recorded_invocations() if "KERNEL_UNAME" not in a])
def test_the_tree_hands_kbuild_what_the_fork_hands_it(tmp_path, args):
    """SYSSRC, SYSOUT, INSTALL_MOD_DIR (given and the default), NV_EXCLUDE_KERNEL_MODULES, each target:
    the same kbuild line as the real fork's kernel-open/Makefile (make only: the paths need not exist)."""
    fork_tree.write_tree(tmp_path, VERSION)
    real = recorded_invocations()[args]
    assert kbuild_args(echo_kbuild(tmp_path, args), str(tmp_path / "kernel-open")) == \
        kbuild_args(real, f"{REAL_SRC}/kernel-open")


def test_the_tree_carries_the_version_where_the_fork_does(tmp_path):
    fork_tree.write_tree(tmp_path, "615.71.09")
    assert (tmp_path / "version.mk").read_text().splitlines()[0] == "NVIDIA_VERSION = 615.71.09"
    assert "NV_VERSION_STRING := 615.71.09" in (tmp_path / "kernel-open/Kbuild").read_text()
    assert sorted(p.name for p in (tmp_path / "kernel-open").iterdir() if p.is_dir() and p.name != "common") == \
        sorted(fork_tree.MODULES)


# ---------------------------------------------------------------- against real kernel headers


@pytest.fixture(scope="module")
def kroot():
    path, why = kbuild_root.root()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture
def tree(kroot, tmp_path_factory):
    """The tree as a git repository, cloned where the role clones the fork (a temporary directory in the
    root); yields (root, path inside the root, kernel)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="fork-tree-", dir=kroot / "var/tmp"))
    try:
        yield kroot, base, kbuild_root.kernel(kroot)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def inside(root: Path, p: Path) -> str:
    return "/" + str(p.relative_to(root))


def clone(root: Path, base: Path, **kw) -> tuple[Path, str]:
    bare, commit = fork_tree.make_fork_tree(base / "repo", VERSION, **kw)
    src = base / "src"
    subprocess.run(["git", "clone", "-q", str(bare), str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "checkout", "-q", commit], check=True)
    return src, commit


def real_dep_lines() -> dict[str, set[str]]:
    """The real fork's modules.dep lines: each nvidia module and the nvidia modules it depends on."""
    out = {}
    for line in (FIX / "modules.dep-nvidia.txt").read_text().splitlines():
        mod, _, deps = line.partition(":")
        out[mod] = {d for d in deps.split() if "/nvidia" in d}
    return out


def test_the_tree_builds_installs_and_signs_like_the_fork(tree):
    """The role's own commands (tasks/build.yml, sign.yml, followups.yml) on the tree, against real
    headers: the .ko files land in kernel-open/ and under kernel/drivers/video, depmod maps the same
    dependencies, and the real modinfo shows what p2pkit reads of the real fork's modules."""
    root, base, kernel = tree
    src, _ = clone(root, base)
    s, inst = inside(root, src), inside(root, base / "inst")
    syssrc, given = f"/lib/modules/{kernel}/build", kbuild_root.trees(root, kernel)
    kbuild_root.run(root, f"cd {s} && make modules -j2 {given}")
    built = sorted(p.name for p in (src / "kernel-open").glob("*.ko"))
    assert built == sorted((FIX / "built-ko.txt").read_text().split())
    kbuild_root.run(root, f"cd {s} && make modules_install {given} INSTALL_MOD_PATH={inst} "
                          "INSTALL_MOD_DIR=kernel/drivers/video DEPMOD=/bin/true")
    video = base / "inst/lib/modules" / kernel / "kernel/drivers/video"
    assert sorted(p.name for p in video.glob("*.ko")) == built
    kbuild_root.run(root, f"depmod -b {inst} {kernel}")
    dep = {}
    for line in (base / "inst/lib/modules" / kernel / "modules.dep").read_text().splitlines():
        mod, _, deps = line.partition(":")
        dep[mod] = set(deps.split())
    assert dep == real_dep_lines()

    for m in fork_tree.MODULES:  # modinfo's depends: what the real fork's modules depend on
        got = kbuild_root.run(root, f"modinfo -F depends {s}/kernel-open/{m}.ko").stdout.strip()
        want = ps.modinfo_fields((FIX / f"modinfo-built-unsigned-{m}.txt").read_text())["depends"]
        assert set(filter(None, got.split(","))) == set(filter(None, want.split(","))), m

    info = ps.modinfo_fields(kbuild_root.run(root, f"modinfo {s}/kernel-open/nvidia.ko").stdout)
    real = ps.modinfo_fields((FIX / "modinfo-built-unsigned-nvidia.txt").read_text())
    assert info["version"] == real["version"] == VERSION
    assert info["vermagic"].split()[0] == kernel and real["vermagic"].split()[0] == BUILT_KERNEL
    assert re.fullmatch(r"[0-9A-F]{20,24}", info["srcversion"]) and re.fullmatch(r"[0-9A-F]{20,24}", real["srcversion"])
    assert info["license"] == real["license"] and info["supported"] == real["supported"]
    assert "sig_key" not in info and "sig_key" not in real

    # sign.yml: the key the role's tasks/mok.yml makes, the headers' sign-file, every built module
    key, cert = f"{s}/../MOK.priv", f"{s}/../MOK.der"
    kbuild_root.run(root, f"openssl req -new -x509 -newkey rsa:2048 -nodes -days 36500 -outform DER -keyout {key} "
                          f"-out {cert} -subj '/CN=p2pkit module signing key for fork-tree/' 2>/dev/null")
    ident = pm.cert_identity(kbuild_root.run(root, f"openssl x509 -inform DER -in {cert} -noout -serial -subject")
                             .stdout)
    for ko in built:
        kbuild_root.run(root, f"{syssrc}/scripts/sign-file sha256 {key} {cert} {s}/kernel-open/{ko}")
    kbuild_root.run(root, f"cd {s} && make modules_install {given} INSTALL_MOD_PATH={inst} "
                          "INSTALL_MOD_DIR=kernel/drivers/video DEPMOD=/bin/true")
    kbuild_root.run(root, f"depmod -b {inst} {kernel}")
    signed = ps.modinfo_fields(kbuild_root.run(root, f"modinfo -b {inst} -k {kernel} nvidia").stdout)
    real_signed = ps.modinfo_fields((FIX / "modinfo-k-installed-signed-nvidia.txt").read_text())
    assert signed["filename"] == f"{inst}/lib/modules/{kernel}/kernel/drivers/video/nvidia.ko"
    assert real_signed["filename"] == f"/lib/modules/{BUILT_KERNEL}/kernel/drivers/video/nvidia.ko"
    assert signed["srcversion"] == info["srcversion"]  # p2p.installed_srcversion: the one built
    assert signed["signer"] == ident["cn"] and signed["sig_hashalgo"] == real_signed["sig_hashalgo"] == "sha256"
    assert checks.signed_by_key(signed["sig_key"], {"cert_id": ident})
    assert set(real_signed) <= set(signed) | {"alias", "firmware", "import_ns", "parm", "softdep"}


def test_a_kernel_newer_than_the_branch_fails_in_the_compiler_and_p2pkit_names_it(tree):
    """max_kernel below the headers' kernel: the real gcc's implicit-declaration error, found by p2pkit
    among kbuild's output and matched to its cause."""
    root, base, kernel = tree
    src, _ = clone(root, base, max_kernel=(5, 15))
    r = kbuild_root.run(root, f"cd {inside(root, src)} && make modules -j2 {kbuild_root.trees(root, kernel)}",
                        check=False)
    assert r.returncode != 0
    assert "implicit declaration" not in " ".join(r.stderr.strip().splitlines()[-4:])  # make's exit lines last
    errors = pbuild.kbuild_errors(r.stderr + "\n" + r.stdout)
    assert errors and "error: implicit declaration of function" in errors[0]
    assert "nv_pci_rebar_get_possible_sizes" in errors[0]
    cause = next(c for needle, c in act.BUILD_CAUSES if needle in " | ".join(errors))
    assert cause.startswith("the kernel is newer than the fork's branch supports")


def test_without_syssrc_the_tree_finds_the_kernel_as_the_fork_does(tree):
    """No SYSSRC: /lib/modules/<KERNEL_UNAME>/source when it exists, the output tree build/ (Debian's
    headers have both), as the real fork chose in the same root."""
    root, base, kernel = tree
    fork_tree.write_tree(base / "t", VERSION)
    line = kbuild_root.run(root, f"make -s -C {inside(root, base / 't/kernel-open')} modules KERNEL_UNAME={kernel} "
                                 "MAKE=echo").stdout
    real = recorded_invocations()[f"modules KERNEL_UNAME={REAL_KERNEL}"].replace(REAL_KERNEL, kernel)
    assert kbuild_args(line.strip(), inside(root, base / "t/kernel-open")) == \
        kbuild_args(real, f"{REAL_SRC}/kernel-open")


def test_debians_build_tree_alone_fails_the_tree_as_it_failed_the_fork(tree):
    """SYSSRC=/lib/modules/K/build alone, on headers with a source tree apart: no kernel header under
    SYSSRC/include, the fork's fallback to <stdarg.h>, the compiler's error; p2pkit names the cause."""
    root, base, kernel = tree
    if not kbuild_root.split(root, kernel):
        pytest.skip(f"the headers of {kernel} have no source tree apart (not Debian's layout)")
    src, _ = clone(root, base)
    r = kbuild_root.run(root, f"cd {inside(root, src)} && make modules -j2 SYSSRC=/lib/modules/{kernel}/build",
                        check=False)
    assert r.returncode != 0
    errors = pbuild.kbuild_errors(r.stderr + "\n" + r.stdout)
    assert "fatal error: stdarg.h: No such file or directory" in errors[0]
    assert next(c for needle, c in act.BUILD_CAUSES if needle in errors[0]).startswith("the fork's conftest")


def test_with_the_forks_bar1_resize_the_tree_fails_where_the_fork_failed(tree):
    """resize_bar1: the fork's nv-pci.c:240 call to pci_resize_resource() with three arguments. Against
    headers whose pci_resize_resource() takes a fourth (Debian's 6.1.192 onward) the build fails with the
    compiler error the real fork's did (fail-6.1.0-57.stderr) and p2pkit names the cause; against older
    ones it builds, as the real fork did for 6.1.0-47."""
    root, base, kernel = tree
    src, _ = clone(root, base, resize_bar1=True)
    pci_h = kbuild_root.run(root, f"cat /lib/modules/{kernel}/source/include/linux/pci.h 2>/dev/null || "
                                  f"cat /lib/modules/{kernel}/build/include/linux/pci.h").stdout
    four = re.search(r"int __must_check pci_resize_resource\([^)]*exclude_bars", pci_h) is not None
    r = kbuild_root.run(root, f"cd {inside(root, src)} && make modules -j2 {kbuild_root.trees(root, kernel)}",
                        check=False)
    if not four:
        assert r.returncode == 0, r.stderr[-2000:]
        return
    real = next(x for x in pbuild.kbuild_errors((FIX / "fail-6.1.0-57.stderr").read_text()) if "error:" in x)
    mine = pbuild.kbuild_errors(r.stderr)[0]
    assert r.returncode != 0 and mine.split("error: ", 1)[1] == real.split("error: ", 1)[1]
    assert next(c for needle, c in act.BUILD_CAUSES if needle in mine) == act.NEWER_KERNEL
