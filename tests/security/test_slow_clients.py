"""Slow and idle clients do not stall the others, and cannot make the broker buffer without bound.

* 1,000 idle connections (handshake done, then silence) while a pika client keeps publishing and
  consuming with normal latency;
* a consumer that stops reading its socket while a producer publishes 50 MB: its deliveries stop
  once its write buffer is full (flow control), the rest stays in the queue, memory for it stays
  bounded, and other consumers keep receiving;
* a client that floods requests without reading the replies: the broker stops reading it once
  its replies back up, instead of queueing replies without bound.
"""

from __future__ import annotations

import resource
import socket
import statistics
import threading
import time

import pytest
from pamqp import commands
from pamqp import frame as pframe
from sec_helpers import Raw, close_quietly, connect, wait_for

from exchange_broker.connection.channel import OUTPUT_BUDGET
from exchange_broker.server.listener import WRITE_HIGH_WATER
from exchange_broker.testing import ThreadedBroker

# what one connection may hold in user space: the transport's high-water mark, plus what the
# output budget lets one flush add on top of it, plus one message that straddles the mark
BUFFER_BOUND = WRITE_HIGH_WATER + OUTPUT_BUDGET + 256 * 1024


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096
    if soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < 2200:
            pytest.skip(f"only {new} file descriptors available")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def write_buffers(tb) -> dict:
    """Each connection's user-space write buffer (bytes), by peer port."""
    def sizes():
        out = {}
        for proto in tb.server.protocols:
            t = proto.transport
            if t is not None:
                out[proto.session.peer[1]] = t.get_write_buffer_size()
        return out
    return tb.call(sizes)


def latencies(port: int, n: int = 200) -> list[float]:
    """Publish then consume one message at a time on a pika connection: round-trip seconds."""
    conn = connect(port)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(time.perf_counter()), auto_ack=True)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        ch.basic_publish("", q, b"x" * 100)
        while len(got) <= i:
            conn.process_data_events(0.001)
            assert time.perf_counter() - t0 < 5, "a message took more than 5 s"
        out.append(got[i] - t0)
    conn.close()
    return out


def test_a_thousand_idle_connections_do_not_slow_others():
    with ThreadedBroker(handshake_timeout=60) as tb:
        baseline = latencies(tb.port, 100)
        idle = []
        try:
            for i in range(1000):
                raw = Raw(tb.port, heartbeat=0)
                assert raw.opened is not None and isinstance(raw.opened[1], commands.Connection.OpenOk)
                if i % 2:  # half of them also open a channel and declare a queue, then go quiet
                    raw.send(commands.Channel.Open(), 1)
                    raw.send(commands.Queue.Declare(queue="", exclusive=True), 1)
                idle.append(raw)
            assert wait_for(lambda: len(tb.broker.sessions) == 1000, timeout=20)
            busy = latencies(tb.port, 300)
            # the broker's once-a-second sweep over all connections happened meanwhile
            time.sleep(1.2)
            busy += latencies(tb.port, 100)
        finally:
            for raw in idle:
                raw.close()
        assert wait_for(lambda: len(tb.server.protocols) == 0, timeout=20)
    med, worst = statistics.median(busy), max(busy)
    assert med < max(0.02, 5 * statistics.median(baseline)), (med, statistics.median(baseline))
    assert worst < 0.5, worst


