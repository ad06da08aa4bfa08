"""What a host's state directory records besides the artifacts: the profile in force (its source
and its `--set` overrides), so that every later command (serve, status, verify, the resume unit,
the restore timer) judges and acts with the values the stages were brought up with.

<state>/profile.json: {"source": NAME|PATH, "overrides": ["section.key=VALUE", ...], "recorded": T}.
`up` writes it; a later command line adds to it (`--set` replaces the same key) or takes a key
out (`--unset section.key`); naming another profile with --profile starts from that profile alone.

<state>/secrets.json (0600 from its first byte, the one store of secrets given on a command line):
{"source": ..., "overrides": ["serve.env.NAME=VALUE", ...]}: the --set overrides of env values
declared secret (serve.secret_env) or named like one, which profile.json leaves out. A secret given
once stays there, and every later command (the resume unit, the restore path) gets it from there,
until `--unset serve.env.NAME` (or another --profile) takes it out. Every name read from it is a
secret whatever it is called.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from p2pkit.core import safefs
from p2pkit.core.artifacts import atomic_write
from p2pkit.core.config import builtin_names, parse_override
from p2pkit.core.errors import UsageError

PROFILE_FILE = "profile.json"
SECRETS_FILE = "secrets.json"
REWRITE_HINT = ("record it anew: `p2pkit --profile NAME|FILE [--set SECTION.KEY=VALUE ...] up` with the profile and "
                "every --set you mean (a command that names --profile does not read the broken record), or remove "
                "{path}")


def _key(item: str) -> str:
    return item.partition("=")[0].strip()


def canonical_source(source: str) -> str:
    """A built-in name as it is; a file as its absolute path, so a later command finds it."""
    return source if source in builtin_names() else str(Path(source).resolve())


def recorded_profile(state_dir: Path) -> dict | None:
    path = Path(state_dir) / PROFILE_FILE
    if safefs.is_file(path) and safefs.place_untrusted(path):  # what another user could write is never read (issue 48)
        safefs.check_trusted(path, "the recorded profile", REWRITE_HINT.format(path=path))
    try:
        doc = json.loads(safefs.read_text(path))  # never through a link (issue 40)
    except FileNotFoundError:
        return None
    except PermissionError:
        return None  # a user that cannot read the state reads no recorded profile (and cannot act)
    except (OSError, ValueError) as e:
        raise UsageError(f"the recorded profile {path} cannot be read: {e}",
                         hint=REWRITE_HINT.format(path=path)) from e
    if not (isinstance(doc, dict) and isinstance(doc.get("source"), str) and isinstance(doc.get("overrides"), list)
            and all(isinstance(o, str) for o in doc["overrides"])):
        raise UsageError(f"the recorded profile {path} is not a p2pkit profile record",
                         hint=REWRITE_HINT.format(path=path))
    return doc


def stored_secrets(state_dir: Path) -> dict | None:
    """The 0600 store's record, or None (none kept, or this user may not read it)."""
    path = Path(state_dir) / SECRETS_FILE
    if path.exists():  # the engine's secrets: what another user could write is never read
        safefs.check_trusted(path, "the secrets store", f"or remove {path} and give the secrets again with --set")
    try:
        doc = json.loads(safefs.read_text(path))
    except (FileNotFoundError, PermissionError):
        return None
    except (OSError, ValueError) as e:
        raise UsageError(f"the secrets store {path} cannot be read: {e}",
                         hint=f"give the secrets again with --set serve.env.NAME=VALUE on `p2pkit up`, after "
                              f"removing {path}") from e
    if not (isinstance(doc, dict) and isinstance(doc.get("overrides"), list)
            and all(isinstance(o, str) and o.startswith("serve.env.") for o in doc["overrides"])):
        raise UsageError(f"the secrets store {path} is not p2pkit's",
                         hint=f"give the secrets again with --set serve.env.NAME=VALUE on `p2pkit up`, after "
                              f"removing {path}")
    return doc


def resolve(state_dir: Path, profile: str | None, overrides: tuple[str, ...], unset: tuple[str, ...],
            fallback: str | None) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    """The profile source and overrides a command uses: the recorded ones and the stored secrets,
    with the command line's --set on top (the same key replaced) and its --unset keys taken out;
    and the serve.env names whose override the store gave (secrets, whatever their name)."""
    for item in overrides:
        parse_override(item)  # a malformed --set is refused before anything else
    try:
        rec = recorded_profile(state_dir)
    except UsageError:
        if profile is None:
            raise
        rec = None  # a record cut short or edited: --profile starts anew (`up` records it again)
    source = profile or (rec["source"] if rec else None) or fallback
    kept: dict[str, str] = {}
    stored: list[str] = []
    same = profile is None or (rec is not None and canonical_source(profile) == rec["source"])
    if rec and same:
        kept = {_key(o): o for o in rec["overrides"]}
    store = stored_secrets(state_dir) if same else None
    if store and (rec is None or store.get("source") == rec["source"]):
        for o in store["overrides"]:
            kept[_key(o)] = o
            stored.append(_key(o))
    for item in overrides:
        kept.pop(_key(item), None)
        kept[_key(item)] = item
    for key in unset:
        kept.pop(key.strip(), None)
    names = tuple(k.removeprefix("serve.env.") for k in stored if k in kept)
    return source, tuple(kept.values()), names


