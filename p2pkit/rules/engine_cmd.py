"""The engine's command line and its address, built from the profile through its engine module
(p2pkit/rules/engines: each engine owns its flags, its argv, its refusals and its fit rules), and the
refusals every engine shares (a flag it does not know, one written as a command-line word, the listening
address) before a start (P10, P11, P18, P20 in the engine modules).
"""

from __future__ import annotations

from dataclasses import replace

from p2pkit.core.config import Profile
from p2pkit.rules import engines
from p2pkit.rules.engines import flags as engine_flags
from p2pkit.rules.findings import FAIL, PASS, WARN, Check, judge

model_path = engine_flags.model_path  # what the engine loads: the converted output, or an HF model's source


def engine(p: Profile):
    """The profile's engine module (ninfer, llamacpp or vllm)."""
    return engines.of(p)


def binary(p: Profile) -> str:
    return engine(p).binary(p)


def served_model(p: Profile) -> str:
    """The model name an OpenAI request must give."""
    return engine(p).served_model(p)


def request_log(p: Profile, host, state_dir):
    """Where the engine's own JSONL request log is on this host, or None when it keeps none."""
    return engine(p).request_log(p, host, state_dir)


def node(p: Profile) -> dict:
    """This host's place in a multi-node engine: rank, how many, the head's rendezvous address (one host
    serves, for an engine that does not span nodes)."""
    return engine(p).node(p)


def drafting(p: Profile) -> str | None:
    """The engine's drafting setting as its flags give it (llama-server's --spec-type, NInfer's --spec, vLLM's
    --speculative-config); None when drafting is off."""
    return engine(p).drafting(p.serve.flags)


def draft_model(p: Profile) -> str | None:
    """The separate draft model file the engine loads beside the model (llama-server's -md), or None."""
    return engine(p).draft_model(p)


def flags_of(p: Profile) -> dict:
    """The flags the engine is started with: the profile's, with host and port from [serve]."""
    return engine(p).flags_of(p)


def client_host(p: Profile) -> str:
    """Where a client on this host reaches the engine: loopback when it listens on every address."""
    return "127.0.0.1" if p.serve.host in ("0.0.0.0", "::") else p.serve.host


def base_url(p: Profile) -> str:
    return f"http://{client_host(p)}:{p.serve.port}"


def health_url(p: Profile) -> str:
    return f"{base_url(p)}/health"


def argv(p: Profile) -> list[str]:
    """The engine's command line: what the unit's ExecStart and p2pkit's launcher both run."""
    return engine(p).argv(p)


def command(p: Profile) -> list[str]:
    """The engine's command line before its flags: argv(p) is command(p) + the flags' words (flags_of)."""
    return engine(p).command(p)


def start_line(p: Profile) -> dict:
    """One start's command line, computed once: the command before the flags, the flags (a mapping, as the
    service role is given them) and the whole argv (what p2pkit's launcher runs and the unit's ExecStart
    holds): the command, then the flags' words, which is how every engine module's argv(p) is made (none puts
    a word after its flags; tests/test_engine_modules.py holds it)."""
    cmd, flags = command(p), flags_of(p)
    return {"command": cmd, "flags": flags, "argv": [*cmd, *engine_flags.words(flags)]}


FORM_FIX = "write serve.flags as `name = value` (p2pkit adds the dashes; the engine rejects --flag=value)"


def unknown_flags(p: Profile) -> list[str]:
    """The flags the engine does not know."""
    return sorted(set(flags_of(p)) - set(engine(p).FLAGS))


def worded_flags(p: Profile) -> list[str]:
    """The flags written as command-line words (with dashes or `=`), not as names."""
    return sorted(k for k in flags_of(p) if "=" in k or k.startswith("-"))


