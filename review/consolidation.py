"""How a loop's answers become its result, on plain values (no database, no Django): the
majority vote, when a tie asks one more reviewer, and the agreement. The actions apply the
result to the loop under its row lock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MAX_ESCALATIONS = 2  # a tie asks one more reviewer, at most two more
NO_CONSENSUS = "no consensus"


def vote(labels: Sequence[str]) -> tuple[Counter, str | None, bool]:
    """(votes, winner, tie): the majority label; a tie when the top two are equal."""
    votes = Counter(labels)
    ranked = votes.most_common()
    if not ranked:
        return votes, None, False
    tie = len(ranked) > 1 and ranked[0][1] == ranked[1][1]
    return votes, ranked[0][0], tie


@dataclass(frozen=True)
class Outcome:
    """escalate: the loop wants one more answer (a tie, with an escalation left and someone
    left to ask). Otherwise the loop completes with label ("" for free text, NO_CONSENSUS
    for an unbroken tie) and agreement (the share of answers that gave the label)."""

    escalate: bool
    label: str = ""
    agreement: float | None = None


def consolidate(labels: Sequence[str], *, free_text: bool, escalations: int,
                someone_left: Callable[[], bool]) -> Outcome:
    """The consolidation rules once every needed answer is in. Free text keeps every answer
    and completes at once; a majority completes; a tie escalates while fewer than
    MAX_ESCALATIONS were made and someone_left() (asked only then) says a team member has
    not yet seen the loop, and completes as no consensus otherwise."""
    if free_text:
        return Outcome(escalate=False, label="", agreement=None)
    votes, winner, tie = vote(labels)
    if tie and escalations < MAX_ESCALATIONS and someone_left():
        return Outcome(escalate=True)
    label = NO_CONSENSUS if tie else (winner or NO_CONSENSUS)
    agreement = (votes.most_common(1)[0][1] / len(labels)) if labels else None
    return Outcome(escalate=False, label=label, agreement=agreement)
