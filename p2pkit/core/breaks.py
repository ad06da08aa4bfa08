"""One definition of a break: the characters no value p2pkit writes may hold, and how p2pkit's own
readers split a file into lines.

A character is refused when any reader of a file p2pkit writes (systemd, a shell, the engine, Python's
str.splitlines(), a terminal, an editor) could take it as a line or word break, or when it changes how the
text around it reads without being seen:

- C0 controls U+0000-001F (newline, carriage return, tab, vertical tab U+000B, form feed U+000C, the
  file/group/record separators U+001C-001E that str.splitlines() breaks on) and DEL U+007F;
- C1 controls U+0080-009F, NEXT LINE U+0085 among them (a line break to str.splitlines() and Unicode);
- LINE SEPARATOR U+2028 and PARAGRAPH SEPARATOR U+2029 (line breaks to str.splitlines(), JavaScript, editors);
- every space but U+0020: NO-BREAK SPACE U+00A0, OGHAM SPACE MARK U+1680, U+2000-200A, U+202F, U+205F,
  IDEOGRAPHIC SPACE U+3000 (word breaks to str.split() and to whitespace-splitting readers);
- invisible format characters (Unicode category Cf): the bidi marks, embeddings, overrides and isolates
  (U+061C, U+200E-200F, U+202A-202E, U+2066-2069: "Trojan Source", CVE-2021-42574), the zero-width
  characters (U+200B-200D, WORD JOINER U+2060, BOM U+FEFF), SOFT HYPHEN U+00AD, MONGOLIAN VOWEL
  SEPARATOR U+180E, the invisible operators U+2061-2064, the tag characters U+E0001, U+E0020-E007F and the
  rest of Cf;
- lone surrogates U+D800-DFFF: what a byte that is not UTF-8 turns into in an argument (surrogateescape),
  which no UTF-8 file can hold.

BREAKS is that table (written out in p2pkit.core.unitenv, so that importing it costs nothing);
tests/test_line_breaks.py proves it holds every character of those Unicode categories (Cc, Cf, Zl, Zp, Zs
but U+0020, Cs) in this Python's Unicode database. p2pkit's own readers split a file only on \\n (`lines`):
a break any other reader would see is refused before it is ever written, so a file p2pkit wrote reads the
same to everyone; one it did not write is never split where systemd would not split it.
"""

from __future__ import annotations

import re

from p2pkit.core import unitenv

# the table and the naming of a character live in p2pkit.core.unitenv (stdlib only: the p2pkit.host collection's
# filter plugins use that very file); read here by their names
BREAKS = unitenv.BREAKS
name = unitenv.name


def first(value: str) -> re.Match | None:
    """The first character of `value` that BREAKS holds, or None."""
    return BREAKS.search(value)


def lines(text: str) -> list[str]:
    """A file's lines, split only on \\n (as systemd, glibc and the kernel read a line): never on the
    other breaks str.splitlines() knows (U+2028, U+0085, \\x0b, \\x0c, \\x1c-\\x1e, a lone \\r). A final
    newline ends the last line; it does not start an empty one."""
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return out
