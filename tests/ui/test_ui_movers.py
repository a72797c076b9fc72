"""The web UI's shovels page in a real headless Chromium against a real broker process: a shovel
within the broker shows as running with its messages moved, a refusing one as terminated with
the reason, and the page's Restart and Delete buttons act on the broker."""

from __future__ import annotations

import pytest
from ui_support import http

from eb_support import close_quietly, pika_connect, uniq, wait_until

pytestmark = pytest.mark.timeout(120)


def test_shovels_page(page, ui_broker):
    src, dst, ok, bad = uniq("src"), uniq("dst"), uniq("ok"), uniq("bad")
    conn = pika_connect(ui_broker.port)
    try:
        ch = conn.channel()
        ch.queue_declare(src, durable=True)
        for i in range(25):
            ch.basic_publish("", src, str(i).encode())
    finally:
        close_quietly(conn)
    value = {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://", "dest-queue": dst}
    assert http(ui_broker.url, "PUT", f"/api/parameters/shovel/%2F/{ok}", {"value": value})[0] == 201
    refused = {"src-uri": "amqp://", "src-queue": src, "dest-uri": "amqp://nobody:nothing@127.0.0.1:%d" % ui_broker.port,
               "dest-queue": dst, "reconnect-delay": 30}
    assert http(ui_broker.url, "PUT", f"/api/parameters/shovel/%2F/{bad}", {"value": refused})[0] == 201
    page.goto(ui_broker.url + "/#/shovels")
    row = f'#shovels tr[data-shovel="{ok}"]'
    page.wait_for_function("(s) => document.querySelector(s)?.textContent.includes('running')", arg=row)
    page.wait_for_function("(s) => document.querySelector(s)?.textContent.includes('25')", arg=row)
    bad_row = f'#shovels tr[data-shovel="{bad}"]'
    page.wait_for_function("(s) => /terminated.*refused/i.test(document.querySelector(s)?.textContent || '')",
                           arg=bad_row)
    page.click(f"{row} button.restart")
    page.wait_for_selector("#messages >> text=Shovel restarted")
    page.click(f"{bad_row} button.delete")
    page.wait_for_function("(s) => !document.querySelector(s)", arg=bad_row)
    assert wait_until(lambda: http(ui_broker.url, "GET", f"/api/parameters/shovel/%2F/{bad}")[0] == 404, 5)
    assert page.locator("#federation-links").inner_text().strip() == "No federation links."
