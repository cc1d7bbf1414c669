"""The notification channels page: admins add, switch, test, rotate and delete channels and
see the last deliveries; other members see the channels without a form or addresses."""

from __future__ import annotations

import re
from urllib.parse import urlencode

from django.test import Client

from studio import notify
from studio.actions import set_membership
from studio.models import Delivery, NotificationChannel

URL = "/projects/acme/notifications/"


def login(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def form_post(client: Client, url: str, data: dict | None = None):
    return client.post(url, urlencode(data or {}), content_type="application/x-www-form-urlencoded")


def test_an_admin_adds_a_webhook_and_sees_its_secret_once(owner):
    client = login(owner)
    page = client.get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="channel-form"' in html and "csrfmiddlewaretoken" in html and "No channels yet" in html

    response = form_post(client, URL, {"name": "on-call", "kind": "webhook", "url": "https://hooks.example.com/ty"})
    assert response.status_code == 302 and response["Location"] == URL  # Post/Redirect/Get: a reload re-posts nothing
    channel = NotificationChannel.objects.get(name="on-call")
    assert channel.secret and channel.secret not in response.content.decode()
    shown = client.get(URL).content.decode()
    assert channel.secret in shown and notify.standard_webhooks_secret(channel.secret) in shown
    assert "Channel “on-call” added." in shown
    again = client.get(URL).content.decode()  # shown exactly once
    assert channel.secret not in again and "https://hooks.example.com/ty" in again

    rotated = form_post(client, f"{URL}{channel.pk}/rotate-secret/")
    assert rotated.status_code == 302 and rotated["Location"] == URL
    channel.refresh_from_db()
    shown = client.get(URL).content.decode()
    assert channel.secret in shown and notify.standard_webhooks_secret(channel.secret) in shown
    assert channel.secret not in client.get(URL).content.decode()


def test_a_new_secret_is_not_shown_on_another_projects_page(project, other_project, owner):
    set_membership(project=other_project, user=owner, role="admin")
    client = login(owner)
    form_post(client, URL, {"name": "on-call", "kind": "webhook", "url": "https://hooks.example.com/ty"})
    secret = NotificationChannel.objects.get(name="on-call").secret
    assert secret not in client.get(f"/projects/{other_project.slug}/notifications/").content.decode()
    assert secret in client.get(URL).content.decode()  # still waiting for its own page


def test_a_refused_channel_keeps_what_was_typed(owner):
    client = login(owner)
    bad = form_post(client, URL, {"name": "typed <name>", "kind": "webhook", "url": "javascript:alert(1)"})
    assert bad.status_code == 400
    html = bad.content.decode()
    assert "Use an http:// or https:// URL." in html and 'value="typed &lt;name&gt;"' in html
    assert 'value="javascript:alert(1)"' in html


def test_an_admin_adds_an_email_list_and_bad_input_is_shown_on_its_field(owner):
    client = login(owner)
    bad = form_post(client, URL, {"name": "x", "kind": "webhook", "url": "javascript:alert(1)"})
    assert bad.status_code == 400 and "Use an http:// or https:// URL." in bad.content.decode()
    assert form_post(client, URL, {"name": "x", "kind": "email", "emails": "nope"}).status_code == 400
    assert form_post(client, URL, {"name": "x", "kind": "email", "emails": ""}).status_code == 400
    ok = form_post(client, URL, {"name": "team", "kind": "email", "emails": "a@example.com, b@example.com\nc@example.com"})
    assert ok.status_code == 302
    assert NotificationChannel.objects.get(name="team").emails == ["a@example.com", "b@example.com", "c@example.com"]
    taken = form_post(client, URL, {"name": "team", "kind": "email", "emails": "d@example.com"})
    assert taken.status_code == 400 and "already exists" in taken.content.decode()


def test_switch_test_and_delete_from_the_page(project, owner):
    channel, _ = notify.create_channel(project=project, user=owner, name="hook", kind="webhook",
                                       url=f"http://127.0.0.1:{_closed_port()}/")
    client = login(owner)
    assert form_post(client, f"{URL}{channel.pk}/toggle/").status_code == 302
    assert NotificationChannel.objects.get(pk=channel.pk).enabled is False
    sent = client.post(f"{URL}{channel.pk}/test/", follow=True)  # a disabled channel can be tried before it is on
    delivery = Delivery.objects.get(channel=channel)
    assert delivery.event == "test"
    assert "the channel is disabled: this test goes to it, alarms do not until you enable it" in sent.content.decode()
    notify.deliver(delivery.pk)
    html = client.get(URL).content.decode()
    table = html[html.index('id="deliveries-table"'):]
    assert "connection refused" in table and "test" in table and ">disabled<" in html
    assert client.get(f"{URL}{channel.pk}/toggle/").status_code == 405  # a link cannot change anything
    assert form_post(client, f"{URL}{channel.pk}/delete/").status_code == 302
    assert not NotificationChannel.objects.filter(pk=channel.pk).exists()
    assert form_post(client, f"{URL}{channel.pk}/delete/").status_code == 404


def test_a_scientist_sees_the_channels_but_no_form_and_no_addresses(project, owner, teammate, viewer):
    channel, _ = notify.create_channel(project=project, user=owner, name="hook", kind="webhook",
                                       url="https://hooks.example.com/secret-path")
    for user in (teammate, viewer):
        client = login(user)
        html = client.get(URL).content.decode()
        assert "hook" in html
        assert 'id="channel-form"' not in html and "secret-path" not in html and "deliveries-table" not in html
        assert form_post(client, URL, {"name": "mine", "kind": "webhook", "url": "https://x.example/"}).status_code == 403
        for action in ("toggle", "test", "delete", "rotate-secret"):
            assert form_post(client, f"{URL}{channel.pk}/{action}/").status_code == 403, action
    assert NotificationChannel.objects.filter(project__slug="acme").count() == 1
    assert NotificationChannel.objects.get(pk=channel.pk).enabled is True


def test_outsiders_get_a_404_and_names_are_escaped(project, owner, outsider):
    notify.create_channel(project=project, user=owner, name="<script>alert(1)</script>",
                          kind="email", emails=["a@example.com"])
    assert login(outsider).get(URL).status_code == 404
    html = login(owner).get(URL).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html


def test_the_forms_need_their_csrf_token(owner):
    client = login(owner, enforce_csrf_checks=True)
    assert form_post(client, URL, {"name": "x", "kind": "email", "emails": "a@example.com"}).status_code == 403
    html = client.get(URL).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token is not None
    data = {"csrfmiddlewaretoken": token.group(1), "name": "x", "kind": "email", "emails": "a@example.com"}
    assert form_post(client, URL, data).status_code == 302
    assert NotificationChannel.objects.filter(name="x").exists()


def _closed_port() -> int:
    from studio.embedded_redis import free_port

    return free_port()
