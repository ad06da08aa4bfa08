"""Secure Boot signing for the p2p-module stage: the machine owner key (MOK), its enrolment, and
the values the role's sign.yml signs the built modules with.

Python, not tasks, for the key and the enrolment: both must be settled before the playbook builds
and installs anything (a bad key, a refusing mokutil or a missing sign-file stops the stage with
nothing changed), and the enrolment password must never reach a playbook's variables or its log. The key is the
machine's (its firmware enrols it once): /var/lib/p2pkit/mok/ whatever --state-dir says, or where
p2p_module.signing_key and signing_cert say.
The signing itself is tasks (sign.yml): it runs between the build and the follow-ups, on the files
the playbook made.

The password: mokutil --import asks twice for a one-time password the operator types again in
MokManager at the next boot. p2pkit takes it only from the environment (P2PKIT_MOK_PASSWORD, given
to mokutil on its stdin, never on a command line, in a file or a log); without it p2pkit stops
before anything changes and names both ways: set it, or run `sudo mokutil --import CERT` yourself
(p2pkit then sees the request queued and goes on). Not --hash-file: making that file needs
`mokutil --generate-hash=PASSWORD` (the password on a command line) or mokutil's crypt format
rewritten here; stdin is what mokutil's own get_password() reads (read_hidden_line: getline on
stdin, no terminal needed).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from p2pkit.core.errors import P2pkitError
from p2pkit.host import mok, system
from p2pkit.parse import mok as pm

MOKMANAGER = ("at the next boot the firmware shows MokManager (a blue screen) before Ubuntu: choose "
              "\"Enroll MOK\", \"Continue\", \"Yes\", type the one-time password given to mokutil (the value of "
              f"{mok.PASSWORD_ENV}), then \"Reboot\"; skip it and the signed module does not load "
              "(the key stays queued: `mokutil --list-new` shows it)")


def needed(ctx) -> bool:
    return system.secure_boot(ctx.host) == "on"


def prepare(ctx, kernel: str) -> dict:
    """With Secure Boot on: check the kernel's sign-file, make the key if there is none, check it,
    and queue its enrolment; the playbook's values for sign.yml. Each refusal comes before the
    playbook changes anything. With Secure Boot off: no signing (empty values)."""
    off = {"p2pkit_p2p_module_sign_key": "", "p2pkit_p2p_module_sign_cert": "",
           "p2pkit_p2p_module_sign_file": "", "p2pkit_p2p_module_sign_serial": ""}
    if not needed(ctx):
        return off
    host = ctx.host
    tool = mok.sign_file(host, kernel)
    if tool is None:
        raise P2pkitError(
            f"Secure Boot is on and the kernel's sign-file is missing for {kernel} (neither "
            f"/lib/modules/{kernel}/build/scripts/sign-file nor /usr/src/linux-headers-{kernel}/scripts/sign-file): "
            "p2pkit cannot sign the modules it builds, and Secure Boot refuses unsigned ones; nothing was changed",
            hint=f"install the kernel headers (sudo apt-get install linux-headers-{kernel}: they ship "
                 "scripts/sign-file), then run `p2pkit up` again")
    if host.runner.which("mokutil") is None:
        raise P2pkitError("Secure Boot is on and mokutil is not installed: p2pkit cannot queue its signing key's "
                          "enrolment; nothing was changed",
                          hint="sudo apt-get install mokutil, then run `p2pkit up` again")
    key, cert = mok.key_paths(ctx.profile, mok.KEY_STATE_DIR)
    made = False
    if not host.path(key).is_file() and not host.path(cert).is_file():
        make_key(ctx, key, cert)
        made = True
    elif not host.path(key).is_file() or not host.path(cert).is_file():
        missing, there = (key, cert) if not host.path(key).is_file() else (cert, key)
        raise P2pkitError(f"the signing key's pair is half there: {there} exists, {missing} does not; nothing "
                          "was changed",
                          hint=f"put {missing} back, or move {there} away so p2pkit makes a new pair (a new key "
                               "needs its own enrolment at the next boot)")
    problem = mok.key_problem(host, key, cert)
    if problem:
        raise P2pkitError(f"the module signing key cannot be used: {problem}; nothing was changed",
                          hint="set p2p_module.signing_key to a PEM private key and p2p_module.signing_cert to its "
                               "DER certificate, or leave both empty and p2pkit makes a pair under "
                               "/var/lib/p2pkit/mok/")
    identity = mok.cert_identity(host, cert)
    queue_enrolment(ctx, cert)
    ctx.out.step("p2p-module", f"Secure Boot: signing with {key} ({'made now, ' if made else ''}serial "
                 f"{identity['serial']}, {identity['cn']})")
    return {"p2pkit_p2p_module_sign_key": key, "p2pkit_p2p_module_sign_cert": cert,
            "p2pkit_p2p_module_sign_file": tool, "p2pkit_p2p_module_sign_serial": identity["serial"]}


def make_key(ctx, key: str, cert: str) -> None:
    """openssl req: a 2048-bit RSA key (0600) and its self-signed DER certificate for 100 years, CN
    naming p2pkit and the host; made in a temporary directory beside them and moved in cert last (a
    kill leaves no pair half made: a key alone is refused, not used)."""
    host = ctx.host
    hostname = system.identity(host)["hostname"]
    final_key, final_cert = host.path(key), host.path(cert)
    final_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    final_cert.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mok-", dir=final_key.parent))
    try:
        r = host.runner.run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "36500",
                             "-outform", "DER", "-keyout", str(tmp / "key"), "-out", str(tmp / "cert"),
                             "-subj", f"/CN=p2pkit module signing key for {hostname}/"], check=False)
        if r.returncode != 0:
            raise P2pkitError(f"openssl could not make the module signing key: {r.stderr.strip()[-300:]}",
                              hint="check that openssl works (openssl version), then run `p2pkit up` again")
        os.chmod(tmp / "key", 0o600)
        os.replace(tmp / "key", final_key)
        os.replace(tmp / "cert", final_cert)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def queue_enrolment(ctx, cert: str) -> str:
    """mokutil --import CERT unless the key is enrolled or queued; the password from the environment."""
    host = ctx.host
    state = mok.enrolment(host, cert)
    if state in (pm.ENROLLED, pm.IN_DB):
        return state
    if state == pm.QUEUED:
        ctx.out.warn(f"Secure Boot: the signing key {cert} is queued for enrolment: {MOKMANAGER}")
        return state
    password = os.environ.get(mok.PASSWORD_ENV, "")
    if not password:
        raise P2pkitError(
            f"Secure Boot is on and the module signing key {cert} is not enrolled: its enrolment needs a one-time "
            "password you type again in MokManager at the next boot, and p2pkit was given none; nothing was changed",
            hint=f"either run `sudo mokutil --import {cert}` yourself (it asks for the password), or give it to p2pkit "
                 f"as {mok.PASSWORD_ENV}=... in the environment of `sudo p2pkit up` (it goes to mokutil's stdin, "
                 "nowhere else); then run `p2pkit up` again")
    r = host.runner.run(["mokutil", "--import", str(host.path(cert))], check=False,
                        input_text=f"{password}\n{password}\n")
    if r.returncode != 0:
        raise P2pkitError(f"mokutil refused to queue the signing key {cert} (exit {r.returncode}: "
                          f"{(r.stderr or r.stdout).strip()[-300:]}); the modules were not built or installed",
                          hint=f"run `sudo mokutil --import {cert}` by hand to see why (a full EFI variable store, "
                               "a firmware without shim), then run `p2pkit up` again")
    ctx.out.warn(f"Secure Boot: the signing key {cert} is queued for enrolment: {MOKMANAGER}")
    return pm.QUEUED
