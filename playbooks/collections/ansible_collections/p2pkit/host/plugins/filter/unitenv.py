"""Filter plugins: what Jinja alone cannot write into the engine's unit and environment files. Each is a
writer of p2pkit.core.unitenv (plugins/module_utils/unitenv.py, a relative symlink to that very file: the
one writer per format p2pkit itself writes with), so the role escapes and refuses exactly what p2pkit
does. A value a file cannot hold (a newline in a flag, a name that is no environment variable name) fails
the task that renders it, with p2pkit's message and the fix, before anything is written.

    p2pkit.host.unit_exec(argv, what)     a command line for ExecStart= (each word quoted when it needs it)
    p2pkit.host.unit_value(value, what)   a one-line setting (Description=): `%` escaped
    p2pkit.host.unit_path(value, what)    an absolute path setting (WorkingDirectory=, EnvironmentFile=)
    p2pkit.host.unit_user(value, what)    a user or group name for User=, Group= and SupplementaryGroups=
                                          (nothing else: no `%`, no newline)
    p2pkit.host.unit_name(value, what)    the service's unit name: one file under /etc/systemd/system
    p2pkit.host.env_file(env, header, what)  a whole environment file from a mapping: NAME="value" lines
    p2pkit.host.flag_words(flags)         an engine's flags (a mapping) as command-line words: true gives a
                                          bare --name, false or null leaves it out, else --name value
    p2pkit.host.ip_filter(host, role, cidr)  the unit's [IPAddressDeny, IPAddressAllow] (["", ""]: none)
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var
from ansible_collections.p2pkit.host.plugins.module_utils import unitenv


def _refusing(write):
    """The writer's result never templated again (it holds the user's text); its refusal as Ansible's
    filter error: p2pkit's message, then the fix."""

    def run(*args, **kwargs):
        try:
            return wrap_var(write(*args, **kwargs))
        except unitenv.Refused as e:
            raise AnsibleFilterError(f"{e.message} ({e.hint})" if e.hint else e.message) from None

    return run


def unit_exec(argv, what="the command line"):
    if isinstance(argv, str | bytes) or not isinstance(argv, list | tuple):
        raise AnsibleFilterError(f"{what} must be a list of words, got {type(argv).__name__}")
    return unitenv.unit_exec([str(a) for a in argv], what)


def unit_value(value, what="the value"):
    return unitenv.unit_value(what, value)


def unit_path(value, what="the path"):
    return unitenv.unit_path(what, value)


def unit_user(value, what="the user name"):
    return unitenv.unit_user(what, value)


def unit_name(value, what="the unit name"):
    return unitenv.unit_name(what, value)


def env_file(env, header="", what=""):
    if not hasattr(env, "items"):
        raise AnsibleFilterError(f"{what or 'the environment'} must be a mapping of names to values")
    return unitenv.env_file(dict(env.items()), header, what)


def flag_words(flags):
    if not hasattr(flags, "items"):
        raise AnsibleFilterError("the flags must be a mapping of names to values")
    return unitenv.words(dict(flags.items()))


def ip_filter(listen_host, node_role="single", fabric_cidr=""):
    return list(unitenv.ip_filter(str(listen_host), str(node_role), str(fabric_cidr or "")))


class FilterModule:
    def filters(self):
        writers = (unit_exec, unit_value, unit_path, unit_user, unit_name, env_file, flag_words, ip_filter)
        return {f.__name__: _refusing(f) for f in writers}
