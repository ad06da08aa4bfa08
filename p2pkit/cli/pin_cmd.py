"""`p2pkit pin`: the installer's sha256 and the fork's and engine's commits, into your profile file."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import Exit, UsageError


def pin(
    installer: Annotated[str | None, typer.Option("--installer", help="the NVIDIA .run you downloaded, or its URL "
                                                  "(its makeself checksums checked first; never run)")] = None,
    fork: Annotated[Path | None, typer.Option("--fork", help="a local checkout of the P2P fork")] = None,
    fork_remote: Annotated[bool, typer.Option("--fork-remote", help="the fork's commit from `git ls-remote` of "
                                              "p2p_module.repo at p2p_module.branch")] = False,
    engine: Annotated[Path | None, typer.Option("--engine", help="a local checkout of the engine")] = None,
    engine_remote: Annotated[bool, typer.Option("--engine-remote", help="the engine's commit from `git "
                                                "ls-remote` of engine.repo (its HEAD)")] = False,
    engine_offline: Annotated[Path | None, typer.Option(
        "--engine-offline", help="pack the profile's pinned engine archive for a box without network into this "
        ".tar.xz (verified, then packed without the models/docs/benches/media it never builds) and pin the "
        "profile to it")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="the profile file to write (default: the --profile "
                                             "file; a built-in profile needs --out)")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="write it (without: show the diff only)")] = False,
) -> None:
    """Fill the profile's three pins for a real box; the diff is shown first, --yes writes it."""
    from p2pkit.app import pin as pin_mod
    from p2pkit.core import config
    from p2pkit.core.artifacts import atomic_write

    prof = config.load(common.OPTS.profile, common.OPTS.overrides)
    out = _profile_file(prof, out, yes)
    if (fork and fork_remote) or (engine and engine_remote):
        raise UsageError("give a checkout or --*-remote for each of the fork and the engine, not both",
                         hint="`--fork DIR` or `--fork-remote`; `--engine DIR` or `--engine-remote`")
    if not (installer or fork or fork_remote or engine or engine_remote or engine_offline):
        raise UsageError("nothing to pin", hint="pass --installer FILE|URL, --fork DIR|--fork-remote, "
                                                "--engine DIR|--engine-remote and/or --engine-offline FILE")
    _never_the_network_of_a_simulated_host(prof, installer, fork_remote, engine_remote)
    found, pins = {}, {}
    if installer:
        _installer(prof, installer, found, pins)
    _commits(prof, fork, fork_remote, engine, engine_remote, found, pins)
    if engine_offline:
        dest = engine_offline.resolve()
        found["engine_offline"] = pin_mod.engine_offline(prof, dest, Path(prof.driver.cache_dir))
        packed = found["engine_offline"]
        pins.update({("engine", "source_url"): str(dest), ("engine", "source_sha256"): packed["sha256"],
                     ("engine", "source_subdir"): packed["subdir"]})
    text = pin_mod.profile_text(prof, out)
    new, diff = pin_mod.apply(text, pins, out, _notes(found))
    written = bool(yes or common.OPTS.yes) and new != text
    if written:
        atomic_write(out, new.encode())
    o = common.output()
    if common.OPTS.json:
        o.document({"profile": str(out), "found": found, "diff": diff, "written": written})
        raise typer.Exit(int(Exit.OK))
    _say_found(o, found)
    o.line(diff.rstrip("\n") if diff else f"{out}: already pinned so; nothing to change")
    if written:
        o.log(f"wrote {out}; use it with `p2pkit --profile {out} up`")
    elif diff:
        o.log(f"nothing was written; add --yes to write {out}")
    raise typer.Exit(int(Exit.OK))


def _profile_file(prof, out: Path | None, yes: bool) -> Path:
    """The file the pins go into: --out, else the --profile file (a built-in needs --out); one that cannot be
    written is refused before any download."""
    from p2pkit.core import config

    if out is None:
        if prof.source in config.builtin_names():
            raise UsageError(f"{prof.source} is a built-in profile: p2pkit pins a copy of it in your own file",
                             hint=f"add --out FILE (for example --out ./{prof.name}.toml); it gets the whole "
                                  "profile with the pins, ready to use with --profile FILE")
        out = Path(prof.source)
    out = out.resolve()
    if yes or common.OPTS.yes:
        common.output_file("--out", out)
    return out