def test_consumer_that_stops_reading_is_flow_controlled():
    body = b"m" * (64 * 1024)
    total = 800  # 50 MiB
    with ThreadedBroker() as tb:
        setup = connect(tb.port)
        sch = setup.channel()
        sch.queue_declare("stuck-q")
        sch.queue_declare("lively-q")
        # the stuck consumer: subscribes with no_ack (nothing holds deliveries back but the socket)
        # and a small receive buffer, then never reads again
        stuck = Raw(tb.port, handshake=False)
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stuck.handshake()
        stuck.send(commands.Channel.Open(), 1)
        stuck.expect(commands.Channel.OpenOk)
        stuck.send(commands.Basic.Consume(queue="stuck-q", consumer_tag="stuck", no_ack=True), 1)
        stuck.expect(commands.Basic.ConsumeOk)
        stuck_port = stuck.sock.getsockname()[1]
        # a lively consumer on another queue, receiving throughout
        lively_got = []
        stop = threading.Event()

        def lively():
            conn = connect(tb.port)
            ch = conn.channel()
            ch.basic_consume("lively-q", lambda c, m, p, b: lively_got.append(time.perf_counter()),
                             auto_ack=True)
            while not stop.is_set():
                conn.process_data_events(0.01)
            conn.close()

        t = threading.Thread(target=lively)
        t.start()
        producer = connect(tb.port)
        pch = producer.channel()
        peak = 0
        sent_at = []
        for i in range(total):
            pch.basic_publish("", "stuck-q", body)
            if i % 20 == 0:
                sent_at.append(time.perf_counter())
                pch.basic_publish("", "lively-q", b"ping")
            if i % 100 == 0:
                peak = max(peak, write_buffers(tb).get(stuck_port, 0))
        pch.basic_publish("", "lively-q", b"ping")
        sent_at.append(time.perf_counter())
        assert wait_for(lambda: len(lively_got) == len(sent_at), timeout=10)
        stop.set()
        t.join(10)
        peak = max(peak, write_buffers(tb).get(stuck_port, 0))
        ready = sch.queue_declare("stuck-q", passive=True).method.message_count
        paused = tb.call(lambda: [p.session.paused for p in tb.server.protocols
                                  if p.session.peer[1] == stuck_port])
        # bounded: the stuck connection's buffer never passed the high-water mark (+ one flush),
        # deliveries stopped (flow control), and the rest of the 50 MiB waits in the queue
        assert peak <= BUFFER_BOUND, peak
        assert paused == [True]
        delivered = total - ready
        assert delivered * len(body) < BUFFER_BOUND + 16 * 1024 * 1024, delivered  # + kernel buffers
        assert ready > total // 2
        # the lively consumer's pings kept arriving while the producer pushed 50 MiB
        delays = [g - s for s, g in zip(sent_at, lively_got)]
        assert max(delays) < 2.0, max(delays)
        # the stuck client goes away: the broker lets go of its buffer, the queue serves others
        stuck.close()
        assert wait_for(lambda: stuck_port not in write_buffers(tb), timeout=10)
        drained = 0
        while True:
            method, _p, b = pch.basic_get("stuck-q", auto_ack=True)
            if method is None:
                break
            drained += 1
        assert drained == ready
        close_quietly(producer, setup)


def test_client_flooding_requests_without_reading_is_not_read_either():
    """Replies to a client that does not read back up; the broker then stops reading it, so they
    cannot pile up without bound (the client's own sends block, as TCP flow control intends)."""
    name = "q" * 255
    with ThreadedBroker() as tb:
        setup = connect(tb.port)
        setup.channel().queue_declare(name)
        flood = Raw(tb.port, handshake=False)
        flood.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        flood.handshake()
        flood.send(commands.Channel.Open(), 1)
        flood.expect(commands.Channel.OpenOk)
        flood_port = flood.sock.getsockname()[1]
        request = pframe.marshal(commands.Queue.Declare(queue=name, passive=True), 1)
        chunk = request * 2000  # ~0.5 MB of requests, each answered by ~280 bytes
        sent = 0
        flood.sock.settimeout(0.5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                flood.sock.sendall(chunk)
                sent += len(chunk)
            except socket.timeout:
                break  # the broker stopped reading us
        assert time.monotonic() < deadline, "the broker kept reading a client that never reads"
        buffered = write_buffers(tb).get(flood_port, 0)
        reading = tb.call(lambda: [p.session.reading for p in tb.server.protocols
                                   if p.session.peer[1] == flood_port])
        assert reading == [False]
        assert buffered <= BUFFER_BOUND, buffered
        roundtrip_ok = connect(tb.port)  # others are served meanwhile
        roundtrip_ok.channel().queue_declare(name, passive=True)
        roundtrip_ok.close()
        flood.close()
        assert wait_for(lambda: flood_port not in write_buffers(tb), timeout=10)
        setup.close()
