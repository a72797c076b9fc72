"""Helpers for the queue/exchange extension tests (a module of its own, not conftest, so that
tests can import it whatever other conftest modules a run loads). Scaffolding shared with the
other test directories (uniq, wait_until, pika_connect, SubprocessBroker) is in eb_support."""

from __future__ import annotations


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def get_all(ch, queue: str, ack: bool = True) -> list:
    """basic.get until empty: [(method, props, body)]."""
    out = []
    while True:
        m, p, b = ch.basic_get(queue, auto_ack=ack)
        if m is None:
            return out
        out.append((m, p, b))
