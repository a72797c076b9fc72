"""Unit checks: the x-stream-offset header splice, argument parsing, and the store's stream
methods (SQLite, and PostgreSQL when reachable at EB_TEST_PG_URL)."""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands

from exchange_broker.protocol import codec
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.stream_args import parse_interval_ms, parse_offset_spec
from exchange_broker.queue_types.stream_delivery import _delivery
from persistence.sql_store import SqlStore
from persistence.store import StoredMessage

P = commands.Basic.Properties


def with_offset_header(raw: bytes, offset: int) -> bytes:
    """The properties a stream consumer is sent for a message stored with ``raw``."""
    return _delivery("", "s", raw, b"", offset, 0, None).properties


@pytest.mark.parametrize("props", [
    P(),
    P(content_type="text/plain"),
    P(content_type="a/b", content_encoding="gzip", delivery_mode=2, priority=3,
      correlation_id="c", reply_to="r", expiration="100", message_id="m",
      timestamp=datetime.datetime(2024, 1, 2, tzinfo=datetime.timezone.utc), message_type="t",
      user_id="guest", app_id="app"),
    P(headers={"a": 1, "b": "two", "nested": {"x": [1, 2]}}),
    P(content_type="x", headers={}, delivery_mode=1),
    P(headers={"x-stream-offset": 99, "keep": True}),   # republished from a stream
])
@pytest.mark.parametrize("offset", [0, 1, 2 ** 40, 2 ** 63 - 1])
def test_offset_header_splice(props, offset):
    raw = props.marshal()
    out = with_offset_header(raw, offset)
    decoded = codec.parse_properties(out)
    before = codec.parse_properties(raw)
    want_headers = dict(before.get("headers") or {})
    want_headers["x-stream-offset"] = offset
    assert decoded.pop("headers") == want_headers
    before.pop("headers", None)
    assert decoded == before                       # every other property untouched
    # the field is encoded as 'l' (signed 64-bit), once
    entry = b"\x0fx-stream-offsetl" + offset.to_bytes(8, "big", signed=True)
    assert out.count(b"\x0fx-stream-offset") == 1 and entry in out
    assert with_offset_header(raw, offset) == out  # the cached template gives the same bytes


def test_parse_offset_spec():
    desc = "queue 'q' in vhost '/'"
    now = 1_700_000_000_000  # the broker clock's wall time, ms
    assert parse_offset_spec(None, desc, now) == ("next",)
    assert parse_offset_spec("first", desc, now) == ("first",)
    assert parse_offset_spec(b"last", desc, now) == ("last",)
    assert parse_offset_spec(12, desc, now) == ("offset", 12)
    ts = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    assert parse_offset_spec(ts, desc, now) == ("time", int(ts.timestamp() * 1000))
    naive = datetime.datetime(2024, 5, 6, 7, 8, 9)           # pika: naive UTC
    assert parse_offset_spec(naive, desc, now) == ("time", int(ts.timestamp() * 1000))
    assert parse_offset_spec("2h", desc, now) == ("time", now - 7_200_000)
    for bad in ("3", "soon", 1.5, True, {"a": 1}):
        with pytest.raises(AMQPError) as exc:
            parse_offset_spec(bad, desc, now)
        assert exc.value.code == 406 and "invalid_stream_offset_arg" in exc.value.text


def test_parse_interval():
    assert parse_interval_ms("7D") == 7 * 86_400_000
    assert parse_interval_ms("12h") == 12 * 3_600_000
    assert parse_interval_ms("1Y") == 365 * 86_400_000
    assert parse_interval_ms("5M") == 150 * 86_400_000
    for bad in ("0s", "1d", "h", "1.5h", "10", 10, None):
        assert parse_interval_ms(bad) is None


# -- store methods ----------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'broker.db'}"
    else:
        _name, url = request.getfixturevalue("pg_database")
    s = SqlStore(url)
    try:
        s.open()
        yield s
    finally:
        s.close()


