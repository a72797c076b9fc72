from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from persistence import GroupCommitWriter, SqlStore, StoredMessage


def msg(queue_id: int, seq: int, body: bytes | None = None, **kw) -> StoredMessage:
    return StoredMessage(
        queue_id=queue_id,
        seq=seq,
        exchange=kw.pop("exchange", "amq.direct"),
        routing_key=kw.pop("routing_key", f"rk.{seq}"),
        properties=kw.pop("properties", b"\x80\x00\x0atext/plain"),
        body=body if body is not None else f"body-{seq}".encode(),
        created_ms=kw.pop("created_ms", 1_700_000_000_000 + seq),
        **kw,
    )


def seqs(store: SqlStore, qid: int) -> list[int]:
    return [m.seq for m in store.load_messages(qid, 0, 10**9)]


def new_queue(store: SqlStore, name: str = "q", vhost: str = "/") -> int:
    return store.put_queue(vhost, name, True, False, False, b"")


# ------------------------------------------------------------------ definitions


def test_definitions_round_trip(store: SqlStore):
    store.put_vhost("/", {"description": "default", "tags": ["a"]})
    store.put_vhost("other", default_queue_type="quorum")
    store.put_user("guest", "hash==", "rabbit_password_hashing_sha256", ["administrator"])
    store.put_permission("guest", "/", ".*", ".*", ".*")
    store.put_exchange("/", "ex", "topic", True, False, False, b"\x00\x01args")
    store.put_exchange("/", "ex.int", "fanout", True, True, True, b"")
    qid = store.put_queue("/", "q1", True, False, True, b"qargs")
    store.put_binding("/", "ex", "q1", "queue", "a.*", b"")
    store.put_binding("/", "ex", "ex.int", "exchange", "#", b"\x01")

    d = store.load_definitions()
    assert d.vhosts == [
        {"name": "/", "metadata": {"description": "default", "tags": ["a"]}, "default_queue_type": None},
        {"name": "other", "metadata": {}, "default_queue_type": "quorum"},
    ]
    assert d.users == [
        {
            "name": "guest",
            "password_hash": "hash==",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["administrator"],
        }
    ]
    assert d.permissions == [
        {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
    ]
    assert d.exchanges == [
        {"vhost": "/", "name": "ex", "type": "topic", "durable": True, "auto_delete": False,
         "internal": False, "arguments": b"\x00\x01args"},
        {"vhost": "/", "name": "ex.int", "type": "fanout", "durable": True, "auto_delete": True,
         "internal": True, "arguments": b""},
    ]
    assert d.queues == [
        {"id": qid, "vhost": "/", "name": "q1", "durable": True, "exclusive": False,
         "auto_delete": True, "arguments": b"qargs", "message_count": 0, "min_seq": 0,
         "max_seq": 0, "delivered_mark": 0},
    ]
    assert sorted(d.bindings, key=lambda b: b["destination"]) == [
        {"vhost": "/", "source": "ex", "destination": "ex.int", "destination_type": "exchange",
         "routing_key": "#", "arguments": b"\x01"},
        {"vhost": "/", "source": "ex", "destination": "q1", "destination_type": "queue",
         "routing_key": "a.*", "arguments": b""},
    ]


def test_upserts_and_stable_queue_id(store: SqlStore):
    store.put_vhost("/", {"v": 1})
    store.put_vhost("/", {"v": 2})
    store.put_user("u", "h1", "sha256", [])
    store.put_user("u", "h2", "sha512", ["management"])
    store.put_permission("u", "/", "a", "b", "c")
    store.put_permission("u", "/", "x", "y", "z")
    store.put_exchange("/", "e", "direct", True, False, False, b"")
    store.put_exchange("/", "e", "topic", False, True, True, b"z")
    q1 = store.put_queue("/", "q", True, False, False, b"")
    q2 = store.put_queue("/", "q2", True, False, False, b"")
    store.write_batch([], [], {q1: 7})
    assert store.put_queue("/", "q", False, True, True, b"new") == q1
    assert q1 != q2

    d = store.load_definitions()
    assert d.vhosts == [{"name": "/", "metadata": {"v": 2}, "default_queue_type": None}]
    assert d.users[0]["password_hash"] == "h2" and d.users[0]["tags"] == ["management"]
    assert d.permissions[0]["configure"] == "x"
    assert d.exchanges[0]["type"] == "topic" and d.exchanges[0]["arguments"] == b"z"
    q = next(q for q in d.queues if q["id"] == q1)
    assert (q["durable"], q["exclusive"], q["auto_delete"], q["arguments"]) == (False, True, True, b"new")
    assert q["delivered_mark"] == 7  # redeclare keeps the delivered mark


def test_queue_ids_are_not_reused(store: SqlStore):
    q1 = new_queue(store, "a")
    store.delete_queue("/", "a")
    q2 = new_queue(store, "a")
    assert q2 != q1


def test_put_queue_with_caller_assigned_id(store: SqlStore):
    assert store.put_queue("/", "a", True, False, False, b"", queue_id=10) == 10
    store.write_batch([msg(10, 1)], [], {10: 1})
    assert store.put_queue("/", "a", False, False, True, b"x", queue_id=10) == 10  # redeclare
    assert seqs(store, 10) == [1]
    (q,) = store.load_definitions().queues
    assert (q["id"], q["durable"], q["auto_delete"], q["arguments"], q["delivered_mark"]) == (10, False, True, b"x", 1)
    # same name under a new id: the stale row and its messages are replaced
    assert store.put_queue("/", "a", True, False, False, b"", queue_id=11) == 11
    assert [q["id"] for q in store.load_definitions().queues] == [11]
    assert seqs(store, 10) == [] and seqs(store, 11) == []
    with pytest.raises(IntegrityError):  # id taken by another queue
        store.put_queue("/", "b", True, False, False, b"", queue_id=11)
    assert new_queue(store, "auto") > 11  # auto ids stay ahead of assigned ones


def test_bindings_idempotent_and_keyed_by_arguments(store: SqlStore):
    store.put_binding("/", "ex", "q", "queue", "rk", b"")
    store.put_binding("/", "ex", "q", "queue", "rk", b"")
    store.put_binding("/", "ex", "q", "queue", "rk", b"\x01args")
    assert len(store.load_definitions().bindings) == 2
    store.delete_binding("/", "ex", "q", "queue", "rk", b"\x01args")
    assert [b["arguments"] for b in store.load_definitions().bindings] == [b""]
    store.delete_binding("/", "ex", "q", "queue", "rk", b"\x01args")  # absent: no error
    with pytest.raises(ValueError):
        store.put_binding("/", "ex", "q", "topic", "rk", b"")


def test_delete_vhost_cascades(store: SqlStore):
    for vh in ("/", "keep"):
        store.put_vhost(vh)
        store.put_exchange(vh, "ex", "direct", True, False, False, b"")
        store.put_binding(vh, "ex", "q", "queue", "rk", b"")
        store.store_offset(vh, "q", "consumer", 5)
    store.put_user("u", "h", "sha256", [])
    store.put_permission("u", "/", ".*", ".*", ".*")
    store.put_permission("u", "keep", ".*", ".*", ".*")
    gone = new_queue(store, "q", "/")
    kept = new_queue(store, "q", "keep")
    store.write_batch([msg(gone, 1), msg(kept, 1)], [], {})

    store.delete_vhost("/")
    d = store.load_definitions()
    assert [v["name"] for v in d.vhosts] == ["keep"]
    for kind in ("exchanges", "queues", "bindings", "permissions"):
        assert {x["vhost"] for x in getattr(d, kind)} == {"keep"}, kind
    assert [u["name"] for u in d.users] == ["u"]
    assert seqs(store, gone) == [] and seqs(store, kept) == [1]
    assert store.query_offset("/", "q", "consumer") is None
    assert store.query_offset("keep", "q", "consumer") == 5


def test_delete_exchange_removes_bindings_in_both_directions(store: SqlStore):
    for name in ("a", "b", "c"):
        store.put_exchange("/", name, "topic", True, False, False, b"")
    store.put_binding("/", "a", "q", "queue", "#", b"")
    store.put_binding("/", "b", "a", "exchange", "#", b"")
    store.put_binding("/", "b", "c", "exchange", "#", b"")
    store.put_binding("/", "c", "a", "queue", "#", b"")  # a *queue* named "a": stays
    store.put_binding("other", "a", "q", "queue", "#", b"")  # other vhost: stays
    store.delete_exchange("/", "a")
    d = store.load_definitions()
    assert {x["name"] for x in d.exchanges} == {"b", "c"}
    assert {(b["vhost"], b["source"], b["destination"], b["destination_type"]) for b in d.bindings} == {
        ("/", "b", "c", "exchange"),
        ("/", "c", "a", "queue"),
        ("other", "a", "q", "queue"),
    }


def test_delete_queue_removes_messages_bindings_offsets(store: SqlStore):
    qid = new_queue(store, "q")
    other = new_queue(store, "q.other")
    store.put_binding("/", "ex", "q", "queue", "rk", b"")
    store.put_binding("/", "ex", "q", "exchange", "rk", b"")  # an exchange named "q": stays
    store.store_offset("/", "q", "c1", 10)
    store.write_batch([msg(qid, 1), msg(qid, 2), msg(other, 1)], [], {})
    store.delete_queue("/", "q")
    store.delete_queue("/", "does-not-exist")
    d = store.load_definitions()
    assert [q["name"] for q in d.queues] == ["q.other"]
    assert [b["destination_type"] for b in d.bindings] == ["exchange"]
    assert seqs(store, qid) == [] and seqs(store, other) == [1]
    assert store.query_offset("/", "q", "c1") is None


def test_delete_user_and_permission(store: SqlStore):
    store.put_user("u", "h", "sha256", [])
    store.put_user("v", "h", "sha256", [])
    store.put_permission("u", "/", "c", "w", "r")
    store.put_permission("v", "/", "c", "w", "r")
    store.put_permission("v", "x", "c", "w", "r")
    store.delete_user("u")
    store.delete_permission("v", "x")
    d = store.load_definitions()
    assert [u["name"] for u in d.users] == ["v"]
    assert [(p["user"], p["vhost"]) for p in d.permissions] == [("v", "/")]


# --------------------------------------------------------------------- messages


def test_write_batch_append_remove_marks(store: SqlStore):
    qid = new_queue(store)
    store.write_batch([msg(qid, s) for s in range(1, 11)], [], {})
    store.write_batch([msg(qid, 11)], [(qid, 2), (qid, 3), (qid, 999)], {qid: 4})
    assert seqs(store, qid) == [1, *range(4, 12)]
    store.write_batch([], [], {qid: 2})  # marks only ever rise
    assert store.load_definitions().queues[0]["delivered_mark"] == 4
    store.write_batch([], [], {})  # empty batch is a no-op


def test_write_batch_removes_in_runs_gaps_and_scattered(store: SqlStore):
    """Removes go as range deletes when they form a few runs of consecutive seqs (acks with
    multiple), as an IN list when scattered: either way exactly the named rows go, and a
    row between two runs stays."""
    qid = new_queue(store)
    other = new_queue(store, "other")
    store.write_batch([msg(qid, s) for s in range(1, 201)] + [msg(other, s) for s in range(1, 11)],
                      [], {})
    runs = [*range(1, 51), *range(52, 101), 150, 150, 151]  # two runs, a gap (51), a duplicate
    store.write_batch([], [(qid, s) for s in runs] + [(other, 5)], {})
    assert seqs(store, qid) == [51, *range(101, 150), *range(152, 201)]
    assert seqs(store, other) == [1, 2, 3, 4, 6, 7, 8, 9, 10]
    scattered = list(range(101, 150, 2)) + [999]  # more runs than RANGES_MAX, one never stored
    store.write_batch([], [(qid, s) for s in scattered], {})
    assert seqs(store, qid) == [51, *range(102, 150, 2), *range(152, 201)]


def test_write_batch_removes_many_of_a_queue_in_one_statement(store: SqlStore):
    """Enough removes of one queue go as one DELETE per queue (PostgreSQL: seq = ANY(array), one
    statement text whatever their count; SQLite: seq IN (...)); other queues are untouched."""
    qid, other = new_queue(store), new_queue(store, "other")
    store.write_batch([msg(qid, s) for s in range(1, 21)] + [msg(other, s) for s in range(1, 6)], [], {})
    store.write_batch([], [(qid, s) for s in (2, 3, 4, 5, 9, 999)], {})
    store.write_batch([], [(qid, s) for s in range(10, 20)] + [(other, 1)], {})
    assert seqs(store, qid) == [1, 6, 7, 8, 20]
    assert seqs(store, other) == [2, 3, 4, 5]


def test_write_batch_append_and_remove_in_one_batch_cancel(store: SqlStore):
    qid = new_queue(store)
    store.write_batch([msg(qid, 1), msg(qid, 2)], [(qid, 1)], {})
    assert seqs(store, qid) == [2]


def test_write_batch_purge_runs_first(store: SqlStore):
    qid = new_queue(store)
    other = new_queue(store, "other")
    store.write_batch([msg(qid, s) for s in range(1, 6)] + [msg(other, 1)], [], {})
    store.write_batch([msg(qid, 6)], [], {qid: 6}, purges=[qid])
    assert seqs(store, qid) == [6]
    assert seqs(store, other) == [1]
    assert store.load_messages(qid, 0, 10)[0].redelivered is True


def test_write_batch_is_one_transaction(store: SqlStore):
    qid = new_queue(store)
    store.write_batch([msg(qid, 1)], [], {})
    with pytest.raises(IntegrityError):  # duplicate primary key in the same batch as good rows
        store.write_batch([msg(qid, 2), msg(qid, 1)], [], {qid: 2})
    assert seqs(store, qid) == [1]
    assert store.load_definitions().queues[0]["delivered_mark"] == 0
    store.write_batch([msg(qid, 2)], [], {})  # usable afterwards
    assert seqs(store, qid) == [1, 2]


def test_write_batch_rejects_unknown_queue(store: SqlStore):
    with pytest.raises(IntegrityError):  # foreign key is enforced (PRAGMA foreign_keys=ON on SQLite)
        store.write_batch([msg(12345, 1)], [], {})


def test_message_fields_round_trip(store: SqlStore):
    qid = new_queue(store)
    body = bytes(range(256)) * 40
    props = b"\x00\x00\xff\x01"
    m = msg(qid, 42, body, exchange="", routing_key="q", properties=props, created_ms=1_700_000_123_456,
            expires_ms=1_700_000_999_999, priority=9)
    store.write_batch([m], [], {})
    (loaded,) = store.load_messages(qid, 0, 10)
    assert loaded == m
    assert isinstance(loaded.body, bytes) and isinstance(loaded.properties, bytes)


def test_load_messages_paging_order_and_redelivered(store: SqlStore):
    qid = new_queue(store)
    other = new_queue(store, "other")
    # inserted out of order across batches; loading must return ascending seq
    store.write_batch([msg(qid, s) for s in (5, 3, 9, 1)], [], {})
    store.write_batch([msg(qid, s) for s in (2, 8, 7)] + [msg(other, 4)], [], {qid: 3})
    page1 = store.load_messages(qid, 0, 3)
    assert [m.seq for m in page1] == [1, 2, 3]
    assert all(m.redelivered for m in page1)
    page2 = store.load_messages(qid, page1[-1].seq, 3)
    assert [(m.seq, m.redelivered) for m in page2] == [(5, False), (7, False), (8, False)]
    assert [m.seq for m in store.load_messages(qid, 8, 3)] == [9]
    assert store.load_messages(qid, 9, 3) == []
    assert store.load_messages(999_999, 0, 3) == []
    assert [m.queue_id for m in store.load_messages(other, 0, 10)] == [other]


def test_queue_stats_and_definition_counts(store: SqlStore):
    qid = new_queue(store)
    empty = new_queue(store, "empty")
    store.write_batch([msg(qid, s, b"x" * s) for s in range(3, 8)], [(qid, 7)], {qid: 4})
    assert store.queue_stats(qid) == (4, 3 + 4 + 5 + 6, 6)
    assert store.queue_stats(empty) == (0, 0, 0)
    qs = {q["name"]: q for q in store.load_definitions().queues}
    assert (qs["q"]["message_count"], qs["q"]["min_seq"], qs["q"]["max_seq"], qs["q"]["delivered_mark"]) == (4, 3, 6, 4)
    assert (qs["empty"]["message_count"], qs["empty"]["min_seq"], qs["empty"]["max_seq"]) == (0, 0, 0)


def test_load_definitions_uses_one_aggregate_and_no_bodies(store: SqlStore):
    queues = [new_queue(store, f"q{i}") for i in range(20)]
    store.write_batch([msg(q, s) for q in queues for s in range(1, 51)], [], {})
    statements: list[str] = []

    def record(conn, cursor, statement, params, context, executemany):
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        d = store.load_definitions()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    on_messages = [s for s in statements if "messages" in s]
    assert len(on_messages) == 1
    assert "GROUP BY" in on_messages[0] and "body" not in on_messages[0]
    assert {q["message_count"] for q in d.queues} == {50}


@pytest.mark.realtime  # a real-time budget: run at the normal CPU priority (tests/conftest.py)
def test_load_definitions_fast_with_many_messages(store: SqlStore):
    qid = new_queue(store)
    n, chunk = 200_000, 20_000
    payload = b"p" * 100
    for start in range(1, n + 1, chunk):
        store.write_batch([msg(qid, s, payload) for s in range(start, start + chunk)], [], {})
    t = time.perf_counter()
    d = store.load_definitions()
    elapsed = time.perf_counter() - t
    assert (d.queues[0]["message_count"], d.queues[0]["min_seq"], d.queues[0]["max_seq"]) == (n, 1, n)
    assert elapsed < 2.0, f"load_definitions took {elapsed:.2f}s for {n} messages"


def test_reopen_keeps_everything(db_url):
    s = SqlStore(db_url)
    s.open()
    qid = new_queue(s)
    s.write_batch([msg(qid, 1), msg(qid, 2)], [], {qid: 1})
    s.store_offset("/", "stream", "c", 77)
    s.close()
    s2 = SqlStore(db_url)
    s2.open()
    try:
        assert [(m.seq, m.redelivered) for m in s2.load_messages(qid, 0, 10)] == [(1, True), (2, False)]
        assert s2.query_offset("/", "stream", "c") == 77
        assert new_queue(s2) == qid
    finally:
        s2.close()


def test_stream_offsets(store: SqlStore):
    assert store.query_offset("/", "s", "c") is None
    store.store_offset("/", "s", "c", 0)
    assert store.query_offset("/", "s", "c") == 0
    store.store_offset("/", "s", "c", 2**40)
    store.store_offset("/", "s", "d", 3)
    store.store_offset("vh", "s", "c", 4)
    assert store.query_offset("/", "s", "c") == 2**40
    assert store.query_offset("/", "s", "d") == 3
    assert store.query_offset("vh", "s", "c") == 4


def test_sqlite_pragmas(sqlite_url):
    s = SqlStore(sqlite_url, sqlite_synchronous="normal")
    s.open()
    try:
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    finally:
        s.close()
    with pytest.raises(ValueError):
        SqlStore(sqlite_url, sqlite_synchronous="SOMETIMES")
    with pytest.raises(ValueError):
        SqlStore("mysql://u@h/db")


# ------------------------------------------------------------------ failure paths


class Collector:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.results: list[tuple[list[object], BaseException | None]] = []

    def __call__(self, tokens: list[object], error: BaseException | None) -> None:
        with self.cond:
            self.results.append((list(tokens), error))
            self.cond.notify_all()

    def wait_for(self, token: object, timeout: float = 30.0) -> BaseException | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for tokens, error in self.results:
                    if token in tokens:
                        return error
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"token {token!r} never reported"
                self.cond.wait(remaining)


def test_writer_reports_constraint_failure_and_recovers(store: SqlStore):
    qid = new_queue(store)
    done = Collector()
    writer = GroupCommitWriter(store, done)
    writer.start()
    try:
        writer.submit("ok1", appends=[msg(qid, 1)])
        assert done.wait_for("ok1") is None
        writer.submit("dup", appends=[msg(qid, 1)])  # primary key violation: a real DB error
        assert isinstance(done.wait_for("dup"), IntegrityError)
        writer.submit("ok2", appends=[msg(qid, 2)])
        assert done.wait_for("ok2") is None
    finally:
        writer.stop()
    assert seqs(store, qid) == [1, 2]


def test_postgres_outage_is_reported_and_store_recovers(pg_url, pg_admin):
    admin = pg_admin
    dbname = pg_url.rsplit("/", 1)[1]
    store = SqlStore(pg_url)
    store.open()
    done = Collector()
    writer = GroupCommitWriter(store, done)
    writer.start()
    try:
        qid = new_queue(store)
        writer.submit("before", appends=[msg(qid, 1)])
        assert done.wait_for("before") is None

        # outage: refuse new connections and kill the pooled ones
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                {"d": dbname},
            )
        writer.submit("during", appends=[msg(qid, 2)], delivered_marks={qid: 2})
        err = done.wait_for("during")
        assert isinstance(err, DBAPIError), err
        with pytest.raises(DBAPIError):
            store.load_messages(qid, 0, 10)

        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true'))
        writer.submit("after", appends=[msg(qid, 3)])
        assert done.wait_for("after") is None
        # the failed append is gone (its publisher was nacked); its delivered mark is retried with
        # the next batch, so message 1 (delivered before the outage) now reads as redelivered
        assert [(m.seq, m.redelivered) for m in store.load_messages(qid, 0, 10)] == [(1, True), (3, False)]
    finally:
        writer.stop()
        store.close()
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true'))


