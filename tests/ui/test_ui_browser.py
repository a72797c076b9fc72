"""The management web UI in a real headless Chromium (Playwright), against a real broker process
and real AMQP clients (pika): log in, watch a client's queue, publish and get messages, admin
forms, closing a connection, live rate charts, and screenshots that are real images."""

from __future__ import annotations

import json
import threading
import time

import pytest
from ui_support import distinct_colours, http, login

from eb_support import close_quietly, pika_connect, uniq, wait_until

pytestmark = pytest.mark.timeout(120)


def goto(page, ui_broker, hash_: str) -> None:
    page.goto(ui_broker.url + "/" + hash_)


def messages(page) -> list[str]:
    return page.locator("#messages .msg").all_inner_texts()


def test_overview_after_login_with_screenshot(page, ui_broker, tmp_path):
    goto(page, ui_broker, "#/overview")
    page.wait_for_selector("#chart-rates svg")
    assert page.locator("#whoami").inner_text().startswith("guest")
    assert page.locator("[data-stat=queues] .value").inner_text().isdigit()
    assert page.locator("tr[data-node] td").first.inner_text() == "exchange-broker@localhost"
    shot = tmp_path / "overview.png"
    page.screenshot(path=str(shot), full_page=True)
    assert distinct_colours(shot) > 10  # text, charts, borders: not a blank page


def test_client_queue_listed_and_ready_count_follows_publishes(page, ui_broker, tmp_path):
    name = uniq("ui-q")
    conn = pika_connect(ui_broker.port)
    try:
        ch = conn.channel()
        ch.queue_declare(name)
        goto(page, ui_broker, "#/queues")
        page.get_by_label("Filter queues by name").fill(name)
        row = page.locator(f"tr[data-queue='{name}']")
        row.wait_for()
        assert row.locator("td").nth(5).inner_text() == "0"  # ready
        row.get_by_role("link", name=name).click()
        ready = page.locator("#queue-totals [data-stat=ready] .value")
        page.wait_for_function("document.querySelector('#queue-totals [data-stat=ready] .value')?.textContent === '0'")
        for _ in range(3):
            ch.basic_publish("", name, b"hello from pika")
        # the page refreshes itself (every sample interval): no reload
        page.wait_for_function("document.querySelector('#queue-totals [data-stat=ready] .value')"
                               "?.textContent === '3'")
        assert ready.inner_text() == "3"
        shot = tmp_path / "queue.png"
        page.screenshot(path=str(shot), full_page=True)
        assert distinct_colours(shot) > 10
    finally:
        close_quietly(conn)


def test_publish_on_exchange_page_then_get_on_queue_page(page, ui_broker):
    name = uniq("ui-pub")
    status, _ = http(ui_broker.url, "PUT", f"/api/queues/%2F/{name}", {"durable": False})
    assert status == 201
    # bind amq.direct -> queue with the queue page's form
    goto(page, ui_broker, f"#/queues/%2F/{name}")
    form = page.get_by_role("form", name="Add a binding")
    form.get_by_label("From exchange").fill("amq.direct")
    form.get_by_label("Routing key").fill("ui.key")
    form.get_by_role("button", name="Bind").click()
    page.get_by_role("link", name="exchange amq.direct").wait_for()
    # publish on amq.direct's page
    goto(page, ui_broker, "#/exchanges/%2F/amq.direct")
    form = page.get_by_role("form", name="Publish message")
    form.get_by_label("Routing key").fill("ui.key")
    form.get_by_label("Payload").fill("published from the UI")
    form.get_by_role("button", name="Publish message").click()
    page.wait_for_function("document.querySelector('#publish-result')?.textContent === 'Message published.'")
    # get it on the queue page
    goto(page, ui_broker, f"#/queues/%2F/{name}")
    form = page.get_by_role("form", name="Get messages")
    form.get_by_label("Ack mode").select_option("ack_requeue_false")
    form.get_by_role("button", name="Get messages").click()
    got = page.locator("#got-messages .message")
    got.first.wait_for()
    assert "published from the UI" in got.first.inner_text()
    assert "ui.key" in got.first.inner_text()
    status, q = http(ui_broker.url, "GET", f"/api/queues/%2F/{name}")
    assert q["messages"] == 0  # taken with ack: gone