def _never_the_network_of_a_simulated_host(prof, installer: str | None, fork_remote: bool,
                                           engine_remote: bool) -> None:
    """A simulated host never reaches the network: a pin asked of it is refused, naming the host's own sources."""
    if common.OPTS.root == Path("/") or not (h := common.host()).own_sources():
        return
    from dataclasses import replace

    from p2pkit.app import pin as pin_mod
    from p2pkit.stages.preflight.checks import missing_pins

    asked = replace(prof, driver=replace(prof.driver, installer_url=installer or prof.driver.installer_url))
    network = [k for k, given in (
        ("driver.installer_sha256", installer and "://" in installer and not installer.startswith("file://")),
        ("p2p_module.commit", fork_remote), ("engine.commit", engine_remote)) if given]
    if network:  # its hint is `up --pin` with the host's own sources: for every pin it will resolve
        pin_mod.refuse_sources_elsewhere(h, asked, list(dict.fromkeys([*network, *missing_pins(prof)])))


def _installer(prof, installer: str, found: dict, pins: dict) -> None:
    """The installer's sha256, after its own archive check, for the driver version the profile pins."""
    from p2pkit.app import pin as pin_mod

    with tempfile.TemporaryDirectory(prefix="p2pkit-pin-") as tmp:
        found["installer"] = pin_mod.installer_pin(installer, Path(tmp))
        got = found["installer"]["version"]
        if got and got != prof.driver.version:
            raise UsageError(f"the installer {installer} is driver {got} ({found['installer']['label']}); "
                             f"the profile pins driver {prof.driver.version}",
                             hint=f"download NVIDIA's {prof.driver.version} installer, or change driver.version "
                                  "in your profile first; nothing was pinned")
        pins[("driver", "installer_sha256")] = found["installer"]["sha256"]


def _commits(prof, fork: Path | None, fork_remote: bool, engine: Path | None, engine_remote: bool, found: dict,
             pins: dict) -> None:
    """The fork's and the engine's commits, from a checkout or from `git ls-remote`."""
    from p2pkit.app import pin as pin_mod
    from p2pkit.core.runner import Runner

    runner = Runner()
    if fork or fork_remote:
        found["fork"] = (pin_mod.checkout_commit(runner, fork) if fork else
                         pin_mod.remote_commit(runner, prof.p2p_module.repo, f"refs/heads/{prof.p2p_module.branch}"))
        pins[("p2p_module", "commit")] = found["fork"]["commit"]
    if engine or engine_remote:
        found["engine"] = (pin_mod.checkout_commit(runner, engine) if engine else
                           pin_mod.remote_commit(runner, prof.engine.repo, "HEAD"))
        pins[("engine", "commit")] = found["engine"]["commit"]


def _notes(found: dict) -> dict[tuple[str, str], str]:
    """The comment written beside each pin: where it came from (the README's promise; issue 47 item 12)."""
    import datetime as dt

    said = f"pinned by `p2pkit pin` on {dt.date.today().isoformat()}"
    notes = {}
    if "installer" in found:
        f = found["installer"]
        notes[("driver", "installer_sha256")] = f"{said}: sha256 of {f['file']} (archive check: {f['check']})"
    for what, key in (("fork", ("p2p_module", "commit")), ("engine", ("engine", "commit"))):
        if what in found:
            notes[key] = f"{said}: {found[what]['from']}"
    if "engine_offline" in found:
        f = found["engine_offline"]
        for key in (("engine", "source_url"), ("engine", "source_sha256"), ("engine", "source_subdir")):
            notes[key] = f"{said}: packed from {f['from']} (sha256 {f['from_sha256']})"
    return notes


def _say_found(o, found: dict) -> None:
    for what, f in found.items():
        if what == "engine_offline":
            o.log(f"engine source for a box without network: {f['path']} ({f['bytes'] / 2**20:.1f} MiB, {f['files']} "
                  f"files, {', '.join(f['dropped'])} left out), packed from {f['from']} (sha256 {f['from_sha256']}); "
                  f"copy it to the same path on the box")
            continue
        o.log(f"{what}: " + (f"{f['file']}: archive check: {f['check']}; sha256 {f['sha256']}" if what == "installer"
                             else f"{f['commit']} from {f['from']}"))