def public_overrides(profile) -> list[str]:
    """The overrides that may be written where others can read them: a secret (serve.env.HF_TOKEN=...)
    is left out, as from units (config.Profile.cli_args); it belongs in the root-only profile file."""
    args = profile.cli_args()
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def record_profile(state_dir: Path, profile) -> None:
    """profile.json with the public overrides; the secret ones in the 0600 store (none: no store)."""
    source = canonical_source(profile.source)
    doc = {"source": source, "overrides": public_overrides(profile),
           "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    safefs.makedirs(state_dir)  # never through a link at it or on the way (issue 48 item 1)
    kept = profile.secret_overrides()
    if kept:
        atomic_write(Path(state_dir) / SECRETS_FILE, (json.dumps({"source": source, "overrides": kept}, indent=2)
                                                      + "\n").encode(), mode=0o600)
    else:
        (Path(state_dir) / SECRETS_FILE).unlink(missing_ok=True)
    atomic_write(Path(state_dir) / PROFILE_FILE, (json.dumps(doc, indent=2) + "\n").encode())


def record_snapshot(state_dir: Path) -> dict[str, bytes | None]:
    """The recorded profile and the secrets store as they are (None: not there), to put back."""
    out = {}
    for name in (PROFILE_FILE, SECRETS_FILE):
        try:
            out[name] = safefs.read_bytes(Path(state_dir) / name)  # never a FIFO's wait (issue 48 item 4)
        except OSError:
            out[name] = None
    return out


def put_back(state_dir: Path, snapshot: dict[str, bytes | None]) -> None:
    """The record as record_snapshot found it (a file that was not there is removed again)."""
    for name, data in snapshot.items():
        path = Path(state_dir) / name
        if data is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write(path, data, mode=0o600 if name == SECRETS_FILE else 0o644)


def override_change(then: list[str] | None, now: tuple[str, ...], sections: list[str]) -> str:
    """The --set differences between a stage's run and now that touch the named sections."""
    a = {_key(o): o for o in then or []}
    b = {_key(o): o for o in now}
    out = []
    for key in sorted(set(a) | set(b)):
        if key.split(".")[0] not in sections or a.get(key) == b.get(key):
            continue
        was = f"--set {a[key]} when it ran" if key in a else f"{key} not overridden when it ran"
        is_ = f"--set {b[key]} now" if key in b else "not overridden now"
        out.append(f"{was}, {is_}")
    return "; ".join(out)


# ---------------------------------------------------------------------------------------- reboot budget
# `up --reboot` may reboot the host a few times for one bring-up; the count lives on disk with the
# boot ids seen, so a resume unit that runs at every boot cannot reboot the box forever when a
# change never takes effect (another bootloader reads the kernel command line).

REBOOTS_FILE = "reboots.json"
DEFAULT_MAX_REBOOTS = 3


def reboot_budget(state_dir: Path, exhausted: bool = False) -> dict | None:
    """The recorded budget (with exhausted=True: only when it is spent)."""
    try:
        doc = json.loads(safefs.read_text(Path(state_dir) / REBOOTS_FILE))
    except (OSError, ValueError):
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("boots"), list)):
        return None
    return doc if not exhausted or doc.get("exhausted") else None


def _save_budget(state_dir: Path, doc: dict) -> None:
    safefs.makedirs(state_dir)
    atomic_write(Path(state_dir) / REBOOTS_FILE, (json.dumps(doc, indent=2) + "\n").encode())


def start_reboot_budget(state_dir: Path, limit: int) -> None:
    """A person ran `up --reboot`: a new budget of `limit` reboots (an exhausted one is forgotten)."""
    _save_budget(state_dir, {"limit": limit, "boots": [], "exhausted": None})


def clear_reboot_budget(state_dir: Path) -> None:
    (Path(state_dir) / REBOOTS_FILE).unlink(missing_ok=True)


def spend_reboot(state_dir: Path, boot_id: str, why: str) -> str | None:
    """Count a reboot asked for in this boot; None to go ahead, or why the budget is spent."""
    doc = reboot_budget(state_dir) or {"limit": DEFAULT_MAX_REBOOTS, "boots": [], "exhausted": None}
    seen = [b.get("boot_id") for b in doc["boots"]]
    if boot_id in seen:  # this boot asked already and did not go down: the same reboot, not another
        return None
    if len(seen) >= int(doc.get("limit", DEFAULT_MAX_REBOOTS)):
        msg = (f"reboot budget spent: p2pkit rebooted this host {len(seen)} time(s) for this bring-up (boot ids "
               f"{', '.join(s[:8] for s in seen)}) and it still needs a reboot: {why}. A reboot that does not "
               "apply the change (a bootloader other than GRUB reading the kernel command line, a firmware "
               "setting) would reboot the box forever, so p2pkit stopped rebooting")
        doc["exhausted"] = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "boot_id": boot_id,
                            "why": msg}
        _save_budget(state_dir, doc)
        return msg
    doc["boots"].append({"boot_id": boot_id, "why": why,
                         "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")})
    _save_budget(state_dir, doc)
    return None
