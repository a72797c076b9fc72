"""The database goes away under load (PostgreSQL): the broker survives, says so, nacks, recovers.

The outage is real: the throwaway database stops accepting connections
(``ALLOW_CONNECTIONS false``) and every session on it is terminated, while a pika publisher in
confirm mode keeps publishing persistent messages.
"""

from __future__ import annotations

import threading
import time

import pika.exceptions
import pytest
from sqlalchemy import text


from durability_helpers import PERSISTENT, connect, message_count
from eb_support import close_quietly, pg_admin_engine, wait_until

FAILED_LINE = "database write failed; publishers are nacked until it recovers"
RECOVERED_LINE = "database writes succeed again"


def _set_outage(dbname: str, down: bool) -> None:
    with pg_admin_engine().connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {"false" if down else "true"}'))
        if down:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": dbname})


class ConfirmPublisher(threading.Thread):
    """pika, confirm mode, one persistent publish at a time; records acks and nacks (NackError)."""

    def __init__(self, broker) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.stop = threading.Event()
        self.results: list[tuple[bytes, bool, float]] = []  # (body, acked, when)
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = None
        try:
            conn = connect(self.broker)
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            while not self.stop.is_set():
                i += 1
                body = f"m{i:06d}".encode()
                try:
                    ch.basic_publish("", "outage", body, PERSISTENT)
                    self.results.append((body, True, time.monotonic()))
                except pika.exceptions.NackError:
                    self.results.append((body, False, time.monotonic()))
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            close_quietly(conn)

    def acked(self) -> list[bytes]:
        return [b for b, ok, _ in self.results if ok]

    def nacked(self) -> list[bytes]:
        return [b for b, ok, _ in self.results if not ok]


def test_postgres_outage_nacks_publishers_and_recovers(pg_broker_factory, pg_backend):
    b = pg_broker_factory()
    conn = connect(b)
    conn.channel().queue_declare("outage", durable=True)
    close_quietly(conn)

    pub = ConfirmPublisher(b)
    pub.start()
    try:
        assert wait_until(lambda: len(pub.acked()) >= 50, 10), "no confirms before the outage"
        _set_outage(pg_backend.dbname, True)
        down_at = time.monotonic()
        try:
            assert wait_until(lambda: len(pub.nacked()) >= 20, 15), \
                f"publishers were not nacked during the outage: {pub.results[-3:]} {pub.error}"
            acked_during = [body for body, ok, t in pub.results if ok and t > down_at + 0.5]
            assert not acked_during, f"acked while the database refused connections: {acked_during[:5]}"
            assert b.alive(), "broker died when its database went away"
            assert b.wait_for_log(FAILED_LINE, 5), "no clear log line about the failing database"
            # declare-ok promises a stored definition: it cannot be given while nothing is stored
            conn = connect(b)
            try:
                with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
                    conn.channel().queue_declare("declared-during-outage", durable=True)
                assert err.value.reply_code == 541
            finally:
                close_quietly(conn)
        finally:
            _set_outage(pg_backend.dbname, False)
        up_at = time.monotonic()
        assert wait_until(lambda: sum(1 for _, ok, t in pub.results if ok and t > up_at) >= 50, 20), \
            f"publishing with confirms did not recover: {pub.results[-3:]} {pub.error}"
    finally:
        pub.stop.set()
        pub.join(10)
    assert pub.error is None, repr(pub.error)
    assert b.alive()
    assert b.wait_for_log(RECOVERED_LINE, 5)

    # every ack was for a stored message; whatever was stored is what the publisher was told
    stored = set(pg_backend.stored_bodies("outage"))
    acked, nacked = pub.acked(), pub.nacked()
    lost = [m for m in acked if m not in stored]
    assert not lost, f"{len(lost)} acked messages are not in the store, e.g. {lost[:5]}"
    # a nack whose batch died inside COMMIT may still have been stored; nothing else may be
    stored_nacked = [m for m in nacked if m in stored]
    assert len(stored_nacked) <= 1, stored_nacked[:5]

    # the broker is fully usable again: a new confirm-mode publisher, and the queue still counts
    # every message it holds (stored or not - nacked ones stayed in memory, as RabbitMQ may too)
    conn = connect(b)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "outage", b"final", PERSISTENT)
        assert message_count(conn, "outage") == len(pub.results) + 1
    finally:
        close_quietly(conn)
    assert b"final" in pg_backend.stored_bodies("outage")

    # one traceback for the outage, not one per failed batch (an outage must not flood the log)
    log = b.log()
    full_reports = log.count("persistence write of") - log.count(" in a row): ")
    assert full_reports <= 2, f"{full_reports} failed-write tracebacks for one outage"
    print(f"acked {len(acked)}, nacked {len(nacked)}, "
          f"{log.count('persistence write of')} failed-write log lines")
