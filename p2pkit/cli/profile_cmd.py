"""`p2pkit profile list|show|validate`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from p2pkit.cli import common
from p2pkit.core import config, tomlwrite
from p2pkit.core.errors import Exit, ProfileError
from p2pkit.core.secrets import redact

app = typer.Typer(help="Built-in profiles, and checking your own.", no_args_is_help=True)


@app.command("list")
def list_() -> None:
    """The built-in profiles."""
    out = common.output()
    rows = []
    for n in config.builtin_names():
        p = config.load(n)
        rows.append([n + (" (default)" if n == config.DEFAULT_PROFILE else ""), p.profile.description])
    if common.OPTS.json:
        out.document({"profiles": [{"name": r[0].split()[0], "description": r[1]} for r in rows]})
    else:
        out.table("profiles", ["name", "description"], rows)


@app.command()
def show(
    name: Annotated[str | None, typer.Argument(help="profile name or TOML file (default: the one this host's state "
                                               "records, with its overrides)")] = None,
    toml: Annotated[bool, typer.Option("--toml", help="as a TOML file to edit and use with --profile")] = False,
) -> None:
    """A profile with every default filled in and every --set override applied."""
    p = config.load(name, common.OPTS.overrides) if name else common.profile(common.host())
    out = common.output()
    doc = {"source": p.source, "overrides": list(p.overrides), "profile": p.as_dict()}
    if toml:
        applied = ", with these overrides applied:" if p.overrides else ""
        head = [f"p2pkit profile {p.name}, from {p.source}{applied}",
                *[f"  --set {o}" for o in p.overrides],
                "every default filled in; edit it, check it with `p2pkit profile validate FILE`, use it with "
                "--profile FILE"]
        text = redact("\n".join(tomlwrite.comment(x) for x in head) + "\n" + tomlwrite.dumps(p.as_dict()))
        if not common.OPTS.json:
            print(text, end="")
            return
        doc["toml"] = text  # under --json the file's text is a key of the one document
    out.document(doc)  # the same document with or without --json: kind and schema first


@app.command()
def validate(path: Annotated[str, typer.Argument(help="profile TOML file (or built-in name)")]) -> None:
    """Check a profile; every problem with its key path. Exit 2 when it is not valid."""
    out = common.output()
    try:
        p = common.contained(config.load(path, common.OPTS.overrides), common.host())
        from p2pkit.rules import engine_cmd

        refused = engine_cmd.refusals(p)
        if refused:
            raise ProfileError(p.source, refused, config.validate_command(p.source, p.overrides))
    except ProfileError as e:
        if common.OPTS.json:
            out.document({"valid": False, "source": e.source,
                          "problems": [{"key": k, "message": m} for k, m in e.problems]})
        else:
            for k, m in e.problems:
                out.err.print(f"{e.source}: {k}: {m}", style="red", markup=False)
            out.error(f"{len(e.problems)} problem(s) in {e.source}", e.hint)
        raise typer.Exit(int(Exit.USAGE)) from None
    if common.OPTS.json:
        out.document({"valid": True, "source": p.source, "name": p.name})
    else:
        out.line(f"{p.source}: valid ({p.name})")


@app.command()
def schema() -> None:
    """Print the profile's JSON Schema (for editors and CI linting of profile files)."""
    from p2pkit.schemas import profile_schema

    if common.OPTS.json:  # the one document --json promises: the schema is its key (as printed, a file to use)
        common.output().document({"profile_schema": profile_schema()})
        return
    sys.stdout.write(json.dumps(profile_schema(), indent=2) + "\n")