def test_store_stream_methods(store):
    qid = store.put_queue("/", "s", True, False, False, b"", queue_id=7)
    for first in (1, 26, 51, 76):  # four chunks of 25
        store.append_log(qid, [StoredMessage(qid, seq, "", "s", b"\x00\x00", b"b%d" % seq,
                                             1000 + seq // 10 * 10) for seq in range(first, first + 25)])
    assert [r[0] for r in store.read_log(qid, 20, 60)] == list(range(21, 61))
    rows = store.read_log(qid, 10, 15)
    assert [r[0] for r in rows] == [11, 12, 13, 14, 15]
    assert rows[0][1:] == ("", "s", b"\x00\x00", b"b11", 1010)
    assert store.find_seq_at_time(qid, 0) == 1
    assert store.find_seq_at_time(qid, 1050) == 50                 # first with created >= 1050
    assert store.find_seq_at_time(qid, 1051) == 60
    assert store.find_seq_at_time(qid, 1100) == 100
    assert store.find_seq_at_time(qid, 1101) is None
    sizes = list(store.iter_message_sizes(qid, chunk=7))
    assert len(sizes) == 100 and sizes[0] == (1, 2 + 2, 1000) and sizes[-1][0] == 100
    assert store.log_bytes(qid) == sum(size for _, size, _ in sizes)
    assert store.log_last_ms(qid) == 1100
    assert store.delete_messages_upto(qid, 40) == 40  # one chunk dropped, one cut (written again)
    assert store.read_log(qid, 0, 42) == store.read_log(qid, 40, 42)
    assert [r[0] for r in store.read_log(qid, 0, 100)] == list(range(41, 101))
    assert store.log_bytes(qid) == 60 * 2 + sum(len(b"b%d" % s) for s in range(41, 101))
    assert store.find_seq_at_time(qid, 0) == 41
    assert store.find_seq_at_time(qid, 1040) == 41
    store.store_offset("/", "s", "a", 5)
    store.store_offset("/", "s", "b", 9)
    store.store_offset("/", "other", "a", 1)
    assert store.load_offsets("/", "s") == {"a": 5, "b": 9}
    store.delete_queue("/", "s")
    assert store.load_offsets("/", "s") == {}
    assert store.read_log(qid, 0, 1000) == []
    assert store.find_seq_at_time(qid, 0) is None
    assert store.log_last_ms(qid) is None


# -- commits without fsync (stream appends) ---------------------------------------------------------
def test_store_unsynced_batch_commits_and_level_is_per_transaction(store):
    """write_batch(sync=False) commits like any batch (multi-row INSERTs of 256 and 32 rows and
    single rows: 600 = 2 x 256 + 2 x 32 + 24); on SQLite that transaction runs at synchronous
    NORMAL and the next fsynced one at the store's level (FULL) again."""
    from sqlalchemy.exc import IntegrityError
    qid = store.put_queue("/", "s", True, False, False, b"", queue_id=3)
    levels = []
    if store._dialect == "sqlite":
        store.write_fence = lambda conn: levels.append(
            conn.exec_driver_sql("PRAGMA synchronous").scalar())
    rows = [StoredMessage(qid, seq, "", "s", b"\x00\x00", b"m%d" % seq, seq) for seq in range(1, 601)]
    store.write_batch(rows, [], {}, sync=False)
    store.write_batch([StoredMessage(qid, 601, "", "s", b"\x00\x00", b"last", 601)], [], {})
    store.write_batch([], [], {}, sync=False, logs={qid: [StoredMessage(qid, 1, "", "s", b"", b"x", 602)]})
    got = store.load_messages(qid, 0, 1000)
    assert [r.seq for r in got] == list(range(1, 602))
    assert got[299].body == b"m300" and got[600].body == b"last"
    assert [r[4] for r in store.read_log(qid, 0, 10)] == [b"x"]
    # a duplicate anywhere in a multi-row statement fails the whole batch, as an IntegrityError
    bad = [StoredMessage(qid, seq, "", "s", b"", b"", 0) for seq in range(603, 900)] + \
        [StoredMessage(qid, 5, "", "s", b"", b"", 0)]
    with pytest.raises(IntegrityError):
        store.write_batch(bad, [], {}, sync=False)
    assert len(store.load_messages(qid, 0, 1000)) == 601
    if store._dialect == "sqlite":
        assert levels[:3] == [1, 2, 1]  # NORMAL, FULL, NORMAL


def test_writer_batch_unsynced_only_when_every_submit_allows_it(tmp_path):
    from persistence.writer import GroupCommitWriter

    class Recording(SqlStore):
        syncs: list = []

        def write_batch(self, appends, removes, delivered_marks, purges=(), sync=True, logs=None):
            self.syncs.append((len(appends), sum(map(len, (logs or {}).values())), sync))
            super().write_batch(appends, removes, delivered_marks, purges, sync=sync, logs=logs)

    store = Recording(f"sqlite:///{tmp_path / 'broker.db'}")
    store.open()
    done = []
    writer = GroupCommitWriter(store, lambda tokens, error: done.append((tokens, error)))
    try:
        qid = store.put_queue("/", "s", True, False, False, b"", queue_id=4)
        qid2 = store.put_queue("/", "c", True, False, False, b"", queue_id=5)

        def m(seq):
            return StoredMessage(qid, seq, "", "s", b"", b"", seq)
        # queued before start(): each pair is folded into one batch; stream appends (logs)
        # of one queue are joined in order into one chunk
        writer.submit("a", logs={qid: [m(1)]}, sync=False)
        writer.submit("b", logs={qid: [m(2)]}, sync=False)
        writer.submit_call("barrier", lambda s: None)
        writer.submit("c", logs={qid: [m(3)]}, sync=False)
        writer.submit("d", [StoredMessage(qid2, 1, "", "c", b"", b"", 1)])
        writer.start()
        writer.stop()
        assert [r[0] for r in store.read_log(qid, 0, 10)] == [1, 2, 3]
    finally:
        store.close()
    assert store.syncs == [(0, 2, False), (1, 1, True)]
    assert [t for tokens, error in done for t in tokens] == ["a", "b", "barrier", "c", "d"]
    assert all(error is None for _, error in done)


def test_stream_fsync_flag_makes_stream_appends_synced(tmp_path):
    """``serve --stream-fsync``: the durability fsyncs the commits of stream appends too."""
    import asyncio

    from exchange_broker.cli import build_parser
    from exchange_broker.config import Config
    from exchange_broker.durability.sql import SqlDurability

    args = build_parser().parse_args(["serve", "--stream-fsync"])
    assert Config.from_namespace(args).stream_fsync is True
    assert Config.from_namespace(build_parser().parse_args(["serve"])).stream_fsync is False

    class Queue:
        store_id, deleted = 7, False

    class Msg:
        seq, exchange, routing_key, properties, body = 1, "", "s", b"", b"x"
        created_ms, expires_ms, priority = 1, None, 0

    loop = asyncio.new_event_loop()
    try:
        for fsync_streams, expected in ((False, False), (True, True)):
            durability = SqlDurability(None, loop, fsync_streams=fsync_streams)
            durability._schedule = lambda: None  # noqa: SLF001 - no writer: look at the batch only
            durability.append_log(Queue(), Msg())  # a stream's append
            assert durability._sync is expected  # noqa: SLF001
    finally:
        loop.close()