def _impatient_store(sqlite_url: str) -> SqlStore:
    """A SQLite store that gives up on a held write lock after 200 ms (a real, quick failure)."""
    store = SqlStore(sqlite_url)
    store.open()
    # shorten the lock wait so the test is quick: runs after the store's own connect hook
    store.engine.pool.dispose()
    event.listen(
        store.engine, "connect", lambda dbapi_conn, rec: dbapi_conn.execute("PRAGMA busy_timeout=200")
    )
    return store


def test_sqlite_locked_database_is_reported_and_store_recovers(sqlite_url):
    """Another process holding the write lock longer than busy_timeout is a real SQLite failure."""
    store = _impatient_store(sqlite_url)
    qid = new_queue(store)
    done = Collector()
    writer = GroupCommitWriter(store, done)
    writer.start()
    blocker = create_engine(sqlite_url, isolation_level="AUTOCOMMIT")
    try:
        with blocker.connect() as bconn:
            bconn.exec_driver_sql("BEGIN EXCLUSIVE")
            writer.submit("locked", appends=[msg(qid, 1)])
            err = done.wait_for("locked")
            bconn.exec_driver_sql("ROLLBACK")
        assert isinstance(err, DBAPIError) and "locked" in str(err)
        writer.submit("free", appends=[msg(qid, 2)])
        assert done.wait_for("free") is None
    finally:
        writer.stop()
        blocker.dispose()
        store.close()
    s2 = SqlStore(sqlite_url)
    s2.open()
    try:
        assert seqs(s2, qid) == [2]
    finally:
        s2.close()


