"""`p2pkit report FILE`: one archive for a bug report (p2pkit.app.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core.errors import P2pkitError, ProfileError


def report(
    file: Annotated[Path, typer.Argument(help="the archive to write (tar.gz), like p2pkit-report.tar.gz")],
    force: Annotated[bool, typer.Option("--force", help="replace FILE when it exists")] = False,
) -> None:
    """One archive for a bug report: the artifacts, each stage's last log, the facts, the profile and
    its overrides, the versions; secrets redacted. Runs without the GPUs working; says what it left out."""
    from p2pkit.app import report as report_mod

    final = report_mod.target(file, force)  # refused before any work
    common.output_file("", final)  # ... and one this user cannot write
    h = common.host()
    given = None
    try:
        profile, why = common.profile(h), ""
    except P2pkitError as e:  # a profile that does not load is often the thing to report: its file goes in
        profile, why = None, f"{e.message} (fix: {e.hint})" if e.hint else e.message
        if isinstance(e, ProfileError) and e.file and Path(e.file).is_file():
            given = Path(e.file)
    state = common.state_dir(h)
    rep = report_mod.gather(h, state, profile, why, given)
    report_mod.write(final, rep, force)
    out = common.output()
    out.simulated = h.simulated
    for item in rep.left_out:
        out.warn(f"left out: {item['what']}: {item['why']}")
    if common.OPTS.json:
        out.document({"file": str(final), "members": sorted(rep.members), "left_out": rep.left_out})
    else:
        out.line(f"wrote {file}: {len(rep.members)} files (secrets redacted); read it before you share it")