def validate(p: Profile, name_unset: bool = True) -> list[Check]:
    """The start's refusals and warnings of the profile's serve flags; `name_unset`: a refusal's fix names the
    --unset of the flags given with --set and kept for the host (not for a --set refused on its own command
    line)."""
    eng = engine(p)
    flags = flags_of(p)
    out = []
    unknown = unknown_flags(p)
    # a flag given with --set and kept for the host is taken out with --unset, not by editing the profile
    kept = [f"serve.flags.{n}" for n in unknown if any(o.startswith(f"serve.flags.{n}=") for o in p.overrides)]
    unset = (f" (given with --set and kept for this host: `p2pkit {' '.join('--unset ' + k for k in kept)} up` "
             "takes them out)") if kept else ""
    out.append(judge("service.flags_known", "every serve flag is one the engine knows", not unknown,
                     ", ".join(unknown) or "all known", f"flags of {p.engine.recipe}",
                     f"remove or rename them{unset}; {p.engine.recipe} knows: {', '.join(sorted(eng.FLAGS))}"))
    bad_form = worded_flags(p)
    if bad_form:
        out.append(Check("service.flags_form", "flags written as names", FAIL, ", ".join(bad_form),
                         "names without dashes or '='", FORM_FIX))
    if "host" in flags:  # a headless vLLM worker listens nowhere
        out.append(_host(p))
    return out + [_unset_named(c, p) if name_unset else c for c in eng.checks(p, flags)]


def _unset_named(c: Check, p: Profile) -> Check:
    """A refusal of a flag's value where serve flags were given with --set and kept for this host: its fix names
    the --unset that takes them out (editing the profile file would not: issue 47 item 5); the flag the check is
    named for where it is one of them, else each kept one."""
    kept = [o.partition("=")[0].strip() for o in p.overrides if o.startswith("serve.flags.")]
    if c.status != FAIL or not kept:
        return c
    named = f"serve.flags.{c.id.removeprefix('service.').replace('_', '-')}"
    keys = [named] if named in kept else kept
    return replace(c, hint=f"{c.hint} ({', '.join(keys)} {'was' if len(keys) == 1 else 'were'} given with --set and "
                           f"kept for this host: `p2pkit {' '.join('--unset ' + k for k in keys)} up` takes "
                           f"{'it' if len(keys) == 1 else 'them'} out)")


def refusals(p: Profile) -> list[tuple[str, str]]:
    """validate's refusals of how serve.flags are written (a flag the engine does not know, one written with
    dashes or `=`), as problems by key: `profile validate`, and `up` and `plan` for a flag given with --set,
    refuse a profile the start would refuse for them. The engine's rules on the values (--tp, the rendezvous
    address) stay the start's: an inventory completes those per host (the Spark pair's master-addr)."""
    worded = worded_flags(p)
    out = [(f"serve.flags.{name}", f"written as a command-line word; the start refuses it: {FORM_FIX}")
           for name in worded]
    knows = ", ".join(sorted(engine(p).FLAGS))
    out += [(f"serve.flags.{name}", f"{p.engine.recipe} has no flag --{name}: the start refuses it; remove or "
             f"rename it; {p.engine.recipe} knows: {knows}") for name in unknown_flags(p) if name not in worded]
    return out


def refused_by(p: Profile, before: Profile) -> list[Check]:
    """The start's refusals of `p` that `before` (the same profile without some --set) does not have: what those
    overrides bring (an inventory's per-host values only take refusals away)."""
    had = {c.id for c in validate(before) if c.status == FAIL}
    return [c for c in validate(p, name_unset=False) if c.status == FAIL and c.id not in had]


def _host(p: Profile) -> Check:
    if p.serve.host in ("0.0.0.0", "::"):
        return Check("service.listen", "listening address", WARN, p.serve.host, "127.0.0.1",
                     "serve.allow_public is set: the API is reachable from the network with no authentication; "
                     "put it behind a firewall or a reverse proxy")
    return Check("service.listen", "listening address", PASS, f"{p.serve.host}:{p.serve.port}", "127.0.0.1")
