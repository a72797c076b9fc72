"""The web UI's super stream pages in a real headless Chromium against a real broker process, with
pika as the publisher and as a consumer-group member: partitions, the group, its member holding
the partitions, lag going to 0 once the member acks, declaring and growing from the UI, the API's
errors shown, and the virtual host filter."""

from __future__ import annotations

import threading

import pika
import pytest
from ui_support import distinct_colours, http

from eb_support import close_quietly, pika_connect, uniq, wait_until

pytestmark = pytest.mark.timeout(120)


def goto(page, ui_broker, hash_: str) -> None:
    page.goto(ui_broker.url + "/" + hash_)


def wait_text(page, selector: str, text: str) -> None:
    """Until the element's text is ``text`` (the page refreshes itself: no reload)."""
    page.wait_for_function("([s, t]) => document.querySelector(s)?.textContent.trim() === t", arg=[selector, text])


class GroupMember(threading.Thread):
    """One member of consumer group ``group`` on its own pika connection (pika is not thread-safe:
    everything of this connection runs in this thread). Holds every delivery unacked until
    ``ack`` is set, then acks what it has and everything after."""

    def __init__(self, port: int, stream: str, group: str) -> None:
        super().__init__(daemon=True)
        self.port, self.stream, self.group = port, stream, group
        self.ack, self.stop, self.joined = threading.Event(), threading.Event(), threading.Event()
        self.received: list[tuple[int, int]] = []  # (partition, offset)
        self.last_tag = 0
        self.acked_tag = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = None
        try:
            conn = pika_connect(self.port, client_properties={"connection_name": "ui-group-member"})
            ch = conn.channel()
            ch.basic_qos(prefetch_count=200)

            def on_message(_ch, method, props, _body):
                headers = props.headers or {}
                self.received.append((headers["x-stream-partition"], headers["x-stream-offset"]))
                self.last_tag = method.delivery_tag
            ch.basic_consume(queue=self.stream, on_message_callback=on_message,
                             arguments={"x-consumer-group": self.group, "x-stream-offset": "first"})
            self.joined.set()
            while not self.stop.is_set():
                conn.process_data_events(0.05)
                if self.ack.is_set() and self.last_tag > self.acked_tag:
                    ch.basic_ack(self.last_tag, multiple=True)
                    self.acked_tag = self.last_tag
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.joined.set()
        finally:
            if conn is not None:
                close_quietly(conn)


def test_super_stream_pages_show_partitions_group_members_and_lag(page, ui_broker, tmp_path):
    name, group, keys = uniq("ui-ss"), "g", 30
    conn = pika_connect(ui_broker.port)
    member = None
    try:
        ch = conn.channel()
        ch.exchange_declare(name, "x-super-stream", durable=True, arguments={"x-partitions": 3})
        ch.confirm_delivery()
        for i in range(keys):
            ch.basic_publish(name, f"key-{i}", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))

        # the list: partitions and messages
        goto(page, ui_broker, "#/super-streams")
        row = page.locator(f"#super-streams tr[data-super-stream='{name}']")
        row.wait_for()
        assert row.locator("td").nth(2).inner_text() == "3"
        assert row.locator("td").nth(3).inner_text() == str(keys)
        row.get_by_role("link", name=name).click()

        # its page: the 3 partitions with their queues and offsets, no group yet
        parts = page.locator("#partitions tbody tr")
        page.wait_for_function("document.querySelectorAll('#partitions tbody tr').length === 3")
        assert parts.evaluate_all("rs => rs.map(r => r.children[1].textContent)") == [f"{name}-{i}" for i in range(3)]
        status, ss = http(ui_broker.url, "GET", f"/api/super-streams/%2F/{name}")
        assert status == 200
        assert [r.locator("td").nth(4).inner_text() for r in parts.all()] == \
            [str(p["messages"]) for p in ss["partition_details"]]
        assert sum(p["messages"] for p in ss["partition_details"]) == keys
        assert "No consumer groups" in page.locator("#groups").inner_text()

        # a member joins: it holds all 3 partitions, everything is unacked, lag = every message
        member = GroupMember(ui_broker.port, name, group)
        member.start()
        assert member.joined.wait(10) and member.error is None, member.error
        assert wait_until(lambda: len(member.received) == keys, 10), member.received
        section = page.locator(f"section.group[data-group='{group}']")
        section.wait_for()
        member_row = section.locator("tr[data-member]")
        member_row.wait_for()
        cells = member_row.locator("td").all_inner_texts()
        assert cells[1].startswith("ui-group-member (127.0.0.1:") and cells[4] == "200" and cells[5] == "0, 1, 2"
        wait_text(page, f"section.group[data-group='{group}'] [data-stat=lag] .value", str(keys))
        owned = section.locator("tr[data-state]")
        assert owned.count() == 3
        assert owned.evaluate_all("rs => rs.map(r => r.dataset.state)") == ["active"] * 3
        tag = member_row.get_attribute("data-member")
        assert owned.evaluate_all("rs => rs.map(r => r.children[1].textContent)") == [tag] * 3
        assert sum(int(r.locator("td").nth(3).inner_text()) for r in owned.all()) == keys  # unacked
        assert all(r.locator("td").nth(4).inner_text() == "none" for r in owned.all())  # nothing committed

        # the member acks: lag goes to 0 and the committed offsets follow (page refresh, no reload)
        member.ack.set()
        wait_text(page, f"section.group[data-group='{group}'] [data-stat=lag] .value", "0")
        page.wait_for_function(f"[...document.querySelectorAll(\"section.group[data-group='{group}'] tr[data-state] "
                               "td:nth-child(4)\")].every(td => td.textContent === '0')")  # unacked
        for i, p in enumerate(ss["partition_details"]):
            committed = owned.nth(i).locator("td").nth(4).inner_text()
            assert committed == (str(p["next_offset"] - 1) if p["messages"] else "none")

        # raise the partition count from the page: the new, empty partition, and the member takes it
        form = page.get_by_role("form", name="Raise the partition count")
        form.get_by_label("New partition count").fill("4")
        form.get_by_role("button", name="Raise partitions").click()
        page.wait_for_function("document.querySelectorAll('#partitions tbody tr').length === 4")
        new = page.locator("#partitions tr[data-partition='3']")
        assert new.locator("td").nth(1).inner_text() == f"{name}-3"
        assert new.locator("td").nth(4).inner_text() == "0"
        wait_text(page, "#super-stream-totals [data-stat=partitions] .value", "4")
        page.wait_for_function(f"document.querySelector(\"section.group[data-group='{group}'] tr[data-member] "
                               "td:nth-child(6)\")?.textContent === '0, 1, 2, 3'")
        assert http(ui_broker.url, "GET", f"/api/super-streams/%2F/{name}")[1]["partitions"] == 4
        shot = tmp_path / "super-stream.png"
        page.screenshot(path=str(shot), full_page=True)
        assert distinct_colours(shot) > 10  # tables, cards, text: not a blank page

        # a lower count: the API's reason as a message, nothing changes
        form.get_by_label("New partition count").fill("2")
        form.get_by_role("button", name="Raise partitions").click()
        # (the messages area may still show another test's error: wait for this one's)
        page.locator("#messages .msg.error", has_text="never removed").wait_for()
        assert page.locator("#partitions tbody tr").count() == 4
        assert member.error is None, member.error
    finally:
        if member is not None:
            member.stop.set()
            member.join(10)
        close_quietly(conn)
        http(ui_broker.url, "DELETE", f"/api/exchanges/%2F/{name}")


