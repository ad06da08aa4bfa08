# Each task's own result, as Ansible decided it, for p2pkit's stage artifacts: per task name (role
# prefix dropped), how many times it was ok, changed, failed or skipped (a loop counts each item).
# p2pkit no longer predicts a role's work: it reads back what the role's tasks did. A role's report
# comes back the same way: a fact named p2pkit_<...>_report that a task sets (set_fact) is kept under
# that task's entry, "report": {fact name: value} (the p2p-module role's live reload says what it did
# and why). Loaded from beside the playbooks; p2pkit's stage runs enable it in ANSIBLE_CALLBACKS_ENABLED.
from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: p2pkit_tasks
type: aggregate
short_description: per task, how many times it was ok, changed, failed or skipped, as one JSON file
description:
  - Counts every task result (each loop item counts) by task name, in the order the tasks ran, and
    writes them when the playbook ends (also when it stops at a failure) to FILE, atomically.
    Nothing is written without a file.
  - A fact named p2pkit_*_report that a task sets is kept under that task's "report".
options:
  file:
    description: the JSON file the counts go to
    env:
      - name: P2PKIT_TASK_RESULTS
    type: path
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "p2pkit_tasks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tasks: dict[str, dict] = {}

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self.file = self.get_option("file")

    def _count(self, result, outcome: str) -> None:
        if isinstance(result._result.get("results"), list):
            return  # a loop's summary: its items were counted one by one
        name = result._task.get_name()
        counts = self.tasks.setdefault(name.split(" : ", 1)[-1], {"ok": 0, "changed": 0, "failed": 0,
                                                                   "skipped": 0})
        counts[outcome] += 1
        if outcome == "ok" and result._result.get("changed"):
            counts["changed"] += 1
        facts = result._result.get("ansible_facts") if outcome == "ok" else None
        for name, value in (facts or {}).items():
            if name.startswith("p2pkit_") and name.endswith("_report"):
                counts.setdefault("report", {})[name] = value

    def v2_runner_on_ok(self, result) -> None:
        self._count(result, "ok")

    def v2_runner_item_on_ok(self, result) -> None:
        self._count(result, "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False) -> None:
        self._count(result, "failed")

    def v2_runner_item_on_failed(self, result) -> None:
        self._count(result, "failed")

    def v2_runner_on_skipped(self, result) -> None:
        self._count(result, "skipped")

    def v2_runner_item_on_skipped(self, result) -> None:
        self._count(result, "skipped")

    def v2_runner_on_unreachable(self, result) -> None:
        self._count(result, "failed")

    def v2_playbook_on_stats(self, stats) -> None:
        if not self.file:
            return
        tmp = f"{self.file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.tasks, fh, indent=1)
            os.replace(tmp, self.file)
        except OSError as e:
            self._display.warning(f"p2pkit_tasks: cannot write the task results to {self.file}: {e}")