def test_move_purge_and_delete_from_queue_page(page, ui_broker):
    src, dst = uniq("ui-src"), uniq("ui-dst")
    for q in (src, dst):
        http(ui_broker.url, "PUT", f"/api/queues/%2F/{q}", {})
    for i in range(4):
        http(ui_broker.url, "POST", "/api/exchanges/%2F/amq.default/publish",
             {"routing_key": src, "payload": f"m{i}", "payload_encoding": "string", "properties": {}})
    goto(page, ui_broker, f"#/queues/%2F/{src}")
    form = page.get_by_role("form", name="Move messages")
    form.get_by_label("Destination queue").fill(dst)
    form.get_by_role("button", name="Move messages").click()
    page.get_by_text(f"Moved 4 messages to {dst}").wait_for()
    assert http(ui_broker.url, "GET", f"/api/queues/%2F/{dst}")[1]["messages_ready"] == 4
    goto(page, ui_broker, f"#/queues/%2F/{dst}")
    page.get_by_role("button", name="Purge messages").click()
    page.get_by_role("button", name="Yes, purge").click()
    page.get_by_text(f"Queue purged: {dst}").wait_for()
    assert http(ui_broker.url, "GET", f"/api/queues/%2F/{dst}")[1]["messages_ready"] == 0
    page.get_by_role("button", name="Delete queue").click()
    page.get_by_role("button", name="Yes, delete").click()
    page.wait_for_url("**/#/queues")
    assert http(ui_broker.url, "GET", f"/api/queues/%2F/{dst}")[0] == 404


def test_create_user_and_policy_and_see_api_errors(page, ui_broker):
    user = uniq("ui-user")
    goto(page, ui_broker, "#/admin/users")
    form = page.get_by_role("form", name="Add a user")
    form.get_by_label("Username").fill(user)
    form.get_by_label("Password").fill("s3cret")
    form.get_by_label("Tags (comma-separated)").fill("monitoring")
    form.get_by_role("button", name="Save user").click()
    page.locator(f"tr[data-user='{user}']").wait_for()
    status, who = http(ui_broker.url, "GET", "/api/whoami", user=user, password="s3cret")
    assert status == 200 and who["tags"] == ["monitoring"]

    policy, queue = uniq("ui-pol"), uniq("ui-polq")
    http(ui_broker.url, "PUT", f"/api/queues/%2F/{queue}", {})
    goto(page, ui_broker, "#/admin/policies")
    form = page.get_by_role("form", name="Add a policy")
    form.get_by_label("Name").fill(policy)
    form.get_by_label("Pattern (regexp)").fill(f"^{queue}$")
    form.get_by_label("Definition (JSON)").fill('{"max-length": 5}')
    form.get_by_role("button", name="Save policy").click()
    page.locator(f"tr[data-policy='{policy}']").wait_for()
    assert wait_until(lambda: http(ui_broker.url, "GET", f"/api/queues/%2F/{queue}")[1]["policy"] == policy, 5)

    # a definition the broker refuses: its reason is shown, the page stays
    form.get_by_label("Name").fill(policy + "-bad")
    form.get_by_label("Definition (JSON)").fill('{"max-length": "many"}')
    form.get_by_role("button", name="Save policy").click()
    page.locator("#messages .msg.error", has_text="not a valid maximum length").wait_for()
    assert page.locator(f"tr[data-policy='{policy}']").is_visible()
    # JSON that is not JSON: a message, no request
    form.get_by_label("Definition (JSON)").fill("{not json")
    form.get_by_role("button", name="Save policy").click()
    page.wait_for_function("[...document.querySelectorAll('#messages .msg')].some(m => m.textContent.includes('must be JSON'))")


