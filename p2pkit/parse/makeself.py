"""The header of a makeself archive (NVIDIA's .run installer is one), read as text, never run.

makeself writes a shell stub in front of the payload (makeself-header.sh): plain assignments that
carry what the archive is and its checksums,

    CRCsum="..."    MD5="<md5 of each payload file, space-separated>"    SHA="<sha256 ...>" (2.4+)
    label="NVIDIA Accelerated Graphics Driver for Linux-x86_64 615.71.09"
    targetdir="NVIDIA-Linux-x86_64-615.71.09"    filesizes="<bytes of each payload file>"

and the stub finds its payload after its own first N lines: `head -n N "$0" | wc -c` (N written in
as a number when the archive was made). A sum of all zeros means that checksum was turned off
(--nomd5, --nosha256)."""

from __future__ import annotations

import re

FIELDS = ("CRCsum", "MD5", "SHA", "label", "targetdir", "filesizes")
ASSIGN = re.compile(r'^(?P<key>' + "|".join(FIELDS) + r')="(?P<value>[^"\n]*)"\s*$', re.M)
SKIP = re.compile(r'head -n (\d+) "?\$[01]"?')
VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)$")


def header(text: str) -> dict:
    """The header's fields (the first assignment of each), the number of header lines (`skip`), the
    driver version (the label's or the target directory's last dotted number) and the per-file
    checksums and sizes as lists; a field the header lacks is absent."""
    out: dict = {}
    for m in ASSIGN.finditer(text):
        out.setdefault(m["key"], m["value"])
    skip = SKIP.search(text)
    if skip:
        out["skip"] = int(skip.group(1))
    for key in ("label", "targetdir"):
        v = VERSION.search(out.get(key, ""))
        if v and "version" not in out:
            out["version"] = v.group(1)
    out["sizes"] = [int(x) for x in out.get("filesizes", "").split() if x.isdigit()]
    for key, n in (("MD5", 32), ("SHA", 64)):
        sums = out.get(key, "").split()
        if sums and all(re.fullmatch(f"[0-9a-f]{{{n}}}", s) for s in sums) and any(set(s) != {"0"} for s in sums):
            out[key.lower() + "s"] = sums
    return out
