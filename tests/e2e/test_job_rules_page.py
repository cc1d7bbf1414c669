"""The job page's rules and the Alarms and Nodes pages in chromium, as a new user found them:

- the rule watcher's last transitions, written just after the final status, reach a page
  that watched the job end (it looks again), without a reload;
- a rule the Add-a-rule form refuses comes back open, with what was typed and the error
  beside its field, in view; the form keeps its input through the panel's live refreshes;
- the Alarms page's "include finished jobs" box applies at once, like the state menu (and
  an ended job without system samples shows no empty chart);
- a 100-character rule name, a running job's cost table, a node's long version string and a
  100-character channel name fit the page at 1360 px: nothing scrolls sideways.

The job's stream is played by the test (the stand-in EventSource of test_live_charts)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from jobs.models import AlarmTransition, JobAttempt, JobRule, JobStatus, MetricPoint, Node, RuleState, TrainingJob
from studio import actions, notify
from studio.models import NotificationChannel, Role
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_job_pages import sign_in
from tests.e2e.test_live_charts import FAKE_STREAM_JS
from tests.factories import make_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

LONG_NAME = "n" * 100


def running_job(project, user, **fields) -> TrainingJob:
    now = timezone.now()
    return make_job(project, name=fields.pop("name", "watched"), algorithm="tabular-classifier",
                    hyperparameters={"epochs": 1}, created_by=user, status=JobStatus.TRAINING, attempt=1,
                    resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                    started_at=now - timedelta(seconds=30), training_started_at=now - timedelta(seconds=20), **fields)


def rule(job: TrainingJob, name: str, state: str, reason: str, **fields) -> JobRule:
    return JobRule.objects.create(job=job, name=name, type=fields.pop("type", "stalled"),
                                  parameters=fields.pop("parameters", {"threshold_seconds": 10}),
                                  actions=[{"type": "tag", "tag": f"alarm:{name}"}], state=state, state_reason=reason,
                                  state_changed_at=timezone.now(), **fields)


def no_sideways_scroll(page) -> None:
    widths = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    # The elements that reach past the window, innermost first, to say what is too wide.
    past = page.evaluate("""() => [...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1)
        .filter(e => ![...e.children].some(c => c.getBoundingClientRect().right > document.documentElement.clientWidth + 1))
        .slice(0, 5).map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))""")
    assert widths[0] <= widths[1], f"{page.url}: {widths[0]} px wide in a {widths[1]} px window: {past}"


def test_the_watchers_last_transitions_reach_a_page_that_saw_the_job_end(live_server, scientist, project,
                                                                        browser_page):
    page = browser_page
    page.add_init_script(FAKE_STREAM_JS)
    job = running_job(project, scientist)
    stalled = rule(job, "stalled", RuleState.ALARM, "no metric point or log line for 12 s (limit 10 s)")
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_function("() => window.__source !== undefined")
    assert page.locator("#rules-panel [data-rule='stalled']").get_attribute("data-state") == "ALARM"

    # The job ends; 0.3 s later (as the watcher does, on its next cycle) the rule clears.
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())

    def watcher_cycle() -> None:
        time.sleep(0.3)
        JobRule.objects.filter(pk=stalled.pk).update(state=RuleState.OK, state_reason="a metric point or log line arrived",
                                                     state_changed_at=timezone.now())

    late = threading.Thread(target=watcher_cycle)
    late.start()
    page.evaluate("() => window.__emit('status', {status: 'Completed', final: true, message: 'Completed'})")
    late.join()
    page.wait_for_function("() => document.querySelector(\"#rules-panel [data-rule='stalled']\").dataset.state === 'OK'",
                           timeout=15_000)
    assert "in alarm" not in page.locator("#rules-panel").inner_text()
    assert not page.console_errors, page.console_errors


def test_a_refused_rule_comes_back_open_with_its_input_and_the_error_beside_the_field(live_server, scientist, project,
                                                                                     browser_page):
    page = browser_page
    page.add_init_script(FAKE_STREAM_JS)
    job = running_job(project, scientist)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#rule-add summary").click()
    page.select_option("#rule-type", "custom")
    page.fill("#rule-name", "val-high")
    typed = '{"metric": "train_loss", "window": 0, "threshold": 1}'
    page.fill("#rule-parameters", typed)
    page.check("#rule-add input[value='tag']")
    page.click("#rule-add button[type=submit]")

    error = page.locator("#rule-add .field-error")
    error.wait_for()
    assert "parameters.window" in error.inner_text(), error.inner_text()
    assert page.locator("#rule-add").get_attribute("open") is not None
    assert page.input_value("#rule-parameters") == typed and page.input_value("#rule-name") == "val-high"
    assert page.input_value("#rule-type") == "custom" and page.is_checked("#rule-add input[value='tag']")
    # In view: the browser went to the form, not to the top of the page where messages are.
    assert page.evaluate("() => { const r = document.querySelector('#rule-add .field-error').getBoundingClientRect();"
                         " return r.top >= 0 && r.bottom <= window.innerHeight; }")
    assert not JobRule.objects.filter(job=job).exists()

    # A rule's transition refreshes the panel while the user fixes the parameters: what they
    # typed, and the focus, stay.
    page.fill("#rule-parameters", '{"metric": "train_loss", "window": 2')
    rule(job, "stalled", RuleState.ALARM, "quiet")
    page.evaluate("() => window.__emit('status', {status: 'Training', message: 'rule stalled: ALARM: quiet'})")
    page.locator("#rules-panel [data-rule='stalled']").wait_for()
    assert page.input_value("#rule-parameters") == '{"metric": "train_loss", "window": 2'
    assert page.evaluate("() => document.activeElement && document.activeElement.id") == "rule-parameters"

    page.fill("#rule-parameters", '{"metric": "train_loss", "window": 2, "threshold": 1}')
    page.click("#rule-add button[type=submit]")
    page.locator("#rules-panel [data-rule='val-high']").wait_for()
    assert JobRule.objects.get(job=job, name="val-high").parameters["window"] == 2
    assert page.locator("#rule-add .field-error").count() == 0


def test_the_alarms_pages_finished_box_applies_at_once(live_server, scientist, project, browser_page):
    page = browser_page
    done = running_job(project, scientist, name="ended")
    TrainingJob.objects.filter(pk=done.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
    rule(done, "stalled", RuleState.ALARM, "quiet for 20 s")
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/alarms/")
    assert page.locator("#alarms-table").count() == 0
    page.check("input[name=finished]")
    page.wait_for_url("**/alarms/?*finished=true*")
    page.locator("#alarms-table [data-rule='stalled']").wait_for()
    assert page.is_checked("input[name=finished]")

    # The ended job's page: no node reported a sample, and none will come — no empty chart.
    page.goto(f"{live_server.url}/jobs/{done.pk}/")
    page.wait_for_function("() => document.getElementById('system-chart').hidden")
    assert "no node reported any" in page.locator("#system-empty").inner_text()

    response = page.goto(f"{live_server.url}/alarms/?state=bogus")
    assert response is not None and response.status == 400
    assert "Unknown state 'bogus'" in page.locator("[data-field=state]").inner_text()


def test_long_names_the_cost_table_and_node_versions_fit_the_page(live_server, scientist, project, browser_page):
    page = browser_page
    page.add_init_script(FAKE_STREAM_JS)
    job = running_job(project, scientist, name="j" * 60)
    rule(job, LONG_NAME, RuleState.ALARM, "x" * 300, type="custom",
         parameters={"metric": "m" * 150, "threshold": 1, "comparison": ">"})
    JobAttempt.objects.create(job=job, attempt=1, node_rank=0, billable_seconds=4321.5, training_seconds=4000.0,
                              price_per_hour=Decimal("36.5"), currency="USD", cost=Decimal("43.815"))  # running
    Node.objects.create(name="node-with-a-long-name-" + "x" * 40, hostname="host-" + "h" * 60, queue="node.cpu.x",
                        version="trainyard 0.9.0+" + "g" * 45, cpus=16, memory_bytes=64 * 2**30)
    sign_in(page, live_server.url)

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#rules-panel [data-rule]").first.wait_for()
    no_sideways_scroll(page)
    table = page.evaluate("() => { const t = document.getElementById('rules-table');"
                          " return [t.getBoundingClientRect().right, t.closest('.panel').getBoundingClientRect().right]; }")
    assert table[0] <= table[1] + 1, f"the rules table ends at {table[0]} px, its panel at {table[1]} px"
    cost = page.evaluate("() => { const t = document.getElementById('cost-attempts');"
                         " return [t.scrollWidth, t.parentElement.clientWidth]; }")
    assert cost[0] <= cost[1], f"the cost table is {cost[0]} px in {cost[1]} px"
    assert page.locator("#cost-attempts th", has_text="Cost").is_visible()
    assert page.locator("#cost-attempts [aria-label=running]").count() == 1  # a running attempt, still in its card
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-long-names.png"), full_page=True)

    NotificationChannel.objects.create(project=project, name="c" * 100, kind="webhook",
                                       url="https://hooks.example.com/" + "p" * 300)
    actions.set_membership(project=project, user=scientist, role=Role.ADMIN)  # the channels' URLs and the form
    for path in ("/alarms/?finished=true", "/nodes/", f"/projects/{project.slug}/notifications/"):
        page.goto(live_server.url + path)
        no_sideways_scroll(page)
        for table in page.locator(".table-wide > table").all():  # nor inside their own scroller
            assert table.evaluate("t => t.parentElement.scrollWidth <= t.parentElement.clientWidth"), (path, table.evaluate("t => [t.scrollWidth, t.offsetWidth, t.parentElement.scrollWidth, t.parentElement.clientWidth]"))
        page.screenshot(path=str(SCREENSHOTS / f"trainyard-{path.strip('/').split('/')[-1].split('?')[0]}-long-names.png"),
                        full_page=True)
    assert not page.console_errors, page.console_errors


def test_a_stall_is_marked_on_every_chart_at_the_last_step_reported(live_server, scientist, project, browser_page):
    """A clock alarm has no step of its own: the charts mark it where the curve stopped
    (values.step_reached), and a point's alarm on its own metric's chart only."""
    page = browser_page
    job = make_job(project, name="went-quiet", algorithm="tabular-classifier", created_by=scientist,
                   status=JobStatus.STOPPED, stop_reason="RuleTriggered", stop_rule="stalled", attempt=1,
                   started_at=timezone.now() - timedelta(minutes=5), finished_at=timezone.now())
    now = timezone.now()
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name=name, step=step, value=1 / (step + 1), time=now)
                                     for name in ("loss", "accuracy") for step in range(0, 56, 5)])
    stalled = rule(job, "stalled", RuleState.ALARM, "no metric or log line for 12 s (limit 10 s)")
    AlarmTransition.objects.create(rule=stalled, job=job, from_state="OK", to_state="ALARM", step=None,
                                   reason="no metric or log line for 12 s (limit 10 s)",
                                   values={"silent_seconds": 12.0, "step_reached": 55})
    spike = rule(job, "spike", RuleState.ALARM, "loss above 0.5", type="custom",
                 parameters={"metric": "loss", "threshold": 0.5, "comparison": ">"})
    AlarmTransition.objects.create(rule=spike, job=job, from_state="OK", to_state="ALARM", step=20,
                                   reason="loss above 0.5", values={"metric": "loss"})
    # A rule that flapped 40 times since: spike's mark (still in ALARM) must not be pushed out.
    flappy = rule(job, "flappy", RuleState.OK, "loss fell again", type="custom",
                  parameters={"metric": "loss", "threshold": 0.1, "comparison": ">"})
    for i in range(40):
        AlarmTransition.objects.create(rule=flappy, job=job, from_state="ALARM" if i % 2 else "OK",
                                       to_state="OK" if i % 2 else "ALARM", step=30 + i // 2, reason=f"flip {i}",
                                       values={"metric": "loss"}, at=now - timedelta(minutes=1) + timedelta(seconds=i))
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    marks = """name => { const div = document.querySelector(`#charts .chart[data-metric="${name}"]`);
        return div && div.layout ? (div.layout.shapes || []).map(s => s.x0).sort((a, b) => a - b) : null; }"""
    page.wait_for_function(f"() => ({marks})('loss') && ({marks})('loss').length === 7", timeout=15_000)
    assert page.evaluate(f"() => ({marks})('loss')") == [20, 45, 46, 47, 48, 49, 55]  # flappy's newest 5
    labels = """name => document.querySelector(`#charts .chart[data-metric="${name}"]`).layout.annotations.map(a => a.text).sort()"""
    assert page.evaluate(f"() => ({labels})('loss')") == ["flappy", "spike", "stalled"]  # one label per rule
    assert page.evaluate(f"() => ({marks})('accuracy')") == [55]
    assert "after step 55" in page.locator("#rule-events li", has_text="stalled").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-stall-mark.png"), full_page=True)
    assert not page.console_errors, page.console_errors


@pytest.mark.parametrize("width", [390, 1280])
def test_the_cost_notification_and_nodes_pages_fit_a_phone_and_a_laptop(live_server, scientist, project, browser_page,
                                                                       width):
    """A new user found the channels, prices and nodes tables pushing the page sideways at
    390 px (719–817 px wide), and the Nodes page's last column cut off at 1280 px: each
    table scrolls inside its own card, and at 1280 px the nodes table needs no scrolling."""
    from jobs.models import InstancePrice
    from studio.models import Delivery

    page = browser_page
    page.set_viewport_size({"width": width, "height": 900})
    actions.set_membership(project=project, user=scientist, role=Role.ADMIN)
    running_job(project, scientist, name="a-job-with-a-long-name")
    for instance_type in ("cpu", "gpu-a100-" + "x" * 30):
        InstancePrice.objects.create(project=project, instance_type=instance_type, price_per_node_hour=Decimal("12.5"),
                                     price_per_gpu_hour=Decimal("3.25"), currency="EUR", updated_by=scientist)
    channel = NotificationChannel.objects.create(project=project, name="on-call webhook", kind="webhook",
                                                 url="https://hooks.example.com/services/T000/B000/" + "p" * 40)
    Delivery.objects.create(channel=channel, event="alarm.transition", status=Delivery.Status.FAILED, attempts=5,
                            last_error="connection refused by hooks.example.com:443 after 5 tries")
    for index in range(2):
        Node.objects.create(name=f"node-{index}-on-a-host-with-a-long-name", hostname="host-" + "h" * 30,
                            queue="node.cpu.x", version="trainyard 0.9.0+g1234567", cpus=16, memory_bytes=64 * 2**30,
                            state="idle", instance_type="cpu")
    sign_in(page, live_server.url)

    for path in (f"/projects/{project.slug}/notifications/", f"/projects/{project.slug}/prices/",
                 f"/projects/{project.slug}/spend/", "/nodes/"):
        page.goto(live_server.url + path)
        no_sideways_scroll(page)
        for table in page.locator("table").all():
            assert table.evaluate("t => !!t.closest('.table-wide')"), (path, table.get_attribute("id"))
        page.screenshot(path=str(SCREENSHOTS / f"trainyard-{path.strip('/').split('/')[-1]}-{width}.png"), full_page=True)
    if width >= 1280:
        fits = page.evaluate("() => { const s = document.getElementById('nodes-table').parentElement;"
                             " return [s.scrollWidth, s.clientWidth]; }")
        assert fits[0] <= fits[1], f"the nodes table is {fits[0]} px in {fits[1]} px at {width} px"
    assert not page.console_errors, page.console_errors


def test_the_small_things_a_new_user_hit_on_the_rules_and_channels(live_server, scientist, project, browser_page):
    """The Add-a-rule Name field and button were unstyled (an <input> with no type), an
    alarm's "· notified (3)" sat alone on a line under a long reason, rule names broke
    mid-word in a squeezed Rules column, and the channel form showed the URL and the e-mail
    fields whatever the kind."""
    page = browser_page
    page.add_init_script(FAKE_STREAM_JS)
    page.set_viewport_size({"width": 390, "height": 900})
    actions.set_membership(project=project, user=scientist, role=Role.ADMIN)
    job = running_job(project, scientist, name="watched")
    plateau = rule(job, "loss_not_decreasing", RuleState.ALARM, "loss changed by less than 0.1 % over 10 steps",
                   type="loss_not_decreasing", parameters={})
    AlarmTransition.objects.create(rule=plateau, job=job, from_state="OK", to_state="ALARM", step=40,
                                   reason="loss changed by less than 0.1 % over the last 10 steps (from 0.4012 to "
                                          "0.4011), after a warm-up of 20 steps",
                                   actions_taken=[{"type": "notify", "deliveries": [1, 2, 3]}])
    sign_in(page, live_server.url)

    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#rules-panel [data-rule]").first.wait_for()
    name = page.locator("#rules-table [data-rule] .mono").first
    assert name.evaluate("e => e.getClientRects().length") == 1, "loss_not_decreasing on one line"
    event = page.locator("#rule-events li").first
    assert "notified 3 channels" in event.inner_text()
    reason, notified = (event.locator(".event-detail > span").nth(i).bounding_box() for i in (0, 1))
    assert notified["y"] < reason["y"] + reason["height"], "the action follows the reason's last line"
    no_sideways_scroll(page)
    page.locator("#rules-panel").screenshot(path=str(SCREENSHOTS / "trainyard-rules-390.png"))

    page.click("#rule-add summary")
    styles = page.evaluate("""() => ['rule-name', 'rule-parameters'].map(id => {
        const s = getComputedStyle(document.getElementById(id));
        return [s.borderTopWidth, s.borderTopStyle, s.paddingLeft, s.borderRadius]; })""")
    assert styles[0] == styles[1], f"the Name field is styled like the Parameters one: {styles}"
    button = page.locator("#rule-add button[type=submit]")
    assert "button--primary" in button.get_attribute("class")

    page.goto(f"{live_server.url}/projects/{project.slug}/notifications/")
    assert page.is_visible("#id_url") and not page.is_visible("#id_emails")
    page.fill("#id_name", "team mail")
    page.fill("#id_url", "not a url at all")  # typed before the kind changed: hidden, so not held against it
    page.select_option("#id_kind", "email")
    assert page.is_visible("#id_emails") and not page.is_visible("#id_url")
    page.fill("#id_emails", "ops@example.com")
    page.click("#channel-form button[type=submit]")
    page.locator("#channels-table").wait_for()
    channel = NotificationChannel.objects.get(project=project, name="team mail")
    assert channel.kind == "email" and channel.emails == ["ops@example.com"] and channel.url == ""
    assert not page.is_visible("#id_emails"), "a fresh form shows the webhook's field again"
    assert not page.console_errors, page.console_errors


def test_a_new_webhook_shows_both_forms_of_its_secret_and_a_metadata_url_is_refused(live_server, scientist, project,
                                                                                   browser_page):
    """The secret panel at 390 px: ours and the Standard Webhooks form (whsec_…), each whole on
    the page without a sideways scroll; a cloud-metadata URL is an error on its field."""
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 900})
    actions.set_membership(project=project, user=scientist, role=Role.ADMIN)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/projects/{project.slug}/notifications/")
    page.fill("#id_name", "metadata")
    page.fill("#id_url", "http://169.254.169.254/latest/meta-data/")
    page.click("#channel-form button[type=submit]")
    assert "STUDIO_WEBHOOK_DENIED_NETWORKS" in page.locator("#channel-form .has-error").inner_text()
    assert not NotificationChannel.objects.filter(project=project).exists()

    page.fill("#id_name", "on-call")
    page.fill("#id_url", "https://hooks.example.com/trainyard")
    page.click("#channel-form button[type=submit]")
    page.locator("#new-secret").wait_for()
    channel = NotificationChannel.objects.get(project=project, name="on-call")
    assert page.inner_text("[data-testid=new-secret]").strip() == channel.secret
    assert page.inner_text("[data-testid=new-standard-secret]").strip() == notify.standard_webhooks_secret(channel.secret)
    no_sideways_scroll(page)
    for shown in ("new-secret", "new-standard-secret"):  # whole, not scrolled inside its box
        assert page.eval_on_selector(f"[data-testid={shown}]", "e => e.scrollWidth <= e.clientWidth"), shown
    page.locator("#new-secret").screenshot(path=str(SCREENSHOTS / "trainyard-new-secret-390.png"))
    # The refused form is answered 400 (its page, with the error): the browser logs that, nothing else.
    assert all("status of 400" in error for error in page.console_errors), page.console_errors


def test_the_spend_pages_csv_button_downloads_the_months_launches(live_server, scientist, project, browser_page):
    import csv
    import io

    from jobs.models import JobAttempt

    page = browser_page
    job = running_job(project, scientist, name="billed")
    JobAttempt.objects.create(job=job, attempt=1, started_at=timezone.now(), price_per_hour=Decimal("2"), currency="USD")
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/projects/{project.slug}/spend/")
    with page.expect_download() as download:
        page.click("#spend-csv")
    got = download.value
    assert got.suggested_filename == f"trainyard-{project.slug}-spend-{timezone.now():%Y-%m}.csv"
    rows = list(csv.DictReader(io.StringIO(Path(got.path()).read_text(encoding="utf-8"))))
    assert [(r["job_name"], r["instance_type"], r["currency"]) for r in rows] == [("billed", "cpu", "USD")]
    assert not page.console_errors, page.console_errors


@pytest.mark.parametrize("width", [1280, 390])
def test_the_add_a_rule_form_picks_notifys_states_and_channels(live_server, scientist, project, browser_page, width):
    """The form said "Actions on ALARM" while notify sent every transition, and offered no
    channel: a user ticks notify, leaves OK out, picks a channel, and the rule says so."""
    page = browser_page
    page.set_viewport_size({"width": width, "height": 900})
    page.add_init_script(FAKE_STREAM_JS)
    actions.set_membership(project=project, user=scientist, role=Role.ADMIN)
    NotificationChannel.objects.create(project=project, name="ops", kind="webhook", url="http://hooks.example.com/x")
    NotificationChannel.objects.create(project=project, name="pager", kind="email", emails=["a@example.com"])
    job = running_job(project, scientist)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.locator("#rule-add summary").click()
    form = page.locator("#rule-add")
    assert "Actions on ALARM" not in form.inner_text()
    assert page.is_checked("#rule-add input[name=notify_on][value=ALARM]")
    assert not page.is_checked("#rule-add input[name=notify_on][value=INSUFFICIENT_DATA]")
    page.fill("#rule-name", "quiet")
    page.check("#rule-notify")
    page.uncheck("#rule-add input[name=notify_on][value=OK]")
    page.check("#rule-add input[name=channels][value=ops]")
    no_sideways_scroll(page)
    page.screenshot(path=str(SCREENSHOTS / f"rule-form-notify-{width}.png"), full_page=True)
    page.click("#rule-add button[type=submit]")
    page.locator("#rules-panel [data-rule='quiet']").wait_for()
    assert JobRule.objects.get(job=job, name="quiet").actions == [{"type": "notify", "channels": ["ops"], "on": ["ALARM"]}]
    assert "notify ops on ALARM" in page.locator("#rules-panel [data-rule='quiet']").inner_text()
