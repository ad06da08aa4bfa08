"""Results to stdout (a table, or JSON with --json); logs, progress, warnings and hints to stderr.

A simulated run says SIMULATED on every line it prints.

The JSON contract (docs/json.md): every document on stdout carries `kind` (what it is: the
command that printed it, "p2pkit-status", "p2pkit-sim-init", or a kind of its own such as
"p2pkit-doctor") and `schema` (SCHEMA_VERSION). A JSON Schema for each kind ships in
p2pkit/schemas/. An error under --json is a "p2pkit-error" document on stdout too.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from p2pkit.core.secrets import redact, redact_doc

SCHEMA_VERSION = 1


def command_kind() -> str:
    """The kind of the running command's document: its command path, "p2pkit-sim-init" (the CLI
    records the path it was asked for before it runs the command)."""
    return "-".join(["p2pkit", *COMMAND])


COMMAND: list[str] = []  # set by the CLI: ["sim", "init"]


def stamp(doc: dict[str, Any], kind: str | None = None) -> dict[str, Any]:
    """The document with its kind and schema version first (a kind it names itself is kept)."""
    rest = {k: v for k, v in doc.items() if k not in ("kind", "schema")}
    return {"kind": doc.get("kind") or kind or command_kind(), "schema": SCHEMA_VERSION, **rest}


STATUS_STYLE = {
    "pass": "green",
    "passed": "green",
    "done": "green",
    "ok": "green",
    "warn": "yellow",
    "skip": "dim",
    "not run": "dim",
    "fail": "red",
    "failed": "red",
    "stale": "yellow",
    "could not check": "yellow",
    "blocked": "magenta",
    "reboot-needed": "cyan",
    "running": "cyan",
    "could-not-run": "red",
    "unknown": "yellow",
}


HEARTBEAT_S = 30.0  # without a terminal (a CI log, journald), a long step says it is alive this often


# a p2pkit command in a message, as p2pkit prints one: between backticks, perhaps after sudo
HINT = re.compile(r"`(sudo )?p2pkit( [^`]*)`")
ROOT_SUDO = re.compile(r"`sudo (?=[^`\s-])")  # `sudo CMD ...` in a message: the command, for a user who is root


def on_host(text: str, host_args: list[str], drop_sudo: bool) -> str:
    """`text` with every p2pkit command it names (`p2pkit ...`, `sudo p2pkit ...`) made to act on the host the
    message is about: the host's options (`--root R`, `--state-dir S`) put after `p2pkit` where the command
    does not give them itself, and no `sudo` for root (on a host that is a directory, whose operator owns it
    and where sudo's own PATH would not find this p2pkit, and on a real host, which may have no sudo). The one
    place that does it, for every message, table and document p2pkit prints: no caller adds them. `p2pkit
    sim ...` names its host by its own argument and is left alone, as is a command that names another host's
    --root."""
    if not host_args and not drop_sudo:
        return text
    if drop_sudo:  # root needs no sudo for any command it is told to run, and a box may have none (issue 47 item 13)
        text = ROOT_SUDO.sub("`", text)
    given = dict(zip(host_args[::2], host_args[1::2]))

    def fix(m: re.Match) -> str:
        sudo, rest = m.group(1) or "", m.group(2)
        try:
            words = shlex.split(rest)
        except ValueError:  # not a command line (an unbalanced quote): leave it as it is
            return m.group(0)
        named = {w.split("=", 1)[0]: (w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else ""))
                 for i, w in enumerate(words) if w.split("=", 1)[0] in ("--root", "--state-dir")}
        if words[:1] == ["sim"] or ("--root" in named and named["--root"] != given.get("--root", "/")):
            return m.group(0)
        add = [w for opt, v in given.items() if opt not in named for w in (opt, v)]
        if not add and not (drop_sudo and sudo):
            return m.group(0)
        return f"`{'' if drop_sudo else sudo}p2pkit{' ' + shlex.join(add) if add else ''}{rest}`"
    return HINT.sub(fix, text)


def follow_cmd(stage: str) -> str:
    """The command that shows a stage's log as it grows."""
    return f"p2pkit logs {stage} --follow"


def elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else (
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{seconds:.1f}s")


def escape(text: str) -> str:
    """rich's markup escaped (rich imported at the first line printed through it)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


class LazyConsole:
    """A rich Console made at its first use: a run that prints only its JSON document (`doctor --json`)
    never imports rich (a tenth of a second of start-up, issue 38)."""

    def __init__(self, **kw):
        self._kw, self._console = kw, None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kw)
        return getattr(self._console, name)


@dataclass
class Output:
    json_mode: bool = False
    simulated: bool = False
    # the options that name the host this output is about (`--root R`, `--state-dir S`): every p2pkit command
    # printed gets them (on_host); drop_sudo for a host that is a directory
    host_args: list[str] = field(default_factory=list)
    drop_sudo: bool = False
    err: Any = field(default_factory=lambda: LazyConsole(stderr=True, highlight=False, soft_wrap=True))
    out: Any = field(default_factory=lambda: LazyConsole(highlight=False, soft_wrap=True))

    @property
    def tag(self) -> str:
        return "SIMULATED " if self.simulated else ""

    def here(self, text: str) -> str:
        """The text with every p2pkit command in it made to act on this output's host (on_host)."""
        return on_host(text, self.host_args, self.drop_sudo)

    def log(self, msg: str, style: str | None = None) -> None:
        self.err.print(f"{self.tag}{escape(redact(self.here(msg)))}", style=style)

    def step(self, stage: str, msg: str) -> None:
        self.log(f"[{stage}] {msg}")

    def warn(self, msg: str) -> None:
        self.err.print(f"{self.tag}warning: {escape(redact(self.here(msg)))}", style="yellow")

    def error(self, msg: str, hint: str = "") -> None:
        text = f"{self.tag}error: {escape(redact(self.here(msg)))}"
        if hint:
            text += f"\n{self.tag}fix: {escape(redact(self.here(hint)))}"
        self.err.print(text, style="red")

    @contextmanager
    def working(self, what: str, log: str | None = None, follow: str | None = None):
        """A long step: a spinner with the elapsed time on a terminal; otherwise a line when it starts,
        one every HEARTBEAT_S while it runs, and one with its time when it ends. `log` names the
        file its output streams to, `follow` the command that shows it as it grows."""
        where = f" (output: {log}" + (f"; follow it with `{follow}`" if follow else "") + ")" if log else ""
        start = time.monotonic()
        done = threading.Event()
        if self.err.is_terminal and not self.json_mode:
            with self.err.status(f"{self.tag}{escape(what)}") as status:
                def tick() -> None:
                    while not done.wait(1):
                        status.update(f"{self.tag}{escape(what)} [dim]{elapsed(time.monotonic() - start)}[/]")
                t = threading.Thread(target=tick, daemon=True)
                t.start()
                try:
                    yield
                finally:
                    done.set()
                    t.join()
            self.log(f"{what}: {elapsed(time.monotonic() - start)}{where}")
            return
        self.log(what + where)

        def beat() -> None:
            while not done.wait(HEARTBEAT_S):
                self.log(f"{what}: still running, {elapsed(time.monotonic() - start)}")
        t = threading.Thread(target=beat, daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()
            if time.monotonic() - start >= 5:
                self.log(f"{what}: {elapsed(time.monotonic() - start)}")

    def document(self, doc: dict[str, Any]) -> None:
        """The machine-readable result: only this goes to stdout under --json."""
        doc = stamp(doc)
        if self.simulated:
            doc = {**doc, "simulated": True}
        doc = redact_doc(self._here_doc(json.loads(json.dumps(doc, default=str))))
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    def _here_doc(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.here(value)
        if isinstance(value, list):
            return [self._here_doc(v) for v in value]
        if isinstance(value, dict):
            return {k: self._here_doc(v) for k, v in value.items()}
        return value

    def error_document(self, code: int, message: str, hint: str = "") -> None:
        """Under --json, an error is a document on stdout as well as the message on stderr."""
        if self.json_mode:
            self.document({"kind": "p2pkit-error", "exit_code": int(code), "message": message, "fix": hint})

    def table(self, title: str, columns: list[str], rows: list[list[Any]], status_col: int | None = None) -> None:
        """A rich table on a terminal; piped (a CI log, `| grep`), the plain layout: never wrapped or
        cut at the console's width, so an id, a host name or a value stays whole on its line."""
        if not self.out.is_terminal:
            text = plain_table(f"{self.tag}{title}".strip(), columns,
                               [[redact(self.here("" if v is None else str(v))) for v in row] for row in rows])
            self.out.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
            return
        from rich.table import Table

        t = Table(title=f"{self.tag}{title}".strip(), title_justify="left", show_lines=False)
        for c in columns:
            t.add_column(c, overflow="fold")
        for row in rows:
            cells = []
            for i, v in enumerate(row):
                s = escape(redact(self.here("" if v is None else str(v))))
                if i == status_col:
                    style = STATUS_STYLE.get(str(v).split(" ")[0], "")
                    s = f"[{style}]{s}[/]" if style else s
                cells.append(s)
            t.add_row(*cells)
        self.out.print(t)

    def line(self, msg: str, style: str | None = None) -> None:
        self.out.print(f"{self.tag}{escape(redact(self.here(msg)))}", style=style)


def plain_table(title: str, columns: list[str], rows: list[list[str]]) -> str:
    """A table as plain text: the title, the header, a rule, one line per row; each column as wide as
    its widest cell, two spaces between columns; nothing wrapped or cut (a newline in a cell
    becomes a space)."""
    cells = [[" ".join(str(c).split("\n")) for c in r] for r in [columns, *rows]]
    widths = [max(len(r[i]) if i < len(r) else 0 for r in cells) for i in range(len(columns))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([title, line(cells[0]), line(["-" * w for w in widths]), *map(line, cells[1:])])
