"""MQTT over WebSocket from a real browser page (the UI tests' Debian Chromium, driven by
Playwright): the npm ``mqtt`` package's browser bundle (tests/mqtt/node/node_modules, no CDN),
served with a small page by this test, talks to the broker's /ws; paho on TCP on the other side."""

from __future__ import annotations

import http.server
import os
import threading
from functools import partial

import pytest
from paho_support import Paho
from node_support import NODE_DIR, ensure_mqtt_npm

from exchange_broker.testing import ThreadedBroker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

PAGE = """<!doctype html><html><head><script src="/mqtt.min.js"></script></head><body><script>
window.received = [];
window.state = "connecting";
const client = mqtt.connect("ws://127.0.0.1:%(port)d/ws", {
  username: "guest", password: "guest", clientId: "browser-1", protocolVersion: 5, reconnectPeriod: 0});
client.on("connect", () => client.subscribe("browser/in/#", {qos: 1}, (err) => {
  window.state = err ? "error " + err : "subscribed"; }));
client.on("error", (err) => { window.state = "error " + err; });
client.on("message", (topic, payload, packet) => window.received.push(
  [topic, payload.toString(), packet.qos, (packet.properties || {}).contentType || null]));
window.publish = (topic, text) => client.publishAsync(topic, text,
  {qos: 1, properties: {contentType: "text/plain"}}).then(() => "ok");
</script></body></html>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    page = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(self.page)
        else:
            super().do_GET()

    def log_message(self, *args):
        pass


def test_browser_page_speaks_mqtt_over_websocket():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium to run the browser tests")
    ensure_mqtt_npm()
    from playwright.sync_api import sync_playwright
    with ThreadedBroker(mqtt=True, mqtt_ws=True) as tb:
        handler = partial(type("H", (_Handler,), {"page": (PAGE % {"port": tb.mqtt_ws_port}).encode()}),
                          directory=str(NODE_DIR / "node_modules" / "mqtt" / "dist"))
        web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=web.serve_forever, daemon=True).start()
        device = Paho(tb.mqtt_port, "tcp-side")
        try:
            device.subscribe("browser/out", 1)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page()
                    errors: list[str] = []
                    page.on("pageerror", lambda exc: errors.append(str(exc)))
                    page.goto(f"http://127.0.0.1:{web.server_address[1]}/")
                    page.wait_for_function("window.state !== 'connecting'", timeout=15_000)
                    assert page.evaluate("window.state") == "subscribed"
                    device.publish("browser/in/1", b"hello browser", 1)
                    page.wait_for_function("window.received.length === 1", timeout=15_000)
                    assert page.evaluate("window.received") == [["browser/in/1", "hello browser", 1, None]]
                    assert page.evaluate("window.publish('browser/out', 'hello tcp')") == "ok"
                    m = device.wait_messages(1)[0]
                    assert (m.topic, m.payload) == ("browser/out", b"hello tcp")
                    assert not errors, errors
                finally:
                    browser.close()
        finally:
            device.close()
            web.shutdown()
            web.server_close()
