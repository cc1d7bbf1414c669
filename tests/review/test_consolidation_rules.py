"""review.consolidation on plain lists: the vote, ties and their escalation, no consensus,
free text and the agreement, with no database; and the module loads no Django."""

from __future__ import annotations

import subprocess
import sys

import pytest

from review.consolidation import MAX_ESCALATIONS, NO_CONSENSUS, Outcome, consolidate, vote


def never_asked() -> bool:
    raise AssertionError("someone_left was asked without a tie that could escalate")


def test_vote_counts_and_names_the_winner():
    votes, winner, tie = vote(["cat", "dog", "cat"])
    assert (dict(votes), winner, tie) == ({"cat": 2, "dog": 1}, "cat", False)


def test_vote_sees_a_tie_between_the_top_two_only():
    assert vote(["cat", "dog"])[2] is True
    assert vote(["cat", "cat", "dog", "bird"])[2] is False
    assert vote([]) == (vote([])[0], None, False)


def test_a_majority_completes_with_its_agreement():
    outcome = consolidate(["cat", "dog", "cat"], free_text=False, escalations=0, someone_left=never_asked)
    assert outcome == Outcome(escalate=False, label="cat", agreement=pytest.approx(2 / 3))


def test_a_tie_escalates_while_someone_is_left_and_escalations_remain():
    assert consolidate(["cat", "dog"], free_text=False, escalations=0, someone_left=lambda: True).escalate
    assert consolidate(["cat", "dog", "bird"], free_text=False, escalations=MAX_ESCALATIONS - 1,
                       someone_left=lambda: True).escalate


def test_a_tie_with_no_one_left_or_no_escalation_left_is_no_consensus():
    nobody = consolidate(["cat", "dog"], free_text=False, escalations=0, someone_left=lambda: False)
    assert nobody == Outcome(escalate=False, label=NO_CONSENSUS, agreement=0.5)
    spent = consolidate(["cat", "dog", "bird", "fish"], free_text=False, escalations=MAX_ESCALATIONS,
                        someone_left=never_asked)
    assert spent == Outcome(escalate=False, label=NO_CONSENSUS, agreement=0.25)


def test_free_text_completes_at_once_without_a_label():
    assert consolidate([], free_text=True, escalations=0, someone_left=never_asked) == Outcome(
        escalate=False, label="", agreement=None)


def test_no_labels_is_no_consensus_without_agreement():
    assert consolidate([], free_text=False, escalations=0, someone_left=never_asked) == Outcome(
        escalate=False, label=NO_CONSENSUS, agreement=None)


def test_the_module_loads_no_django():
    code = "import sys, review.consolidation; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
