"""Secure Boot signing for the p2p-module stage: what p2pkit proves and decides before the role runs,
and what it says after. The machine owner key (MOK) is made, its enrolment queued and the built
modules signed by the role (tasks/mok.yml, tasks/sign.yml), from the values prepare() hands it: the
key's and certificate's paths, the kernel's sign-file, the subject of a key it makes, and whether it
queues the enrolment.

Decided here, before the playbook changes anything, because each needs facts read first and each
refusal must leave the host as it was: the kernel's sign-file and mokutil are there, a key pair is
whole and its key is the certificate's, and whether the key needs queuing (mokutil --test-key) with
the password it then needs. The key is the machine's (its firmware enrols it once):
/var/lib/p2pkit/mok/ whatever --state-dir says, or where p2p_module.signing_key and signing_cert say.

The password: mokutil --import asks twice for a one-time password the operator types again in
MokManager at the next boot. p2pkit takes it only from the environment (P2PKIT_MOK_PASSWORD); it
reaches the role's one task that reads it (an env lookup given to mokutil's stdin, no_log) through
ansible-playbook's environment, never a variable, a command line, a file or a log; the stage's
playbook blanks it in every task's own environment. Without it p2pkit stops before anything changes
and names both ways: set it, or run `sudo mokutil --import CERT` yourself (p2pkit then sees the
request queued and goes on). Not --hash-file: making that file needs `mokutil --generate-hash=PASSWORD`
(the password on a command line) or mokutil's crypt format rewritten here; stdin is what mokutil's own
get_password() reads (read_hidden_line: getline on stdin, no terminal needed).
"""

from __future__ import annotations

import os
from typing import NamedTuple

from p2pkit.core.ansible import PlaybookFailed
from p2pkit.core.errors import P2pkitError, ProbeError
from p2pkit.host import mok, system
from p2pkit.parse import mok as pm

MOKMANAGER = ("at the next boot the firmware shows MokManager (a blue screen) before the OS starts: choose "
              "\"Enroll MOK\", \"Continue\", \"Yes\", type the one-time password given to mokutil (the value of "
              f"{mok.PASSWORD_ENV}), then \"Reboot\"; skip it and the signed module does not load "
              "(the key stays queued: `mokutil --list-new` shows it)")


def needed(ctx) -> bool:
    return system.secure_boot(ctx.host) == "on"


class Signing(NamedTuple):
    """What prepare() settled: the role's values, whether the role makes the key, and the password
    ansible-playbook gets in its environment (only when the role queues the enrolment)."""
    values: dict
    made: bool = False
    secret_env: dict | None = None


MOKUTIL_REFUSED = "Stop where mokutil refused to queue the key"  # the role's task (tasks/mok.yml)
OPENSSL_FAILED = "Make the machine owner key"


def prepare(ctx, kernel: str) -> Signing:
    """With Secure Boot on: check the kernel's sign-file, mokutil, the key pair when there is one, and
    whether its enrolment must be queued (and the password for it); the role's values for mok.yml and
    sign.yml. Each refusal comes before the playbook changes anything. With Secure Boot off: no signing."""
    if not needed(ctx):
        return Signing({"p2pkit_p2p_module_secure_boot": False})
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
    make = not host.path(key).is_file() and not host.path(cert).is_file()
    if not make:
        check_pair(host, key, cert)
    state = pm.NOT_ENROLLED if make else mok.enrolment(host, cert)
    enrol = state not in (pm.ENROLLED, pm.IN_DB, pm.QUEUED)
    password = os.environ.get(mok.PASSWORD_ENV, "")
    if enrol and not password:
        raise P2pkitError(
            f"Secure Boot is on and the module signing key {cert} is not enrolled: its enrolment needs a one-time "
            "password you type again in MokManager at the next boot, and p2pkit was given none; nothing was changed",
            hint=f"either run `sudo mokutil --import {cert}` yourself (it asks for the password), or give it to p2pkit "
                 f"as {mok.PASSWORD_ENV}=... in the environment of `sudo p2pkit up` (it goes to mokutil's stdin, "
                 "nowhere else); then run `p2pkit up` again")
    if state == pm.QUEUED:
        ctx.out.warn(f"Secure Boot: the signing key {cert} is queued for enrolment: {MOKMANAGER}")
    hostname = system.identity(host)["hostname"]
    values = {"p2pkit_p2p_module_secure_boot": True, "p2pkit_p2p_module_sign_key": key,
              "p2pkit_p2p_module_sign_cert": cert, "p2pkit_p2p_module_sign_file": tool,
              # openssl req's subject: a 2048-bit RSA key and its DER certificate for 100 years (tasks/mok.yml)
              "p2pkit_p2p_module_sign_subject": f"/CN=p2pkit module signing key for {hostname}/",
              "p2pkit_p2p_module_mok_enrol": enrol}
    return Signing(values, made=make, secret_env={mok.PASSWORD_ENV: password} if enrol else None)


def check_pair(host, key: str, cert: str) -> None:
    """A key pair p2pkit did not make now: both files there, the key the certificate's."""
    if not host.path(key).is_file() or not host.path(cert).is_file():
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


def said(ctx, s: Signing) -> None:
    """After the role ran (or stopped): the key it signs with, and the enrolment it queued."""
    v = s.values
    if not v.get("p2pkit_p2p_module_secure_boot") or not ctx.host.path(v["p2pkit_p2p_module_sign_cert"]).is_file():
        return
    key, cert = v["p2pkit_p2p_module_sign_key"], v["p2pkit_p2p_module_sign_cert"]
    try:
        identity = mok.cert_identity(ctx.host, cert)
        queued = v["p2pkit_p2p_module_mok_enrol"] and mok.enrolment(ctx.host, cert) == pm.QUEUED
    except ProbeError:
        return  # the stage's checks read the certificate again and say what is wrong with it
    ctx.out.step("p2p-module", f"Secure Boot: signing with {key} ({'made now, ' if s.made else ''}serial "
                 f"{identity['serial']}, {identity['cn']})")
    if queued:
        ctx.out.warn(f"Secure Boot: the signing key {cert} is queued for enrolment: {MOKMANAGER}")


def refusal(e: P2pkitError, s: Signing) -> P2pkitError | None:
    """The role's refusals of the key and its enrolment, said as p2pkit said them (its message and hint)."""
    if not isinstance(e, PlaybookFailed):
        return None
    cert = s.values.get("p2pkit_p2p_module_sign_cert", "")
    if e.task.endswith(MOKUTIL_REFUSED):
        return P2pkitError(str(e.result.get("msg", e.message)),
                           hint=f"run `sudo mokutil --import {cert}` by hand to see why (a full EFI variable store, "
                                "a firmware without shim), then run `p2pkit up` again")
    if e.task.endswith(OPENSSL_FAILED):
        out = str(e.result.get("stderr") or e.result.get("msg") or "")
        return P2pkitError(f"openssl could not make the module signing key: {out.strip()[-300:]}",
                           hint="check that openssl works (openssl version), then run `p2pkit up` again")
    return None