def test_declare_super_stream_from_the_ui_and_vhost_filter(page, ui_broker):
    name, other = uniq("ui-ss-form"), uniq("ui-ss-vhost")
    assert http(ui_broker.url, "PUT", f"/api/vhosts/{other}", {})[0] == 201
    assert http(ui_broker.url, "PUT", f"/api/permissions/{other}/guest",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    try:
        goto(page, ui_broker, "#/super-streams")
        form = page.get_by_role("form", name="Declare a super stream")
        form.get_by_label("Name").fill(name)
        form.get_by_label("Partitions").fill("2")
        form.get_by_label("Arguments (JSON)").fill('{"x-max-age": "1D"}')
        form.get_by_role("button", name="Declare super stream").click()
        page.locator(f"#super-streams tr[data-super-stream='{name}']").wait_for()
        status, ss = http(ui_broker.url, "GET", f"/api/super-streams/%2F/{name}")
        assert status == 200 and ss["partitions"] == 2
        assert http(ui_broker.url, "GET", f"/api/queues/%2F/{name}-1")[1]["arguments"]["x-max-age"] == "1D"

        # bad input: the API's reason shown, no super stream made
        form.get_by_label("Name").fill(name + "-bad")
        form.get_by_label("Partitions").fill("0")
        form.get_by_role("button", name="Declare super stream").click()
        # (the messages area may still show another test's error: wait for this one's)
        page.locator("#messages .msg.error", has_text="'partitions' must be an integer").wait_for()
        assert http(ui_broker.url, "GET", f"/api/super-streams/%2F/{name}-bad")[0] == 404

        # the header's virtual host choice: only that vhost's super streams
        page.evaluate("EB.loadVhosts()")
        page.locator("#vhost-select").select_option(other)
        page.get_by_text("No super streams.").wait_for()
        assert page.locator(f"#super-streams tr[data-super-stream='{name}']").count() == 0
        page.locator("#vhost-select").select_option("")
        page.locator(f"#super-streams tr[data-super-stream='{name}']").wait_for()

        # an unknown super stream's page: the API's message
        goto(page, ui_broker, "#/super-streams/%2F/no-such-stream")
        page.get_by_text("no super stream 'no-such-stream'").wait_for()
    finally:
        http(ui_broker.url, "DELETE", f"/api/exchanges/%2F/{name}")
        http(ui_broker.url, "DELETE", f"/api/vhosts/{other}")
