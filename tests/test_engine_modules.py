"""An engine module per recipe (p2pkit/rules/engines, issue 39 item 1): each engine owns its flags, its
command line, its refusals and its fit rules; core/config.py holds [serve.flags] to a table of scalars and
asks the recipe's engine module about the rest (plugged in when p2pkit.rules.engines is imported, as the CLI
does); the service act computes the command line once per start, for the unit and the launcher alike."""

from __future__ import annotations

import datetime
import tomllib
from dataclasses import fields, replace

import jsonschema
import pytest
from conftest import p2pkit_proc

from p2pkit.app import pipeline
from p2pkit.core import config
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import Exit, ProfileError
from p2pkit.core.output import Output
from p2pkit.host import Host
from p2pkit.rules import engine_cmd, engines
from p2pkit.rules.engines import flags
from p2pkit.schemas import profile_schema
from p2pkit.sim import lifecycle

RECIPES = next(f.metadata["choices"] for f in fields(config.Engine) if f.name == "recipe")
BUILTIN = {config.load(n).engine.recipe: config.load(n) for n in config.builtin_names()}
FUNCTIONS = ("binary", "command", "argv", "flags_of", "node", "served_model", "request_log", "flag_problems", "checks",
             "fit_plan", "fit_checks", "drafting", "draft_model")
# what one engine's readers elsewhere ask only it (bench's llama.cpp tools, the running server's slots, NInfer's
# --tp for the model stage); llamacpp.batched_flags also passes on two flags llama-server does not have
# (threads-batch, main-gpu: BATCHED_SAME_FLAGS), so it is not held to the schema here
OWN_READERS = {"llamacpp": ("slots", "bench_flags"), "ninfer": ("tensor_parallel",), "vllm": ()}


def test_every_recipe_has_an_engine_module_and_config_asks_it():
    assert set(engines.ENGINES) == set(RECIPES) == set(BUILTIN)
    assert config.ENGINES == engines.ENGINES  # importing the package plugged them in
    for name, m in engines.ENGINES.items():
        assert name == m.NAME
        assert m.FLAGS and all(isinstance(f, flags.Flag) for f in m.FLAGS.values()), name
        assert flags.with_path(m.FLAGS, "writes") == m.RELATIVE_FLAGS
        assert flags.with_path(m.FLAGS, "reads") == m.PATH_FLAGS
        assert all(callable(getattr(m, fn, None)) for fn in FUNCTIONS), name
        assert not m.CHECKS_HELP or callable(m.refuse_unaccepted), name


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_engines_command_line_is_its_command_then_its_flags_words(recipe):
    """The service role is given the command and the flags (a mapping) and writes ExecStart as command + the
    flags' words: that is each engine module's argv, with no word after the flags (switches, false and null
    flags included), and what start_line hands the role and the launcher."""
    m, p = engines.ENGINES[recipe], BUILTIN[recipe]
    q = replace(p, serve=replace(p.serve, flags={**p.serve.flags, "verbose": True, "quiet": False, "x": None}))
    for prof in (p, q):
        line = engine_cmd.start_line(prof)
        assert m.argv(prof) == [*m.command(prof), *flags.words(m.flags_of(prof))] == line["argv"]
        assert line["command"] == m.command(prof) and line["flags"] == m.flags_of(prof)
    assert "--verbose" in m.argv(q) and "--quiet" not in m.argv(q) and "--x" not in m.argv(q)


class Reading(dict):
    """Flags that remember each name read from them."""

    def __init__(self, *a):
        super().__init__(*a)
        self.read: set[str] = set()

    def get(self, k, default=None):
        self.read.add(k)
        return super().get(k, default)

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def __contains__(self, k):
        self.read.add(k)
        return super().__contains__(k)


@pytest.mark.parametrize("recipe", RECIPES)
def test_what_an_engine_reads_of_its_flags_is_a_flag_it_knows(recipe, tmp_path):
    """The fit, the refusals, the node and the model name read only flags the engine's schema knows (the
    fit once read vLLM's --kv-cache-dtype, which the flag list refused: no profile could set it)."""
    m, p = engines.ENGINES[recipe], BUILTIN[recipe]
    f = Reading(p.serve.flags)
    q = replace(p, serve=replace(p.serve, flags=f))
    m.fit_plan(q)
    m.node(q)
    m.served_model(q)
    m.request_log(q, Host.at(tmp_path), tmp_path)
    m.draft_model(q)
    given = Reading(m.flags_of(q))
    m.checks(q, given)
    m.drafting(given)
    for fn in OWN_READERS[recipe]:
        getattr(m, fn)(given)
    read = f.read | given.read
    assert read and read <= set(m.FLAGS), sorted(read - set(m.FLAGS))


# ------------------------------------------------------------------------- what config checks, what it asks

def profile_dict(name: str = "dual-5090-ninfer") -> dict:
    return tomllib.loads(config.builtin_path(name).read_text())


@pytest.mark.parametrize("value", [["a", "b"], {"a": 1}, datetime.date(2026, 12, 1)])
def test_a_flag_takes_one_scalar_value(value):
    d = profile_dict()
    d["serve"]["flags"]["model-id"] = value
    with pytest.raises(ProfileError) as e:
        config.from_dict(d, "p.toml")
    assert e.value.code == Exit.USAGE
    why = dict(e.value.problems).get("serve.flags.model-id", "")
    assert "a string, a number, or true or false" in why, e.value.problems
    if isinstance(value, list | dict):  # the profile's JSON Schema says the same
        doc = config.load("dual-5090-ninfer").as_dict()
        doc["serve"]["flags"]["model-id"] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, profile_schema())


