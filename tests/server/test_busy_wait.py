"""``--scheduler-busy-wait``: after input the event loop keeps polling for a while, then sleeps."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pika

from eb_support import wait_until
from exchange_broker.server.busy_wait import BusyWait
from exchange_broker.testing import ThreadedBroker


def test_polls_until_the_time_after_the_last_input_has_passed():
    loop = asyncio.new_event_loop()
    now = [0.0]
    busy = BusyWait(loop, 0.0001, clock=lambda: now[0])
    try:
        busy.touch()
        for _ in range(5):  # time stands still: every loop turn polls again
            loop.run_until_complete(asyncio.sleep(0))
        assert busy.spinning and busy.turns >= 5
        now[0] = 0.00005
        busy.touch()  # more input: another 100 µs from here
        now[0] = 0.00012
        loop.run_until_complete(asyncio.sleep(0))
        assert busy.spinning
        now[0] = 0.00016
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        assert not busy.spinning  # 110 µs without input: the loop may sleep
        turns = busy.turns
        loop.run_until_complete(asyncio.sleep(0))
        assert busy.turns == turns
    finally:
        loop.close()


def test_a_broker_stops_polling_once_its_clients_are_quiet():
    with ThreadedBroker(busy_wait_us=2000) as tb:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tb.port))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", q, b"hello")
            assert tb.server.busy_wait.turns > 0  # it polled after the publish
            assert wait_until(lambda: not tb.server.busy_wait.spinning, timeout=5)
            turns = tb.server.busy_wait.turns
            conn.sleep(0.05)
            assert tb.server.busy_wait.turns == turns  # idle: asleep, not polling
            assert ch.basic_get(q, auto_ack=True)[2] == b"hello"
        finally:
            conn.close()


def test_a_bad_value_is_one_line():
    out = subprocess.run([sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--port", "0",
                          "--scheduler-busy-wait", "-5"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--scheduler-busy-wait must be a number of microseconds" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
