"""GET /api/stream-chunks/{vhost}/{queue}: a stored stream's log as the store's chunks, for bulk
readers (decoded with persistence.stream_chunks.read_frames). Real broker process with a SQLite
store, real pika publisher, plain HTTP."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request

import pytest
from admin_helpers import Api

from eb_support import close_quietly, free_port, pika_connect, wait_until
from persistence.stream_chunks import read_frames

STREAM = {"x-queue-type": "stream"}


def _fetch(port: int, path: str, user: str = "guest", password: str = "guest"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def _messages(data: bytes, start: int, end: int) -> list[tuple[int, bytes]]:
    """(offset, body) of the offsets start..end-1 found in a chunks answer."""
    out = []
    for first, chunk in read_frames(data):
        lo, hi = max(start - first, 0), min(end - first, chunk.n)
        out += [(seq, body) for seq, _ex, _rk, _props, body, _ts in chunk.rows(first, lo, hi)]
    return out


@pytest.fixture
def stored_broker(spawn_broker, workdir):
    port = free_port()
    proc = spawn_broker("--data-dir", str(workdir / "data"), "--admin-port", str(port))
    api = Api(f"http://127.0.0.1:{port}")
    assert wait_until(lambda: api.get("/api/overview")[0] == 200, 10)
    return proc, port, api


def test_chunks_of_a_stored_stream_read_back_every_offset_in_ranges(stored_broker):
    proc, port, api = stored_broker
    conn = pika_connect(proc.port)
    try:
        ch = conn.channel()
        ch.queue_declare("log", durable=True, arguments=STREAM)
        ch.confirm_delivery()
        for i in range(5000):
            ch.basic_publish("", "log", b"m%d" % i)  # one confirm at a time: many small chunks
            if i == 2500:
                ch.queue_declare("plain", durable=True)
        status, data, headers = _fetch(port, "/api/stream-chunks/%2F/log")
        assert status == 200 and headers["Content-Type"] == "application/octet-stream"
        assert (headers["X-Stream-From"], headers["X-Stream-To"]) == ("0", "5000")
        assert _messages(data, 0, 5000) == [(i, b"m%d" % i) for i in range(5000)]
        status, data, headers = _fetch(port, "/api/stream-chunks/%2F/log?from=1234&to=1240")
        assert status == 200 and (headers["X-Stream-From"], headers["X-Stream-To"]) == ("1234", "1240")
        assert _messages(data, 1234, 1240) == [(i, b"m%d" % i) for i in range(1234, 1240)]
        status, data, headers = _fetch(port, "/api/stream-chunks/%2F/log?from=4999&to=99999")
        assert headers["X-Stream-To"] == "5000"  # never beyond what is committed
        assert _messages(data, 4999, 5000) == [(4999, b"m4999")]
        status, data, _ = _fetch(port, "/api/stream-chunks/%2F/log?from=7000")
        assert status == 200 and data == b""
        # bad input: clear 400s and 404s, the broker goes on
        for path, code in (("/api/stream-chunks/%2F/log?from=-1", 400),
                           ("/api/stream-chunks/%2F/log?to=ten", 400),
                           ("/api/stream-chunks/%2F/plain", 400),
                           ("/api/stream-chunks/%2F/nope", 404),
                           ("/api/stream-chunks/nohost/log", 404)):
            status, body, _ = _fetch(port, path)
            assert status == code, (path, status, body)
        assert api.ok("GET", "/api/stream-offsets/%2F/log")["next_offset"] == 5000
    finally:
        close_quietly(conn)


def test_chunks_need_read_permission_on_the_queue(stored_broker):
    proc, port, api = stored_broker
    conn = pika_connect(proc.port)
    try:
        conn.channel().queue_declare("secret", durable=True, arguments=STREAM)
    finally:
        close_quietly(conn)
    api.ok("PUT", "/api/users/bob", {"password": "pw", "tags": "management"})
    api.ok("PUT", "/api/permissions/%2F/bob", {"configure": "", "write": "", "read": "^public$"})
    status, _body, _ = _fetch(port, "/api/stream-chunks/%2F/secret", "bob", "pw")
    assert status in (401, 403)
    status, _body, _ = _fetch(port, "/api/stream-chunks/%2F/secret", "bob", "wrong")
    assert status == 401


def test_an_in_memory_broker_says_to_read_over_amqp(spawn_broker):
    port = free_port()
    proc = spawn_broker("--in-memory", "--admin-port", str(port))
    api = Api(f"http://127.0.0.1:{port}")
    assert wait_until(lambda: api.get("/api/overview")[0] == 200, 10)
    conn = pika_connect(proc.port)
    try:
        conn.channel().queue_declare("mem", durable=True, arguments=STREAM)
        status, body, _ = _fetch(port, "/api/stream-chunks/%2F/mem")
        assert status == 400 and b"not stored" in body
    finally:
        close_quietly(conn)
