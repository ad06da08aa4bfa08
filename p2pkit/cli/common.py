"""Global options and the objects every command builds from them."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from p2pkit.app.pipeline import Ctx, state_dir_default
from p2pkit.core import config, hoststate, safefs
from p2pkit.core.artifacts import Store
from p2pkit.core.errors import P2pkitError, ProfileError, UsageError
from p2pkit.core.output import Output
from p2pkit.host import HOST_ROOT_SIGNS, SIM_MARKER, Host
from p2pkit.rules import engines  # noqa: F401  (importing it plugs the engines' rules on [serve.flags] into config)


@dataclass
class Options:
    profile: str | None = None
    overrides: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()
    root: Path = Path("/")
    state_dir: Path | None = None
    json: bool = False
    yes: bool = False
    debug: bool = False


OPTS = Options()


def output() -> Output:
    args, simulated = host_options()  # a simulated host's errors say SIMULATED too
    # sudo is dropped from the commands p2pkit prints for root, who needs none (a box may have no sudo at all): a
    # user who is not root needs it (`status` run as another user says "run it as root: `sudo ...`")
    return Output(json_mode=OPTS.json, simulated=simulated, host_args=args, drop_sudo=os.geteuid() == 0)


def host_options() -> tuple[list[str], bool]:
    """The options that name the host this command acts on, as a printed p2pkit command must carry them
    (`--root R`, `--state-dir S` where not the default: absolute, so they hold from any directory), and
    whether that host is a simulated one (its commands need no sudo)."""
    root = Path(os.path.abspath(OPTS.root))
    args = [] if root == Path("/") else ["--root", str(root)]
    if OPTS.state_dir is not None and Path(os.path.abspath(OPTS.state_dir)) != state_dir_default(root):
        args += ["--state-dir", os.path.abspath(OPTS.state_dir)]
    return args, root != Path("/") and (root / SIM_MARKER).is_file()


def host() -> Host:
    """The host at --root, refused when the path cannot be a host root (a typo must not read as an
    empty host whose stages are all "not run")."""
    root = OPTS.root
    if not root.is_dir():
        raise UsageError(f"--root {root} {'is not a directory' if root.exists() else 'does not exist'}",
                         hint="check the path for a typo: --root names / (the default) or a simulated host's "
                              "directory (`p2pkit sim init DIR` lays one out)")
    # a typo first (`--root /tmp`): said as a typo, before what the trust check would say of a shared directory
    # (one stat per sign, nothing read)
    signs = (SIM_MARKER, *HOST_ROOT_SIGNS)
    if Path(os.path.abspath(root)) != Path("/") and not any((root / x).exists() for x in signs):
        raise not_a_host_root(root)
    trusted(root, "the host root (--root)", "or lay a simulated host out where only root can change it")
    h = Host.at(root)
    if not h.is_host_root():
        raise not_a_host_root(root)
    h.refuse_lost_standins()  # stand-ins whose Python is gone: said once, with the command that lays it out again
    return h


def not_a_host_root(root: Path) -> UsageError:
    return UsageError(f"--root {root} is neither a simulated host nor a host's root filesystem "
                      f"(none of {SIM_MARKER}, {', '.join(HOST_ROOT_SIGNS)} is there)",
                      hint="check the path for a typo: --root names / (the default) or a simulated host's "
                           "directory (`p2pkit sim init DIR` lays one out)")


PATH_OPTIONS = (("--root", "root"), ("--state-dir", "state_dir"), ("--profile", "profile"))


def absolute(path: Path) -> Path:
    """A path option as an absolute path: a relative one joined to the directory the user ran from
    (symlinks left as they are: the ownership check follows them)."""
    return Path(os.path.abspath(path))


def refuse_repeated_sets(overrides: tuple[str, ...]) -> None:
    """`--set KEY=A --set KEY=B` on one command line: refused (exit 2) naming both values. Which one
    was meant cannot be known, and keeping the last one silently changed what the user read back; the
    same value twice is no question and passes. A --set that replaces a recorded override is the way to
    change it and is not a repeat."""
    seen: dict[str, str] = {}
    for item in overrides:
        parts, _ = config.parse_override(item)
        key = ".".join(parts)
        value = item.partition("=")[2].strip()
        if key in seen and seen[key] != value:
            raise UsageError(f"--set {key} is given twice with different values: {_cut(seen[key])} and "
                             f"{_cut(value)}",
                             hint=f"keep the one you mean (`--set {key}=VALUE` once); nothing was done")
        seen[key] = value


def _cut(value: str) -> str:
    """A value as an error shows it: whole when short, else cut and named by its size (never echoed whole)."""
    return repr(value) if len(value) <= 80 else config.shown(value)


def output_file(option: str, path: Path | None, remote: bool = False) -> Path | None:
    """A file a command writes (--junit, --prometheus, --plot, report FILE, facts record FILE), checked
    before any work: absolute (a relative path is the working directory's), not a directory, in a
    directory that exists and this user can write. `remote`: a path on each host of an inventory, only
    made absolute."""
    if path is None:
        return None
    p = absolute(path)
    if remote:
        return p
    name = f"{option} {path}" if option else str(path)
    if p.is_dir():
        raise UsageError(f"{name} is a directory: it names the file to write",
                         hint=f"name a file in it, like {p / 'out'}; nothing was done")
    if not p.parent.is_dir():
        raise UsageError(f"{name}: {p.parent} {'is not a directory' if p.parent.exists() else 'does not exist'}",
                         hint=f"create it first (`mkdir -p {p.parent}`) or name a file in a directory that exists; "
                              "nothing was done")
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{name}: {p if p.exists() else p.parent} is not writable by this user",
                         hint="name a file where you can write, or run as root (`sudo p2pkit ...`); nothing was done")
    return p


def refuse_unsafe_paths() -> None:
    """At the door, before anything acts: a path option holding a character that a shell or Ansible's
    temporary-directory handling would interpret is refused (exit 2), naming the option and the
    character. The path checked is the absolute one p2pkit hands on (a relative one joined to the
    working directory); a built-in profile's name is not a path."""
    for option, attr in PATH_OPTIONS:
        value = getattr(OPTS, attr)
        if value is None or (option == "--profile" and value in config.builtin_names()):
            continue
        refuse_unsafe_path(option, str(value))


def refuse_unsafe_path(option: str, value: str) -> None:
    why = config.unsafe_path_char(os.path.abspath(value))
    if why:
        raise UsageError(f"{option} {value!r} holds {why}: p2pkit hands this path to Ansible and writes it into "
                         "units and hooks, where a shell would interpret it, so it may hold only letters, digits "
                         "and . _ / + @ , = ~ : - (the working directory counts for a relative path)",
                         hint=f"give {option} a path made of those characters (rename or move the directory); "
                              "nothing was done")


def sim_hint(h: Host) -> str:
    """On a host that is not simulated and has no NVIDIA GPU: how to try p2pkit on a simulated one
    (what doctor's and preflight's GPU check say); "" elsewhere."""
    from p2pkit.host import pci
    from p2pkit.stages.preflight.checks import SIM_HINT

    if not h.offers_simulator():
        return ""
    try:
        found = pci.gpu_bdfs(h)
    except (P2pkitError, OSError):
        return ""
    return "" if found else f"this host has no NVIDIA GPU; {SIM_HINT}"


def with_sim_hint(hint: str) -> str:
    """An error's fix, and the simulated host's where this host has no NVIDIA GPU (`up` and `status`
    fail before preflight as a user that is not root: nothing else would say it)."""
    try:
        extra = sim_hint(host())
    except P2pkitError:
        return hint
    return f"{hint}; {extra}" if extra and extra not in hint else hint


def state_dir(h: Host) -> Path:
    """--state-dir, else <root>/var/lib/p2pkit; refused when it names something that is not a
    directory (every path under it would fail with "Not a directory" of a file inside it)."""
    d = OPTS.state_dir or state_dir_default(h.root)
    if d.exists() and not d.is_dir():
        given = "--state-dir " if OPTS.state_dir else "the state directory "
        raise UsageError(f"{given}{d} is not a directory",
                         hint="name a directory (p2pkit makes it when it is missing), or leave --state-dir out "
                              "for <root>/var/lib/p2pkit")
    sysdir = config.system_dir(h.host_path(d))
    if OPTS.state_dir and (sysdir or h.host_path(d).count("/") == 1):  # issue 48 item 5
        where = "/ itself" if sysdir == "/" else f"in the system directory {sysdir}" if sysdir else \
            "a top-level directory itself"
        raise UsageError(f"--state-dir {d} is {where}: p2pkit makes and fills the state directory as root",
                         hint="give --state-dir a directory of its own (like /var/lib/p2pkit, the default); nothing "
                              "was done")
    trusted(d, "the state directory", "or give --state-dir a directory only root can change")
    safefs.own(d, base=h.root)  # reached from the host's root (or its parent) without a link (issue 48 item 1)
    safefs.reach(d)
    return d


_TRUSTED: set[str] = set()


def trusted(path: Path, what: str, fix: str) -> None:
    """Before anything is read or written there: `path` and every directory above it owned by root
    (or the running user) and writable by no one else (core.safefs.check_trusted), once per path."""
    key = os.path.abspath(path)
    if key not in _TRUSTED:
        safefs.check_trusted(path, what, fix)
        _TRUSTED.add(key)


def profile(h: Host | None = None) -> config.Profile:
    """The command line's profile; for a host, on top of the profile its state records (the
    overrides `up` ran with stay in force: hoststate)."""
    if h is None:
        return config.load(OPTS.profile, OPTS.overrides)
    # a built-in name on a simulated host laid out with it is the host's own pinned copy (Host.own_profile)
    given = h.own_profile(OPTS.profile) or OPTS.profile
    source, overrides, stored = hoststate.resolve(state_dir(h), given, OPTS.overrides, OPTS.unset,
                                                  h.default_profile())
    # a relative path in the profile is under the state directory, never where p2pkit was started
    return contained(config.anchored(config.load(source, overrides, stored), h.host_path(state_dir(h))), h)


def contained(p: config.Profile, h: Host) -> config.Profile:
    """The profile's paths (and the state directory's) checked on this host: a symlink that leads
    out of the directory a path belongs to is refused before anything is written (exit 2)."""
    problems = config.escaping_paths(p, h.realpath, h.host_path(state_dir(h)),
                                     kernel_realpath=h.kernel_realpath)
    if problems:
        raise ProfileError(p.source, problems)
    return p


def context(h: Host | None = None) -> Ctx:
    h = h or host()
    out = output()
    out.simulated = h.simulated
    profile_ = profile(h)
    store = Store(state_dir(h))
    return Ctx(profile=profile_, host=h, store=store, out=out, debug=OPTS.debug, yes=OPTS.yes)


def setup_logging(debug: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(name)s: %(message)s")
