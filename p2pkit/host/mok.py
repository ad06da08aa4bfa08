"""Probes for Secure Boot signing: the machine owner key's files, what mokutil says of it, the
kernel's sign-file, and a module file's signature. Read-only: signing.py makes and queues the key."""

from __future__ import annotations

import os
from pathlib import Path

from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import Host
from p2pkit.parse import mok as pm

KEY_NAME, CERT_NAME = "p2pkit-mok.priv", "p2pkit-mok.der"
# One key per machine (its firmware enrols it once): under the default state directory whatever
# --state-dir names, so every state directory, the restore service and the kernel hook sign with it.
KEY_STATE_DIR = "/var/lib/p2pkit"
PASSWORD_ENV = "P2PKIT_MOK_PASSWORD"  # the one-time enrolment password, read only from the environment


def key_paths(profile, state_dir: str) -> tuple[str, str]:
    """The key and its certificate (host paths): p2p_module.signing_key and signing_cert, else
    /var/lib/p2pkit/mok/ (KEY_STATE_DIR); a key without a cert path has its cert beside it (KEY with
    .der for its suffix)."""
    m = profile.p2p_module
    key = m.signing_key or f"{state_dir.rstrip('/')}/mok/{KEY_NAME}"
    cert = m.signing_cert or (str(Path(key).with_suffix(".der")) if m.signing_key
                              else f"{state_dir.rstrip('/')}/mok/{CERT_NAME}")
    return key, cert


def sign_file(host: Host, kernel: str) -> str | None:
    """The kernel's sign-file (host path): the headers' scripts/sign-file, as Ubuntu's
    linux-headers-<kernel> ships it (under /usr/src, and /lib/modules/<kernel>/build links there)."""
    for p in (f"/lib/modules/{kernel}/build/scripts/sign-file", f"/usr/src/linux-headers-{kernel}/scripts/sign-file"):
        if host.path(p).is_file() and os.access(host.path(p), os.X_OK):
            return p
    return None


def cert_identity(host: Host, cert: str) -> dict:
    """The certificate's serial and CN (openssl); a file that is not a DER certificate is a ProbeError."""
    r = host.runner.run(["openssl", "x509", "-inform", "DER", "-in", str(host.path(cert)), "-noout", "-serial",
                         "-subject"], check=False)
    if r.returncode != 0:
        raise ProbeError(f"the signing certificate {cert}", "it is not an X.509 certificate in DER format "
                         f"(openssl: {(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']})")
    return pm.cert_identity(r.stdout)


def key_problem(host: Host, key: str, cert: str) -> str | None:
    """Why the key cannot sign with this certificate (not a private key, not the cert's key), or None."""
    r = host.runner.run(["openssl", "pkey", "-in", str(host.path(key)), "-pubout"], check=False)
    if r.returncode != 0:
        return f"{key} is not a private key openssl can read (a PEM key, as `openssl req -newkey` writes)"
    c = host.runner.run(["openssl", "x509", "-inform", "DER", "-in", str(host.path(cert)), "-noout", "-pubkey"],
                        check=False)
    if c.returncode != 0:
        return f"{cert} is not an X.509 certificate in DER format"
    if c.stdout.strip() != r.stdout.strip():
        return f"{key} is not the private key of {cert} (their public keys differ)"
    return None


def enrolment(host: Host, cert: str) -> str:
    """What `mokutil --test-key CERT` says: enrolled, queued, in-db or not-enrolled (parse.mok)."""
    try:
        r = host.runner.run(["mokutil", "--test-key", str(host.path(cert))], check=False)
    except P2pkitError as e:
        raise ProbeError("the key's enrolment", e.message) from None
    try:
        return pm.test_key(r.stdout + r.stderr)
    except ValueError as e:
        raise ProbeError("the key's enrolment", f"mokutil --test-key exited {r.returncode}: {e}") from None




def facts(host: Host, profile, state_dir: str) -> dict:
    """What preflight and the p2p-module checks read of the signing: only with Secure Boot on."""
    from p2pkit.host import system

    if system.secure_boot(host) != "on":
        return {"needed": False}
    key, cert = key_paths(profile, state_dir)
    kernel = system.kernel_release(host)
    out: dict = {"needed": True, "key": key, "cert": cert, "key_exists": host.path(key).is_file(),
                 "cert_exists": host.path(cert).is_file(), "sign_file": sign_file(host, kernel),
                 "mokutil": host.runner.which("mokutil") is not None,
                 "password_given": bool(os.environ.get(PASSWORD_ENV)), "kernel": kernel}
    if out["cert_exists"] and out["mokutil"]:
        try:
            out["cert_id"] = cert_identity(host, cert)
            out["enrolment"] = enrolment(host, cert)
        except ProbeError as e:
            out["cert_error"] = e.message
    # the running kernel's module as p2pkit reads that kernel (/proc/sys/kernel/osrelease), named to modinfo:
    # without -k it asks the uname() system call, which a container answers with the machine's kernel
    # (found on the container host: "signed by nobody" for a module the real sign-file had signed)
    r = host.runner.run(["modinfo", "-k", kernel, "-F", "sig_key", "nvidia"], check=False)
    out["module_sig_key"] = r.stdout.strip() if r.returncode == 0 else None
    r = host.runner.run(["modinfo", "-k", kernel, "-F", "signer", "nvidia"], check=False)
    out["module_signer"] = r.stdout.strip() if r.returncode == 0 else None
    return out
