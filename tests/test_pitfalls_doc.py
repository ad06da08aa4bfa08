"""docs/pitfalls.md is p2pkit/rules/pitfalls.py written out: the one table of pitfalls, never a second
hand-kept copy (regenerate with `python3 -m p2pkit.rules.pitfalls > docs/pitfalls.md`)."""

from p2pkit.rules import pitfalls
from tests.conftest import REPO


def test_the_doc_is_the_table_written_out():
    assert (REPO / "docs/pitfalls.md").read_text() == pitfalls.markdown()
    assert pitfalls.markdown().count("\n| P") == len(pitfalls.PITFALLS) == 39
