"""sysfs, /proc and dpkg parsers."""

import pytest

from p2pkit.parse import pci, system
from tests.conftest import FIXTURES


@pytest.mark.parametrize("text,gen", [("32.0 GT/s PCIe", 5), ("2.5 GT/s PCIe", 1), ("16.0 GT/s", 4),
                                      ("8 GT/s", 3), ("64.0 GT/s PCIe", 6), ("Unknown", None), ("", None)])
def test_link_gen(text, gen):
    assert pci.link_gen(text) == gen


def h200_resource_table() -> str:
    lines = (FIXTURES / "h200-vm/sysfs_pci.txt").read_text().split("-- resource\n")[1].splitlines()
    return "\n".join(line for line in lines if line.startswith("0x"))


def test_vram_aperture_is_found_by_size_and_flags_not_index():
    res = pci.resources(h200_resource_table())
    ap = pci.vram_aperture(res)
    assert ap.index == 2 and ap.size == 256 << 30
    assert res[0].is_prefetchable_mem64  # BAR0 is 64-bit on the H200 VM: index alone would mislead


def test_vram_aperture_geforce_layout():
    table = ("0x00000000f0000000 0x00000000f3ffffff 0x0000000000040200\n"
             "0x0000001800000000 0x0000001fffffffff 0x000000000014220c\n"
             "0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
    ap = pci.vram_aperture(pci.resources(table))
    assert ap.index == 1 and ap.size == 32 << 30


def test_resources_rejects_malformed_line():
    with pytest.raises(ValueError):
        pci.resources("0x0 0x1\n")


def test_resize_bitmap():
    assert pci.resize_sizes("0000000000008000") == [32 << 30]
    assert max(pci.resize_sizes("0000000000007fc0")) == 16 << 30


def test_pcie_port_type_from_config_space():
    from p2pkit.sim.render import config_space

    assert pci.pcie_port_type(config_space(4)) == 4
    assert pci.pcie_port_type(config_space(6)) == 6
    assert pci.pcie_port_type(b"\0" * 64) is None  # no capability list
    assert pci.pcie_port_type(b"\0" * 10) is None  # truncated (non-root reads 64 bytes at most)


def test_upstream_chain():
    chain = pci.upstream_chain("/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0")
    assert chain == ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]


@pytest.mark.parametrize("cmdline,vendor,mode", [
    ("ro quiet", "AuthenticAMD", "default"),
    ("ro amd_iommu=on iommu=pt", "AuthenticAMD", "passthrough"),
    ("ro intel_iommu=on iommu=pt", "GenuineIntel", "passthrough"),
    ("ro iommu.passthrough=1", "GenuineIntel", "passthrough"),
    ("ro intel_iommu=off", "GenuineIntel", "off"),
    ("ro amd_iommu=off", "AuthenticAMD", "off"),
    ("ro iommu=off", "AuthenticAMD", "off"),
    ("ro amd_iommu=on iommu.passthrough=0", "AuthenticAMD", "translating"),
    ("ro intel_iommu=on", "GenuineIntel", "translating"),
])
def test_iommu_intent(cmdline, vendor, mode):
    assert system.iommu_intent(cmdline, vendor).mode == mode


def test_iommu_group_type():
    assert system.iommu_group_type("identity\n") == "passthrough"
    assert system.iommu_group_type("DMA-FQ\n") == "translating"


def test_nvidia_version_real_line():
    text = (FIXTURES / "h200-vm/host.txt").read_text().split("== driver version\n")[1]
    v = system.nvidia_version(text)
    assert (v.version, v.open_module, v.builder) == ("580.159.04", True, "nixbld@")


def test_nvidia_version_rejects_garbage():
    with pytest.raises(ValueError):
        system.nvidia_version("something else entirely\n")


def test_os_release_real_capture():
    text = (FIXTURES / "h200-vm/host.txt").read_text().split("== os-release\n")[1].split("==")[0]
    d = system.os_release(text)
    assert d["ID"] == "ubuntu" and d["VERSION_ID"] == "24.04"


def test_dpkg_half_installed_nvidia_packages():
    status = ("Package: nvidia-driver-580\nStatus: install ok half-configured\n\n"
              "Package: libnvidia-compute-580\nStatus: install ok installed\n\n"
              "Package: nvidia-dkms-580\nStatus: install reinstreq half-installed\n\n"
              "Package: bash\nStatus: install ok half-configured\n")
    assert system.dpkg_nvidia_problems(status) == [("nvidia-driver-580", "install ok half-configured"),
                                                   ("nvidia-dkms-580", "install reinstreq half-installed")]


def test_proc_cgroup_v1_and_v2():
    cg = system.proc_cgroup("4:memory:/process_api/abc\n1:cpu:/\n0::/user.slice\n")
    assert cg.v2_path == "/user.slice" and cg.v1["memory"] == "/process_api/abc"


@pytest.mark.parametrize("text,limit", [("max\n", None), ("9223372036854771712\n", None), ("8589934592", 8 << 30)])
def test_memory_limit(text, limit):
    assert system.memory_limit(text) == limit


def test_json_result_of_a_helper_process(tmp_path):
    """How the link worker and the vLLM probe report: the last JSON line, or an error naming the helper."""
    import sys

    from p2pkit.core.runner import Runner

    r = Runner()
    ok = r.json_result([sys.executable, "-c", "print('noise'); print('{\"a\": 1}')"], "the helper", 30)
    assert ok == {"a": 1}
    bad = r.json_result([sys.executable, "-c", "import sys; print('it broke', file=sys.stderr); sys.exit(3)"],
                        "the helper", 30)
    assert bad == {"error": "the helper exited 3 without a result: it broke"}
    gone = r.json_result(["/nonexistent/python3", "-c", "pass"], "the helper", 30)
    assert gone == {"error": "/nonexistent/python3 does not exist or is not executable"}