def test_wrong_password_refused(browser, ui_broker):
    context = browser.new_context()
    try:
        pg = context.new_page()
        login(pg, ui_broker.url, "guest", "not-the-password")
        pg.locator("#messages .msg.error", has_text="Login failed").wait_for()
        assert pg.get_by_label("Username").is_visible()  # still the login form
        assert pg.locator("#top").is_hidden()
        assert pg.evaluate("sessionStorage.length") == 0
    finally:
        context.close()


def test_close_connection_with_reason(page, ui_broker):
    conn = pika_connect(ui_broker.port, client_properties={"connection_name": "ui-closing"})
    try:
        goto(page, ui_broker, "#/connections")
        page.get_by_role("link", name="ui-closing", exact=False).click()
        form = page.get_by_role("form", name="Close connection")
        form.get_by_label("Reason").fill("maintenance window")
        form.get_by_role("button", name="Close connection").click()
        page.wait_for_url("**/#/connections")
        closed = []

        def pump():
            try:
                conn.process_data_events(0.05)
            except Exception as exc:  # noqa: BLE001 - the close arrives as an exception
                closed.append(str(exc))
            return closed or not conn.is_open
        assert wait_until(pump, 5)
        assert "maintenance window" in " ".join(closed)
    finally:
        close_quietly(conn)


def test_rate_chart_shows_publishes_while_a_load_runs(page, ui_broker):
    name = uniq("ui-load")
    stop = threading.Event()

    def load():
        conn = pika_connect(ui_broker.port)
        try:
            ch = conn.channel()
            ch.queue_declare(name, arguments={"x-max-length": 1000})
            while not stop.is_set():
                for _ in range(50):
                    ch.basic_publish("", name, b"load")
                conn.process_data_events(0.01)
        finally:
            close_quietly(conn)
    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        goto(page, ui_broker, "#/overview")
        publish = page.locator("#chart-rates [data-series=publish]")
        page.wait_for_function("Number(document.querySelector('#chart-rates [data-series=publish]')"
                               "?.dataset.value) > 0", timeout=15_000)
        assert float(publish.get_attribute("data-value")) > 0
        assert page.locator("#chart-rates polyline").count() >= 1
    finally:
        stop.set()
        worker.join(10)


def test_phone_width_keeps_the_page_inside_the_screen(browser, ui_broker, tmp_path):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        pg = context.new_page()
        login(pg, ui_broker.url)
        pg.wait_for_selector("#chart-rates svg")
        for hash_ in ("#/overview", "#/queues", "#/super-streams", "#/admin/users"):
            pg.goto(ui_broker.url + "/" + hash_)
            pg.wait_for_selector("main h1")
            pg.wait_for_timeout(300)
            overflow = pg.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{hash_} is wider than the phone's screen by {overflow}px"
        shot = tmp_path / "phone.png"
        pg.screenshot(path=str(shot))
        assert distinct_colours(shot) > 10
    finally:
        context.close()


def test_stream_page_shows_offsets_and_named_consumers(page, ui_broker):
    name = uniq("ui-stream")
    assert http(ui_broker.url, "PUT", f"/api/queues/%2F/{name}",
                {"durable": True, "arguments": {"x-queue-type": "stream"}})[0] == 201
    for i in range(5):
        http(ui_broker.url, "POST", "/api/exchanges/%2F/amq.default/publish",
             {"routing_key": name, "payload": f"s{i}", "payload_encoding": "string", "properties": {}})
    assert http(ui_broker.url, "PUT", f"/api/stream-offsets/%2F/{name}/reporting", {"offset": 3})[0] == 204
    goto(page, ui_broker, f"#/queues/%2F/{name}")
    row = page.locator("tr[data-consumer='reporting']")
    row.wait_for()
    assert row.locator("td").nth(1).inner_text() == "3"
    stream = page.locator("section", has=page.get_by_role("heading", name="Stream", exact=True))
    assert "Next offset" in stream.inner_text() and "5" in stream.inner_text()
    assert page.get_by_role("form", name="Get messages").count() == 0  # a stream has no basic.get