def test_config_asks_the_recipes_engine_module_and_names_none_itself(monkeypatch):
    d = profile_dict("dual-5090-llamacpp")
    d["serve"]["flags"]["jinja"] = "--host=0.0.0.0"  # a switch given a value: llama.cpp's rule
    with pytest.raises(ProfileError) as e:
        config.from_dict(d, "p.toml")
    assert "takes no value" in dict(e.value.problems)["serve.flags.jinja"]
    monkeypatch.setattr(config, "ENGINES", {})  # no engine plugged in (the simulator's own processes)
    assert config.from_dict(d, "p.toml").serve.flags["jinja"] == "--host=0.0.0.0"

    class Engine:  # whatever the engine module says is what config refuses
        RELATIVE_FLAGS = ("jinja",)
        PATH_FLAGS = ()

        @staticmethod
        def flag_problems(f):
            return [("n-gpu-layers", "the engine module's own word")]

    monkeypatch.setattr(config, "ENGINES", {"llamacpp": Engine})
    with pytest.raises(ProfileError) as e:
        config.from_dict(d, "p.toml")
    assert e.value.problems == [("serve.flags.n-gpu-layers", "the engine module's own word")]


def test_a_fresh_p2pkit_process_refuses_what_the_engine_refuses():
    """The CLI plugs the engines in before it reads a profile: in a process of its own too."""
    r = p2pkit_proc("--set", "serve.flags.jinja=x", "profile", "validate", "dual-5090-llamacpp")
    assert r.returncode == Exit.USAGE and "serve.flags.jinja" in r.stderr and "takes no value" in r.stderr, r.stderr
    r = p2pkit_proc("--set", "serve.flags.served-model-name=--host=0.0.0.0", "profile", "validate", "dual-spark-vllm")
    assert r.returncode == Exit.USAGE and "argparse" in r.stderr, r.stderr
    r = p2pkit_proc("--set", "serve.flags.bogus-flag=1", "profile", "validate", "dual-5090-ninfer")
    assert r.returncode == Exit.USAGE and "serve.flags.bogus-flag" in r.stderr, r.stderr


# --------------------------------------------------------------------------- one command line per start

def service_ctx(root) -> pipeline.Ctx:
    h = Host.at(root)
    prof = config.load(h.sim["profile"])
    lifecycle.place_engine(root, prof)
    return pipeline.Ctx(profile=prof, host=h, store=Store(root / "var/lib/p2pkit"), out=Output())


@pytest.mark.parametrize("scenario", ["healthy", "no-systemd"])
def test_the_service_act_computes_the_command_line_once_for_the_unit_and_the_launcher(sim, monkeypatch,
                                                                                        scenario):
    from p2pkit.stages.service import act as service
    from p2pkit.stages.service import launcher as service_launcher

    ctx = service_ctx(sim(scenario))
    made, handed = [], {}
    start_line = engine_cmd.start_line

    def counted(p):
        made.append(start_line(p))
        return made[-1]

    def playbook(ctx, name, v):
        handed["command"], handed["flags"] = v["p2pkit_service_command"], v["p2pkit_service_flags"]
        return {"changed": 1}

    def started(host, **kw):
        handed["launcher"] = kw["shown_argv"]
        return {"started": True, "pid": 1}

    monkeypatch.setattr(engine_cmd, "start_line", counted)
    monkeypatch.setattr(service, "run_playbook", playbook)
    monkeypatch.setattr(service_launcher, "run_playbook", playbook)
    monkeypatch.setattr(service_launcher.launcher, "start", started)
    service.act(ctx)
    assert len(made) == 1, f"the command line was computed {len(made)} times"
    # the role's ExecStart is written from the very command and flags the launcher's argv is made of
    assert [*handed["command"], *flags.words(handed["flags"])] == made[0]["argv"] == engine_cmd.argv(ctx.profile)
    assert handed.get("launcher", made[0]["argv"]) == made[0]["argv"]
    assert ("launcher" in handed) == (scenario == "no-systemd")


# ------------------------------------------------------------------- what the engine module hands below it

@pytest.mark.parametrize("recipe,want", [("llamacpp", "/srv/models/draft.gguf"), ("ninfer", None), ("vllm", None)])
def test_the_fit_probe_hands_host_model_the_draft_model_its_engine_module_names(recipe, want, monkeypatch, tmp_path):
    """host/model.py lies below the rules and cannot ask an engine module: the VRAM fit's probe asks it
    (engine_cmd.draft_model) and hands model_shape the separate draft model: llama-server's -md, none for
    an engine whose draft is inside the model or its speculative config, whatever the flags hold."""
    from p2pkit.facts import probes
    from p2pkit.host import launcher, model, nvml

    p = BUILTIN[recipe]
    p = replace(p, serve=replace(p.serve, flags={**p.serve.flags, "model-draft": "/srv/models/draft.gguf"}))
    assert engine_cmd.draft_model(p) == want
    seen = []
    monkeypatch.setattr(model, "model_shape", lambda h, prof, draft=None: seen.append(draft) or {})
    monkeypatch.setattr(model, "tp_quant_kv_refused", lambda h, d: None)
    monkeypatch.setattr(nvml, "facts", lambda h: {"gpus": []})
    monkeypatch.setattr(launcher, "engine_process", lambda h: {"pid": None})
    probes._vram_fit(Host.at(tmp_path), p)
    assert seen == [want]