def test_architecture_picks_installer_libdir_and_iommu_option():
    import yaml

    from p2pkit.core.role_defaults import COLLECTION
    from p2pkit.host.arch import ARCHES
    from p2pkit.stages.p2p_module.act import iommu_cmdline
    from tests.conftest import REPO

    x86, arm = ARCHES["x86_64"], ARCHES["aarch64"]
    assert x86.installer("615.71.09") == "NVIDIA-Linux-x86_64-615.71.09.run"
    assert arm.installer("615.71.09") == "NVIDIA-Linux-aarch64-615.71.09.run"
    libdir = {m: yaml.safe_load((REPO / COLLECTION / f"roles/p2pkit_driver/vars/{m}.yml").read_text())
              ["p2pkit_driver_arch_libdir"] for m in ARCHES}  # stated once, by the driver role
    assert libdir == {"x86_64": "/usr/lib/x86_64-linux-gnu", "aarch64": "/usr/lib/aarch64-linux-gnu"}
    assert iommu_cmdline("passthrough", "AuthenticAMD", "x86_64") == "amd_iommu=on iommu=pt"
    assert iommu_cmdline("passthrough", "GenuineIntel", "x86_64") == "intel_iommu=on iommu=pt"
    assert iommu_cmdline("passthrough", "unknown", "aarch64") == "iommu.passthrough=1"
    assert system.iommu_intent("iommu.passthrough=1", "unknown").mode == "passthrough"  # read back the same


def test_an_installer_for_another_architecture_is_refused():
    from p2pkit.core import config
    from p2pkit.stages.driver.checks import installer_arch

    x86_profile = config.load("dual-5090-ninfer")
    c = installer_arch("aarch64", x86_profile)
    assert c.status == "fail" and c.expected == "NVIDIA-Linux-aarch64-615.71.09.run"
    assert installer_arch("x86_64", x86_profile).status == "pass"
    assert installer_arch("aarch64", config.load("dual-spark-vllm")).status == "pass"


def test_modinfo_fields_first_value_of_each():
    # `modinfo -k 6.8.0-88-generic nvidia` as kmod prints it (modinfo.c: the name and its colon padded to
    # 16 columns; alias and parm repeat; the signature goes on over tab-indented lines)
    text = ("filename:       /lib/modules/6.8.0-88-generic/updates/dkms/nvidia.ko.zst\n"
            "alias:          char-major-195-*\nversion:        580.95.05\nlicense:        Dual MIT/GPL\n"
            "srcversion:     6F7E32C2A1D9FA4E0B4C2C8\nalias:          pci:v000010DEd*sv*sd*bc03sc02i00*\n"
            "depends:        \nname:           nvidia\n"
            "vermagic:       6.8.0-88-generic SMP preempt mod_unload modversions \n"
            "signature:      30:2E:1B:6C\n\t\t7A:9B:0C\nparm:           NVreg_EnableGpuFirmware:int\n")
    f = system.modinfo_fields(text)
    assert f["filename"] == "/lib/modules/6.8.0-88-generic/updates/dkms/nvidia.ko.zst"
    assert f["srcversion"] == "6F7E32C2A1D9FA4E0B4C2C8" and f["alias"] == "char-major-195-*"
    assert f["depends"] == "" and f["vermagic"].endswith("modversions")
    assert "srcversion" not in system.modinfo_fields("modinfo: ERROR: Module nvidia not found.\n")


def test_modinfo_fields_on_a_real_nvidia_module():
    # the first lines of `modinfo nvidia` on a real 2x 5090 box (AMD Turin, the P2P-patched 590.44.01 under
    # DKMS), as posted in aikitoria/open-gpu-kernel-modules#15 (2026-01-08): repeated firmware and alias
    # lines, an import_ns and a softdep field before srcversion
    text = ("filename:       /lib/modules/6.8.0-90-generic/updates/dkms/nvidia.ko\n"
            "import_ns:      DMA_BUF\nalias:          char-major-195-*\nversion:        590.44.01\n"
            "supported:      external\nlicense:        Dual MIT/GPL\n"
            "firmware:       nvidia/590.44.01/gsp_tu10x.bin\nfirmware:       nvidia/590.44.01/gsp_ga10x.bin\n"
            "softdep:        pre: ecdh_generic,ecdsa_generic\nsrcversion:     6AB346C68F15FDDC88B47F1\n"
            "alias:          of:N*T*Cnvidia,tegra264-displayC*\nalias:          pci:v000010DEd*sv*sd*bc03sc00i00*\n"
            "depends:        ecc\nretpoline:      Y\nname:           nvidia\n"
            "vermagic:       6.8.0-90-generic SMP preempt mod_unload modversions\n"
            "parm:           NvSwitchRegDwords:NvSwitch regkey (charp)\nparm:           NVreg_ResmanDebugLevel:int\n")
    f = system.modinfo_fields(text)
    assert f["filename"] == "/lib/modules/6.8.0-90-generic/updates/dkms/nvidia.ko"
    assert f["srcversion"] == "6AB346C68F15FDDC88B47F1" and f["version"] == "590.44.01"
    assert f["firmware"] == "nvidia/590.44.01/gsp_tu10x.bin" and f["softdep"] == "pre: ecdh_generic,ecdsa_generic"
    assert f["parm"] == "NvSwitchRegDwords:NvSwitch regkey (charp)"
