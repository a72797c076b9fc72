"""Coverage-guided fuzzing of the broker's input path with atheris (libFuzzer), in-process.

Each input drives a fresh ``Session`` on a shared ``Broker`` (no sockets, no event loop): the
bytes go through ``ServerConnection.receive_data`` (framing, handshake, method decoding) and the
session's method handling (vhost, queues, exchanges, publish/deliver, acks, tx, confirms), fed
in chunks whose sizes the fuzzer also chooses. A crash is any of:

* an exception escaping ``Session.data_received`` / ``connection_lost``;
* an ERROR logged by the broker (the session's last-resort "internal error" handler logs there:
  bad input must be answered with a protocol error, never by a Python exception);
* a session left registered after its connection is gone;
* output that is not a sequence of well-formed AMQP frames.

Run (see benchmarks/README.md)::

    pip install atheris
    python benchmarks/fuzz_atheris.py --make-corpus fuzz-corpus     # seed inputs
    python benchmarks/fuzz_atheris.py fuzz-corpus -max_total_time=300 -rss_limit_mb=4096

Input layout: byte 0 picks the mode, byte 1 the chunk size (1 + 16 * byte). Modes:
0 = a valid handshake is prepended and channel 1 is opened, then the fuzzer's bytes;
1 = the fuzzer's bytes from the very first byte (protocol header, start-ok ...);
2 = the fuzzer's bytes cut into frames: (type, channel, payload) with correct framing, so that
mutations reach the method decoders instead of dying in the framing.
"""

from __future__ import annotations

import logging
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import atheris  # noqa: E402

with atheris.instrument_imports(include=["exchange_broker", "routing", "pamqp"]):
    from pamqp import commands  # noqa: E402
    from pamqp import frame as pframe  # noqa: E402

    from exchange_broker.assembly import make_broker  # noqa: E402
    from exchange_broker.core.broker import Broker  # noqa: E402
    from exchange_broker.core.clock import ManualClock  # noqa: E402
    from exchange_broker.connection.session import Session  # noqa: E402

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HANDSHAKE = (PROTOCOL_HEADER
             + pframe.marshal(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response="\x00guest\x00guest"), 0)
             + pframe.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0)
             + pframe.marshal(commands.Connection.Open(virtual_host="/"), 0)
             + pframe.marshal(commands.Channel.Open(), 1))
RESET_EVERY = 2000  # inputs per Broker (state carries over between sessions, like a real broker)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


ERRORS = _Errors()
for name in ("exchange_broker", "asyncio"):
    logging.getLogger(name).addHandler(ERRORS)
    logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger(name).propagate = False

_state = {"broker": None, "n": 0}


def _broker() -> Broker:
    if _state["broker"] is None or _state["n"] >= RESET_EVERY:
        _state["broker"] = make_broker(clock=ManualClock())  # clock.advance() flushes output
        _state["n"] = 0
    _state["n"] += 1
    return _state["broker"]


def _framed(fdp: "atheris.FuzzedDataProvider") -> bytes:
    out = []
    while fdp.remaining_bytes() > 0:
        ftype = fdp.PickValueInList([1, 1, 1, 2, 3, 8, fdp.ConsumeIntInRange(0, 255)])
        channel = fdp.PickValueInList([0, 1, 1, 2, fdp.ConsumeIntInRange(0, 65535)])
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
        out.append(struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce")
    return b"".join(out)


def _check_output(data: bytes) -> None:
    """Everything the broker writes must be well-formed frames (after the header it may send)."""
    if data.startswith(PROTOCOL_HEADER):
        data = data[8:]
    pos = 0
    while pos < len(data):
        if len(data) - pos < 8:
            raise RuntimeError(f"truncated output frame at {pos}: {data[pos:pos + 16]!r}")
        _t, _ch, size = struct.unpack_from(">BHI", data, pos)
        end = pos + 7 + size
        if end >= len(data) or data[end] != 0xCE:
            raise RuntimeError(f"malformed output frame at {pos}")
        pos = end + 1


def TestOneInput(data: bytes) -> None:
    if len(data) < 2:
        return
    mode = data[0] % 3          # the first two bytes: mode and chunk size (read by hand: the
    step = 1 + data[1] * 16     # FuzzedDataProvider takes integers from the end of the input)
    rest = data[2:]
    if mode == 0:
        stream = HANDSHAKE + rest
    elif mode == 1:
        stream = rest
    else:
        stream = HANDSHAKE + _framed(atheris.FuzzedDataProvider(rest))
    broker = _broker()
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 5555))
    for i in range(0, len(stream), step):
        sess.data_received(stream[i:i + step])
        broker.clock.advance()
        if sess.closed:
            break
    sess.connection_lost()
    broker.clock.advance()
    if ERRORS.records:
        rec = ERRORS.records[0]
        ERRORS.records.clear()
        text = rec.getMessage()
        if rec.exc_info:
            text += "\n" + logging.Formatter().formatException(rec.exc_info)
        raise RuntimeError(f"broker logged an error: {text}")
    if sess in broker.sessions:
        raise RuntimeError("session still registered after connection_lost")
    _check_output(b"".join(out))