def test_definitions_export_and_import(page, ui_broker, tmp_path):
    goto(page, ui_broker, "#/admin/definitions")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download definitions").click()
    saved = tmp_path / "definitions.json"
    download.value.save_as(saved)
    exported = json.loads(saved.read_text())
    assert {"users", "vhosts", "queues", "exchanges", "bindings", "policies"} <= set(exported)
    name = uniq("ui-imported")
    form = page.get_by_role("form", name="Import definitions")
    form.get_by_label("Definitions (JSON)").fill(json.dumps({"queues": [
        {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}]}))
    form.get_by_role("button", name="Upload definitions").click()
    page.get_by_text("Definitions imported").wait_for()
    assert http(ui_broker.url, "GET", f"/api/queues/%2F/{name}")[0] == 200


def test_queue_list_pages_sorts_and_filters_by_regex(page, ui_broker):
    prefix = uniq("ui-many")
    queues = [{"name": f"{prefix}-{i:03d}", "vhost": "/", "durable": False, "auto_delete": False,
               "arguments": {}} for i in range(150)]
    assert http(ui_broker.url, "POST", "/api/definitions", {"queues": queues})[0] == 204
    goto(page, ui_broker, "#/queues")
    page.get_by_label("Queues per page").select_option("20")
    page.get_by_label("Filter queues by name").fill(prefix)
    pager = page.locator("#queue-pager")
    page.wait_for_function("document.querySelector('#queue-pager')?.textContent.includes('Page 1 of 8')")
    assert "150 of" in pager.inner_text()
    rows = page.locator("#queues tbody tr")
    assert rows.count() == 20
    assert rows.first.get_attribute("data-queue") == f"{prefix}-000"
    pager.get_by_role("button", name="Next ›").click()
    page.wait_for_function("document.querySelector('#queue-pager')?.textContent.includes('Page 2 of 8')")
    assert rows.first.get_attribute("data-queue") == f"{prefix}-020"
    # sort by name, descending (the column header is a button)
    page.get_by_role("button", name="Name ▲").click()
    page.wait_for_function(f"document.querySelector('#queues tbody tr')?.dataset.queue === '{prefix}-149'")
    # a regular expression
    page.get_by_label("Regex").check()
    page.get_by_label("Filter queues by name").fill(prefix + "-1[0-4]7$")
    page.wait_for_function("document.querySelectorAll('#queues tbody tr').length === 5")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.queue)")) == \
        [f"{prefix}-{n}" for n in ("107", "117", "127", "137", "147")]


def test_management_user_sees_no_admin_and_a_user_without_tag_is_refused(browser, ui_broker):
    viewer, nobody = uniq("ui-viewer"), uniq("ui-nobody")
    for name, tags in ((viewer, "management"), (nobody, "")):
        assert http(ui_broker.url, "PUT", f"/api/users/{name}", {"password": "pw", "tags": tags})[0] == 201
        http(ui_broker.url, "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})
    context = browser.new_context()
    try:
        pg = context.new_page()
        login(pg, ui_broker.url, nobody, "pw")
        pg.locator("#messages .msg.error", has_text="Not management user").wait_for()
        login(pg, ui_broker.url, viewer, "pw")
        pg.wait_for_selector("#totals .stat")
        assert pg.locator("#whoami").inner_text() == f"{viewer} (management)"
        assert pg.locator("#nav-admin").is_hidden()
        pg.get_by_role("link", name="Queues").click()
        pg.locator("#queue-pager").wait_for()
    finally:
        context.close()
