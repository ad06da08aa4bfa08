"""The simulator states the rules it imitates itself (issue 28, item 4): it imports none of the
product's rules, and where the product and the simulator state the same rule, both statements agree
on every case the scenarios reach (a difference is a bug in one of them, and fails here)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
import yaml

from p2pkit.core import config
from p2pkit.core.role_defaults import COLLECTION
from p2pkit.host.arch import ARCHES
from p2pkit.parse import field as pf
from p2pkit.parse import pci
from p2pkit.parse import system as ps
from p2pkit.parse.smi import TOPO_LEGEND
from p2pkit.rules import engine_cmd
from p2pkit.rules.engines import ninfer, vllm
from p2pkit.sim import engine as sim_engine
from p2pkit.sim import model, rules, scenarios
from tests.conftest import REPO

SIM = Path(__file__).resolve().parent.parent / "p2pkit/sim"
# The product's rules and tables: what the product decides about a host (parsers, checks, the engine's
# flag table and command line, the architecture table, the pitfall list, the stages' own logic). The
# simulator may import the product's plumbing (errors, writers, the TOML writer, the profile loader,
# the host object and its launcher), never these.
RULE_MODULES = ("p2pkit.parse", "p2pkit.rules", "p2pkit.host.arch", "p2pkit.stages", "p2pkit.app.doctor",
                "p2pkit.facts")


def imported(source: str) -> set[str]:
    """Every module a source imports, at its top or inside a function (`from p2pkit import x` counts as
    p2pkit.x: x may be a module)."""
    out = set()
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
    return out


def rules_imported(source: str) -> list[str]:
    return sorted(m for m in imported(source) if any(m == r or m.startswith(r + ".") for r in RULE_MODULES))


def test_the_simulator_imports_none_of_the_products_rules():
    bad = {p.name: got for p in sorted(SIM.glob("*.py")) if (got := rules_imported(p.read_text()))}
    assert bad == {}, f"the simulator states the rules it imitates itself (p2pkit/sim/rules.py): {bad}"


def test_the_rule_finder_finds_a_rule_imported_anywhere():
    src = ("from p2pkit import config, writers\nfrom p2pkit.host import SIM_MARKER\n"
           "def f():\n    from p2pkit.parse.system import iommu_intent\n    import p2pkit.rules.engine_cmd\n"
           "    from p2pkit.rules import pitfalls\n")
    assert rules_imported(src) == ["p2pkit.parse.system", "p2pkit.parse.system.iommu_intent", "p2pkit.rules",
                                   "p2pkit.rules.engine_cmd", "p2pkit.rules.pitfalls"]


def test_a_broken_product_rule_does_not_move_the_simulator(monkeypatch):
    """The simulated kernel decides the IOMMU mode by its own rule: with the product's rule broken (it
    reads every command line as passthrough), the simulated host still translates, so the product's
    checks now disagree with what the host shows, as they would on a real one."""
    state = scenarios.build("iommu-translating")
    monkeypatch.setattr(ps, "iommu_intent", lambda *_: ps.IommuIntent("passthrough", "broken", ()))
    assert model.iommu_effective(state) == "translating"


# ------------------------------------------------------------------ the two statements agree

def product_effective(cmdline: str, vendor: str, firmware: bool) -> str:
    """The product's reading of the command line as an effective mode; "default" is the kernel's build
    default, translated on Ubuntu 24.04 (parse/system.py's iommu_intent)."""
    if not firmware:
        return "off"
    mode = ps.iommu_intent(cmdline, vendor).mode
    return "translating" if mode == "default" else mode


IOMMU_CASES = [
    "quiet splash", "amd_iommu=on iommu=pt", "intel_iommu=on iommu=pt", "iommu.passthrough=1", "iommu=pt",
    "amd_iommu=on iommu.passthrough=0", "intel_iommu=on", "iommu=off", "amd_iommu=off", "intel_iommu=off",
    "iommu.passthrough=0", "iommu.passthrough=y",
]


@pytest.mark.parametrize("vendor", ["AuthenticAMD", "GenuineIntel"])
def test_simulator_and_product_agree_on_the_iommu_mode(vendor):
    for cmdline, firmware in itertools.product(IOMMU_CASES, (True, False)):
        assert rules.iommu_mode(cmdline, vendor, firmware) == product_effective(cmdline, vendor, firmware), \
            (cmdline, vendor, firmware)


def test_simulator_and_product_agree_on_every_scenarios_iommu_mode():
    for name in scenarios.SCENARIOS:
        s = scenarios.build(name)
        assert model.iommu_effective(s) == product_effective(s["cmdline"], s["cpu_vendor"], s["iommu_firmware"]), name


def test_simulator_and_product_agree_when_nccl_takes_p2p():
    """Two GPUs on an x86 host (the scenarios' pairs): NCCL's default level and NCCL_P2P_LEVEL over every
    relation nvidia-smi prints, as the product (parse/field.py) and the simulator (sim/rules.py) each
    state NCCL's ncclTopoCheckP2p."""
    for vendor, relation, level in itertools.product(("AuthenticAMD", "GenuineIntel"), pf.SMI_TO_NCCL,
                                                     (None, *pf.P2P_LEVELS)):
        env = {"NCCL_P2P_LEVEL": level} if level else {}
        product = pf.nccl_level_allows(level or pf.nccl_default_level(vendor, 2), relation)
        assert rules.nccl_uses_p2p(env, relation, "x86_64", vendor) == product, (vendor, relation, level)
        assert not rules.nccl_uses_p2p({**env, "NCCL_P2P_DISABLE": "1"}, relation, "x86_64", vendor)
        # the product's advice: the level the pair needs makes NCCL take P2P
        need = pf.nccl_level_needed(relation, vendor, 2)
        if need is not None:
            assert rules.nccl_uses_p2p({"NCCL_P2P_LEVEL": need}, relation, "x86_64", vendor), (vendor, relation)


def test_simulator_and_product_agree_on_pcie_nvidia_smi_and_the_layout():
    assert rules.PCIE_GTS == pci.GEN_TO_GTS
    assert all(pci.link_gen(rules.link_speed_text(g)) == g for g in rules.PCIE_GTS)
    assert dict(rules.SMI_TOPO_LEGEND) == TOPO_LEGEND
    for machine, arch in ARCHES.items():
        role = yaml.safe_load((REPO / COLLECTION / f"roles/p2pkit_driver/vars/{machine}.yml").read_text())
        assert rules.MULTIARCH_LIBDIR[machine] == role["p2pkit_driver_arch_libdir"]
        assert rules.nvidia_installer(machine, "615.71.09") == arch.installer("615.71.09")
    assert set(rules.MULTIARCH_LIBDIR) == set(ARCHES)


def test_simulator_and_product_agree_on_the_engines_flags_and_binary():
    assert set(ninfer.FLAGS) == sim_engine.NINFER_SERVE_FLAGS
    assert set(vllm.FLAGS) == sim_engine.VLLM_SERVE_FLAGS
    for name in config.builtin_names():
        e = config.load(name).engine
        if e.recipe != "vllm":
            assert f"{e.build_dir}/{rules.ENGINE_SERVER[e.recipe]}" == engine_cmd.binary(config.load(name)), name