def make_corpus(directory: str) -> None:
    """Seed inputs: realistic sessions the fuzzer can mutate from."""
    os.makedirs(directory, exist_ok=True)
    C, Q, E, B = commands.Channel, commands.Queue, commands.Exchange, commands.Basic
    from pamqp import body as pbody
    from pamqp import header as pheader

    def m(method, ch=1):
        return pframe.marshal(method, ch)

    def publish(ex, rk, body, props=None, ch=1):
        return (m(B.Publish(exchange=ex, routing_key=rk), ch)
                + m(pheader.ContentHeader(0, len(body), props or commands.Basic.Properties()), ch)
                + (m(pbody.ContentBody(body), ch) if body else b""))

    seeds = {
        "declare_publish_get": m(Q.Declare(queue="q1")) + publish("", "q1", b"hello") + m(B.Get(queue="q1"))
        + m(B.Ack(delivery_tag=1)),
        "consume_ack": m(Q.Declare(queue="q2")) + m(B.Qos(prefetch_count=2)) + m(B.Consume(queue="q2"))
        + publish("", "q2", b"a") + publish("", "q2", b"b") + m(B.Ack(delivery_tag=2, multiple=True)),
        "topic_bind": m(E.Declare(exchange="t", exchange_type="topic")) + m(Q.Declare(queue="", exclusive=True))
        + m(Q.Bind(queue="", exchange="t", routing_key="a.#")) + publish("t", "a.b", b"x"),
        "headers": m(Q.Declare(queue="h")) + m(Q.Bind(queue="h", exchange="amq.headers",
                                                      arguments={"x-match": "any", "k": "v"}))
        + publish("amq.headers", "", b"x", commands.Basic.Properties(headers={"k": "v", "CC": ["h"]})),
        "dlx_ttl": m(Q.Declare(queue="d", arguments={"x-message-ttl": 0, "x-dead-letter-exchange": "amq.fanout"}))
        + publish("", "d", b"x", commands.Basic.Properties(expiration="0")),
        "confirm_tx": m(commands.Confirm.Select()) + publish("", "nowhere", b"x") + m(C.Open(), 2)
        + m(commands.Tx.Select(), 2) + publish("", "q1", b"y", ch=2) + m(commands.Tx.Commit(), 2),
        "reject_recover": m(Q.Declare(queue="r")) + publish("", "r", b"x") + m(B.Consume(queue="r"))
        + m(B.Reject(delivery_tag=1, requeue=True)) + m(B.Recover(requeue=True)) + m(B.Nack(delivery_tag=2)),
        "close": m(C.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)) + m(C.CloseOk())
        + m(commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0), 0),
        "delayed_stream": m(E.Declare(exchange="dl", exchange_type="x-delayed-message",
                                      arguments={"x-delayed-type": "direct"}))
        + m(Q.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"}))
        + m(B.Qos(prefetch_count=10)) + m(B.Consume(queue="s", arguments={"x-stream-offset": "first"})),
    }
    for name, body in seeds.items():
        for mode in (0, 2):
            with open(os.path.join(directory, f"{name}-{mode}"), "wb") as fh:
                fh.write(bytes([mode, 0x10]) + body)
        with open(os.path.join(directory, f"{name}-raw"), "wb") as fh:
            fh.write(bytes([1, 0x10]) + HANDSHAKE + body)
    print(f"wrote {3 * len(seeds)} seeds to {directory}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(sys.argv[2])
        sys.exit(0)
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
