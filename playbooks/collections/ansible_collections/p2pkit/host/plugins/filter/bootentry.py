"""Filter plugins: systemd-boot's kernel options written into its own files, as p2pkit reads them. Each is
a function of p2pkit.core.bootentry (plugins/module_utils/bootentry.py, a relative symlink to that very
file: what p2pkit reads a loader entry's options with), so the p2p-module role appends exactly what
p2pkit's checks then find on the entry's options line.

    p2pkit.host.entry_with_options(text, options)   a loader entry with each option it lacks appended to its
                                                    first `options` line (a new line where it has none); an
                                                    entry that has them all comes back unchanged
    p2pkit.host.kernel_install_cmdline(proc_cmdline)  the running command line's words kernel-install puts on
                                                    a new entry (without BOOT_IMAGE= and initrd=)
    p2pkit.host.kernel_cmdline_file(words, options)  /etc/kernel/cmdline's text: the words with each option
                                                    they lack appended, one line
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var
from ansible_collections.p2pkit.host.plugins.module_utils import bootentry


def _words(value, what: str) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise AnsibleFilterError(f"{what} must be a list of words, got {type(value).__name__}")
    return [str(v) for v in value]


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise AnsibleFilterError(f"{what} must be text, got {type(value).__name__}")
    return str(value)


def entry_with_options(text, options):
    return bootentry.entry_with_options(_text(text, "the loader entry"), _words(options, "the kernel options"))


def kernel_install_cmdline(proc_cmdline):
    return bootentry.kernel_install_cmdline(_text(proc_cmdline, "the kernel command line"))


def kernel_cmdline_file(words, options):
    return bootentry.kernel_cmdline_file(_words(words, "the command line's words"),
                                         _words(options, "the kernel options"))


def _host_text(f):
    """The result never templated again: it holds the host's own text (a loader entry's title)."""

    def run(*args, **kwargs):
        return wrap_var(f(*args, **kwargs))

    return run


class FilterModule:
    def filters(self):
        return {f.__name__: _host_text(f) for f in (entry_with_options, kernel_install_cmdline, kernel_cmdline_file)}