# ----------------------------------------------------------------- group commit


class CountingStore(SqlStore):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[tuple[int, int, int, int]] = []

    def write_batch(self, appends, removes, delivered_marks, purges=()):
        purges = list(purges)
        self.batches.append((len(appends), len(removes), len(delivered_marks), len(purges)))
        super().write_batch(appends, removes, delivered_marks, purges)


@pytest.fixture
def counting_store(db_url):
    s = CountingStore(db_url)
    s.open()
    try:
        yield s
    finally:
        s.close()


def test_writer_many_threads_all_committed_once_and_batched(counting_store: CountingStore):
    store = counting_store
    n_threads, per_thread = 6, 300
    qids = [new_queue(store, f"q{t}") for t in range(n_threads)]
    reported: list[object] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def on_done(tokens, error):
        with lock:
            reported.extend(tokens)
            if error is not None:
                errors.append(error)

    writer = GroupCommitWriter(store, on_done, max_batch=500)
    writer.start()

    def producer(t: int) -> None:
        qid = qids[t]
        for i in range(1, per_thread + 1):
            removes = [(qid, i - 1)] if i % 3 == 0 else []  # ack the previous one now and then
            writer.submit((t, i), appends=[msg(qid, i)], removes=removes, delivered_marks={qid: i - 1})

    threads = [threading.Thread(target=producer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    writer.stop()

    assert errors == []
    assert writer.pending == 0
    assert len(reported) == len(set(reported)) == n_threads * per_thread
    assert set(reported) == {(t, i) for t in range(n_threads) for i in range(1, per_thread + 1)}
    assert 1 <= len(store.batches) < n_threads * per_thread
    acked = {i - 1 for i in range(1, per_thread + 1) if i % 3 == 0}
    expected = [i for i in range(1, per_thread + 1) if i not in acked]
    d = {q["id"]: q for q in store.load_definitions().queues}
    for qid in qids:
        assert seqs(store, qid) == expected
        assert d[qid]["delivered_mark"] == per_thread - 1


def test_writer_merges_in_submit_order(counting_store: CountingStore):
    store = counting_store
    q, r = new_queue(store, "q"), new_queue(store, "r")
    store.write_batch([msg(q, 1), msg(r, 1)], [], {})
    done = Collector()
    writer = GroupCommitWriter(store, done)
    # queued before start(): all of them land in the first batch
    writer.submit("a", appends=[msg(q, 2), msg(q, 3), msg(r, 2)], delivered_marks={q: 5})
    writer.submit("b", removes=[(q, 3), (r, 1)], delivered_marks={q: 2})  # q3 cancels, r1 is stored
    writer.submit("c", purges=[q])  # drops stored q1 and pending q2
    writer.submit("d", appends=[msg(q, 4), msg(q, 5)])  # after the purge: kept
    writer.submit("e", removes=[(q, 5)], purges=[r], appends=[msg(r, 3)])  # purge r before its append
    assert writer.pending == 5
    store.batches.clear()
    writer.start()
    writer.stop()
    assert [tokens for tokens, _ in done.results] == [["a", "b", "c", "d", "e"]]
    assert done.results[0][1] is None
    assert store.batches == [(2, 0, 1, 2)]  # appends q4 + r3; no removes left; 1 mark; 2 purges
    assert [(m.seq, m.redelivered) for m in store.load_messages(q, 0, 10)] == [(4, True)]
    assert seqs(store, r) == [3]
    assert store.load_definitions().queues[0]["delivered_mark"] == 5


def test_writer_respects_max_batch_and_survives_callback_errors(counting_store: CountingStore):
    store = counting_store
    qid = new_queue(store)
    calls: list[list[object]] = []

    def on_done(tokens, error):
        calls.append(tokens)
        raise RuntimeError("callback bug")  # logged, writer keeps going

    writer = GroupCommitWriter(store, on_done, max_batch=10)
    for i in range(1, 36):
        writer.submit(i, appends=[msg(qid, i)])
    store.batches.clear()
    writer.start()
    writer.stop()
    assert [len(c) for c in calls] == [10, 10, 10, 5]
    assert len(store.batches) == 4
    assert seqs(store, qid) == list(range(1, 36))
    with pytest.raises(RuntimeError):
        writer.submit("late")


def test_writer_stop_flushes_pending(sqlite_url):
    store = SqlStore(sqlite_url)
    store.open()
    qid = new_queue(store)
    done = Collector()
    writer = GroupCommitWriter(store, done)
    writer.start()
    for i in range(1, 501):
        writer.submit(i, appends=[msg(qid, i)])
    writer.stop()
    assert sorted(t for tokens, _ in done.results for t in tokens) == list(range(1, 501))
    assert writer.pending == 0
    store.close()
    s2 = SqlStore(sqlite_url)
    s2.open()
    try:
        assert len(seqs(s2, qid)) == 500
    finally:
        s2.close()


def test_writer_submit_call_is_an_ordered_barrier(counting_store: CountingStore):
    store = counting_store
    done = Collector()
    writer = GroupCommitWriter(store, done)
    seen: list[object] = []

    def declare(s: SqlStore) -> None:
        seen.append(("declare", s.put_queue("/", "q", True, False, False, b"", queue_id=5)))

    def check(s: SqlStore) -> None:
        seen.append(("rows", seqs(s, 5)))

    def boom(s: SqlStore) -> None:
        raise KeyError("definition write failed")

    writer.submit_call("declare", declare)  # the queue row exists before its first message row
    writer.submit("m1", appends=[msg(5, 1)])
    writer.submit("m2", appends=[msg(5, 2)])
    writer.submit_call("check", check)  # runs after m1+m2 are committed
    writer.submit_call("boom", boom)
    writer.submit("m3", appends=[msg(5, 3)], removes=[(5, 1)])
    writer.submit_call(None, lambda s: s.delete_queue("/", "q"))
    assert writer.pending == 7
    store.batches.clear()
    writer.start()
    writer.stop()
    assert [(tokens, type(err).__name__) for tokens, err in done.results] == [
        (["declare"], "NoneType"),
        (["m1", "m2"], "NoneType"),
        (["check"], "NoneType"),
        (["boom"], "KeyError"),
        (["m3"], "NoneType"),
        ([None], "NoneType"),
    ]
    assert seen == [("declare", 5), ("rows", [1, 2])]
    assert len(store.batches) == 2
    assert store.load_definitions().queues == [] and seqs(store, 5) == []


def test_failed_batch_retries_its_removes(sqlite_url):
    """An ack (row delete) in a batch that failed (the database was locked by another process)
    is carried into the next batch, so an outage never brings an acked message back."""
    store = _impatient_store(sqlite_url)
    qid = new_queue(store)
    done = Collector()
    writer = GroupCommitWriter(store, done)
    writer.start()
    blocker = create_engine(sqlite_url, isolation_level="AUTOCOMMIT")
    try:
        writer.submit("stored", appends=[msg(qid, 1), msg(qid, 2)])
        assert done.wait_for("stored") is None
        with blocker.connect() as bconn:
            bconn.exec_driver_sql("BEGIN EXCLUSIVE")
            writer.submit("ack", removes=[(qid, 1)])
            err = done.wait_for("ack")
            bconn.exec_driver_sql("ROLLBACK")
        assert isinstance(err, DBAPIError) and "locked" in str(err)
        writer.submit("next", appends=[msg(qid, 3)])
        assert done.wait_for("next") is None
        assert seqs(store, qid) == [2, 3]
    finally:
        writer.stop()
        blocker.dispose()
        store.close()
