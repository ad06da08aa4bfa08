# One cache of built modules for all the stage playbooks of a p2pkit state directory.
#
# Before it runs a module, Ansible builds its payload (the module and every module_utils file it
# imports, found by parsing them, zipped): about 0.2 CPU-s for p2pkit_files, get_url or
# systemd_service. It keeps what it built in <local tmp>/ansiballz_cache, but the local tmp is a new
# directory per ansible-playbook process, so each of p2pkit's four stage playbooks built the same
# modules again (p2pkit_files four times in one `up`). This callback, enabled by p2pkit's stage runs
# only, points that directory at DIR, which p2pkit names by what the payloads are built from (the
# Ansible and Python versions and the roles' own modules), so a cached payload is never one of
# another version. Ansible's own lock files keep concurrent writers apart. Without DIR, or where
# Ansible keeps its cache elsewhere, it does nothing: the playbooks run as they would without it.
from __future__ import annotations

import os

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: p2pkit_module_cache
type: aggregate
short_description: share Ansible's built-module cache between ansible-playbook runs
description:
  - Makes <local tmp>/ansiballz_cache a link to DIR, which the caller names by what the payloads are
    built from. Does nothing without DIR.
options:
  dir:
    description: the shared cache directory (made when missing)
    env:
      - name: P2PKIT_MODULE_CACHE
    type: path
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "p2pkit_module_cache"
    CALLBACK_NEEDS_ENABLED = True

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        shared = self.get_option("dir")
        local = getattr(C, "DEFAULT_LOCAL_TMP", None)
        if not shared or not local or not os.path.isdir(local):
            return
        link = os.path.join(local, "ansiballz_cache")
        try:
            os.makedirs(shared, mode=0o700, exist_ok=True)
            if not os.path.lexists(link):
                os.symlink(shared, link)
        except OSError as e:
            self._display.warning(f"p2pkit_module_cache: modules are built afresh ({e})")
