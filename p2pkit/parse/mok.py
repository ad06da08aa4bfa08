"""Machine owner keys (MOK) and module signatures, as pure text: what mokutil, openssl and modinfo print.

Formats:
- `mokutil --test-key CERT` (lcp/mokutil src/mokutil.c, test_key() and print_skip_message()):
  "CERT is not enrolled" (exit 1), "CERT is already enrolled" (in MokListRT), "CERT is already in
  the enrollment request" (in MokNew, enrolled at the next boot in MokManager), "CERT is already in db".
- `openssl x509 -inform DER -noout -serial -subject`: "serial=113C23...C9" and "subject=CN = NAME".
- `modinfo -F sig_key FILE` (kmod, libkmod-signature.c): the signing certificate's serial number as
  colon-separated hex bytes ("11:3C:23:..."), the DER integer's bytes (a leading 00 when its top bit is
  set, which openssl's serial= leaves out); `modinfo -F signer`: the issuer's CN. Empty when unsigned.
"""

from __future__ import annotations

ENROLLED, QUEUED, NOT_ENROLLED, IN_DB = "enrolled", "queued", "not-enrolled", "in-db"


def test_key(text: str) -> str:
    """What `mokutil --test-key CERT` says of the key: enrolled, queued (MokManager enrols it at the
    next boot), in the firmware's db, or not enrolled."""
    for needle, state in (("is already enrolled", ENROLLED), ("is already in the enrollment request", QUEUED),
                          ("is already in db", IN_DB), ("is not enrolled", NOT_ENROLLED)):
        if needle in text:
            return state
    raise ValueError(f"mokutil --test-key printed neither 'is already enrolled' nor 'is not enrolled': "
                     f"{text.strip()[:200]!r}")




def cert_identity(text: str) -> dict:
    """`openssl x509 -noout -serial -subject`: the serial (normalised, see serial_key) and the subject's CN."""
    out: dict = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "serial":
            out["serial"] = serial_key(value)
        elif key.strip() == "subject":
            cn = [p.split("=", 1)[1].strip() for p in value.split(",") if p.strip().startswith("CN")]
            out["cn"] = cn[0] if cn else value.strip()
    if not out.get("serial"):
        raise ValueError(f"openssl printed no serial= line: {text.strip()[:200]!r}")
    return out


def serial_key(value: str) -> str:
    """A serial number as one comparable string: hex digits, upper case, no colons, no leading zeros
    (openssl's serial= and modinfo's sig_key print the same number two ways)."""
    digits = value.strip().replace(":", "").upper()
    return digits.lstrip("0") or ("0" if digits else "")


def signed_by(sig_key: str, cert: dict) -> bool:
    """Whether a module's sig_key (modinfo -F sig_key) is this certificate's serial."""
    return bool(sig_key.strip()) and serial_key(sig_key) == cert["serial"]
