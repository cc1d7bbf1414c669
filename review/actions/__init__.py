"""Writes of human review (docs/SPEC.md §5), one module per noun, each action one transaction:
teams (work teams and flow definitions), loops (starting and stopping them), claims
(holding a slot, giving it back), answers (recording one, consolidating the loop) and
expiry (the beat's housekeeping).

Lock order everywhere: the loop row, then its assignment rows. Slot counters on the
loop (answers_needed, answers_count, holds_count, open_slots) change only under the
loop's row lock or through a compare-and-set UPDATE (open_slots > 0), so no slot is
ever held twice and no answer is lost or counted twice.
"""
