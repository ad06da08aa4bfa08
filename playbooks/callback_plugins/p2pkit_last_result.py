# Each host's last task result as JSON, one file per host, for `p2pkit up|status|verify --inventory`.
# What ansible-core's own `tree` callback does for the ad-hoc command, which ansible-core 2.19
# deprecates and 2.23 removes (lib/ansible/plugins/callback/tree.py); p2pkit's inventory playbook
# runs p2pkit as each host's last task, so the last result is that run (or why the host never got
# there: unreachable, failed, timed out). Loaded from beside the playbooks, enabled by p2pkit's
# inventory run in ANSIBLE_CALLBACKS_ENABLED (added to the operator's own).
from __future__ import annotations

import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: p2pkit_last_result
type: aggregate
short_description: each host's last task result as JSON, one file per host
description:
  - Writes the result of every task a host runs to DIRECTORY/HOSTNAME, replacing the one before, so
    the file holds the host's last result when the play ends. Nothing is written without a directory.
options:
  directory:
    description: the directory the per-host JSON files go to
    env:
      - name: P2PKIT_LAST_RESULT_DIR
    type: path
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "p2pkit_last_result"
    CALLBACK_NEEDS_ENABLED = True

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self.directory = self.get_option("directory")

    def _write(self, result) -> None:
        if not self.directory:
            return
        host = result._host.get_name()
        try:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, host)
            tmp = os.path.join(self.directory, f".{host}.{os.getpid()}.tmp")  # hidden: never read as a host
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(self._dump_results(result._result))
            os.replace(tmp, path)  # a reader never sees half a result
        except OSError as e:
            self._display.warning(f"p2pkit_last_result: cannot write {host}'s result to {self.directory}: {e}")

    def v2_runner_on_ok(self, result) -> None:
        self._write(result)

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._write(result)

    def v2_runner_on_unreachable(self, result) -> None:
        self._write(result)
