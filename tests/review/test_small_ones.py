"""A flow with one reviewer per item does not promise tie-breaking (a tie
needs two answers)."""

from __future__ import annotations

from django.test import Client


def test_tie_note_only_where_a_tie_can_happen(make_flow, owner):
    client = Client()
    client.force_login(owner)
    single = make_flow(task_count=1)
    several = make_flow(task_count=3)
    assert "a tie asks" not in client.get(f"/review/flows/{single.pk}/").content.decode()
    assert "a tie asks up to 2 more" in client.get(f"/review/flows/{several.pk}/").content.decode()
