"""What the engine role and p2pkit both state lives in the role's defaults/main.yml and p2pkit reads it
(issue 39 item 3): the build directory's name inside the checkout. p2pkit reads it when first asked,
never at import (`p2pkit doctor` imports the engine stage and pays for no YAML)."""

import subprocess
import sys

import yaml

from p2pkit.core import ansible
from p2pkit.rules.engines import llamacpp as llamacpp_engine
from p2pkit.rules.engines import ninfer as ninfer_engine
from p2pkit.sim import rules as sim_rules
from p2pkit.stages.engine import cmake as act
from tests.conftest import REPO

DEFAULTS = REPO / ansible.COLLECTION / "roles/p2pkit_engine/defaults/main.yml"


def test_the_build_subdir_p2pkit_uses_is_the_roles_default():
    role = yaml.safe_load(DEFAULTS.read_text())["p2pkit_engine_build_subdir"]
    assert act.build_subdir() == role == "build"
    # the engines' binaries and the simulator's built engine are under it
    for server in (llamacpp_engine.SERVER, ninfer_engine.SERVER, *sim_rules.ENGINE_SERVER.values()):
        assert server.split("/", 1)[0] == role, server


def test_p2pkit_reads_the_roles_defaults_once_and_not_at_import():
    code = ("import sys; import p2pkit.stages.engine.cmake as a; from p2pkit.core import role_defaults as rd; "
            "assert rd.role_defaults.cache_info().currsize == 0; a.build_subdir(); a.build_subdir(); "
            "i = rd.role_defaults.cache_info(); assert (i.misses, i.hits) == (1, 1), i")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_role_hands_the_log_and_options_p2pkit_gives_and_names_them_in_its_spec():
    """Each variable role_vars hands is in the role's argument_specs (the contract test holds the rest)."""
    spec = yaml.safe_load((DEFAULTS.parent.parent / "meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    from p2pkit.app import pipeline
    from p2pkit.core import config
    from p2pkit.core.artifacts import Store
    from p2pkit.core.output import Output
    from p2pkit.host import Host

    for name in ("dual-5090-llamacpp",):
        ctx = pipeline.Ctx(profile=config.load(name, ["engine.cuda=false"]), host=Host.at("/"),
                           store=Store(REPO / "nowhere"), out=Output())
        handed = act.role_vars(ctx, REPO / "nowhere.log")
        assert set(handed) <= set(options)
        assert handed["p2pkit_engine_repo"] == "" and handed["p2pkit_engine_cmake_options"][-1] == "-DGGML_CUDA=OFF"
        assert "-G" not in handed["p2pkit_engine_cmake_options"]  # the role gives -G Ninja
