"""What every engine module shares: a flag schema (which flags an engine knows, which are switches, which
take values and within what bounds, which name a file it reads or writes) and the rules that follow from a
schema alone: the command-line words, the values an engine cannot take, a name that looks like a secret.

An engine module (ninfer, llamacpp, vllm) holds its own schema and answers for its engine; this module
names no engine and no flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from p2pkit.core import secrets, unitenv
from p2pkit.core.config import _shown as shown  # a value as a profile error shows it: cut short

MAX_CONTEXT = 1 << 24  # a context beyond 2^24 tokens is no engine's


@dataclass(frozen=True)
class Flag:
    """One flag an engine knows. `switch`: it takes no value (true gives it bare, false leaves it out), and
    the engine reads the argument after it as an option. `bounds`: ("int" | "float" | "split", lo, hi), what
    a value the VRAM fit computes with must be. `path`: "reads" (a file the engine reads: held inside the
    directory it is named in, like the profile's own paths) or "writes" (a file the engine writes: a relative
    value is under the engine's working directory, the state directory's engine/)."""

    switch: bool = False
    bounds: tuple[str, float, float] | None = None
    path: str = ""


def schema(values: tuple[str, ...] = (), switches: tuple[str, ...] = (),
           bounds: dict[str, tuple[str, float, float]] | None = None, reads: tuple[str, ...] = (),
           writes: tuple[str, ...] = ()) -> dict[str, Flag]:
    """An engine's flags by name: `values` take a value as they are; the others are named by what they are."""
    out = {k: Flag() for k in values}
    out.update({k: Flag(switch=True) for k in switches})
    out.update({k: Flag(bounds=b) for k, b in (bounds or {}).items()})
    out.update({k: Flag(path="reads") for k in reads})
    out.update({k: Flag(path="writes") for k in writes})
    return out


def with_path(flags: dict[str, Flag], kind: str) -> tuple[str, ...]:
    return tuple(k for k, f in flags.items() if f.path == kind)


words = unitenv.words  # the flags as command-line words: the one definition, shared with the service role


def model_path(p) -> str:
    """What the engine loads: the converted output, or for an HF-format model the source itself."""
    return p.model.output or (p.model.source if p.model.format == "hf" else "")


def with_listen(p, flags: dict) -> dict:
    """The profile's flags with host and port from [serve] (the one place they are set)."""
    return {**flags, "host": p.serve.host, "port": p.serve.port}


def single_node(p) -> dict:
    """One host serves: an engine that does not span nodes."""
    return {"nnodes": 1, "rank": 0, "role": "single", "master_addr": None, "master_port": None}


def no_request_log(p, host, state_dir):
    """An engine that keeps no per-request log of its own."""
    return None


def no_draft_model(p) -> None:
    """An engine that loads no separate draft model file."""
    return None


def as_int(v, default: int | None) -> int | None:
    """A flag's integer value (TOML gives ints; a string of digits is accepted); None when it is not one."""
    if v is None:
        return default
    return int(v) if (isinstance(v, int) and not isinstance(v, bool)) or str(v).isdigit() else None


def problems(name: str, known: dict[str, Flag], flags: dict, secret_env: str = "", value_problem=None) \
        -> list[tuple[str, str]]:
    """(flag, why) for each value `name`'s engine cannot take, from its schema: a switch given a value, a
    value out of the bounds the fit computes with, a name that looks like a secret (`secret_env` says where the
    engine reads its secret instead); `value_problem(k, v)` adds the engine's own rule on values."""
    out = []
    for k, v in flags.items():
        f = known.get(k)
        if f is not None and f.switch and not isinstance(v, bool) and v is not None:
            out.append((k, f"--{k} takes no value, and {name} would read {shown(v)} as the next argument (an option "
                           f"when it starts with -): write {k} = true (or false to leave it out)"))
        elif value_problem is not None and (why := value_problem(k, v)):
            out.append((k, why))
    for k, v in flags.items():
        f = known.get(k)
        if f is not None and f.bounds and (why := _bounds_problem(*f.bounds, v)):
            out.append((k, f"{why} (the VRAM fit check computes with it, P18)"))
    for k in flags:
        if secrets.is_secret(k):
            env = f" ({secret_env})" if secret_env else ""
            out.append((k, "looks like a secret, and a flag's value is on the unit's command line, which every user "
                           f"can read (systemctl show): put it in [serve.env] instead{env}, which p2pkit keeps in a "
                           "root-only file"))
    return out


def _bounds_problem(kind: str, lo: float, hi: float, value) -> str | None:
    """Why a flag the fit check reads cannot be computed with, or None."""
    if kind == "split":
        parts = [x.strip() for x in str(value).split(",")]
        try:
            shares = [float(x) for x in parts]
        except ValueError:
            return f"expected comma-separated shares like 0.5,0.5, got {shown(value)}"
        if not all(math.isfinite(x) and x >= lo for x in shares) or not sum(shares) > 0:
            return f"expected shares of at least {lo}, not all 0, like 0.5,0.5, got {shown(value)}"
        return None
    want = f"{'an integer' if kind == 'int' else 'a number'} from {lo} to {hi}"
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind == "int" and not isinstance(value, int)):
        return f"expected {want}, got {shown(value)}"
    # an integer is compared as it is: math.isfinite() of a 401-digit one overflows converting it to a float
    if (isinstance(value, float) and not math.isfinite(value)) or not lo <= value <= hi:
        return f"expected {want}, got {shown(value)}"
    return None
