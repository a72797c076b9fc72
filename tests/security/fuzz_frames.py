"""Hypothesis strategies for hostile AMQP input: frames, methods, field tables, sequences.

Everything here produces *bytes a client could send*: well-formed frames carrying random or
corrupted payloads, truncated frames, frames claiming huge sizes, invalid field tables inside
otherwise valid methods and content headers, and random sequences of real methods (on random
channels, in any order, without waiting for replies).
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands
from pamqp import encode as pencode
from pamqp import frame as pframe
from pamqp import header as pheader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
METHOD_IDS = sorted(commands.INDEX_MAPPING)


def frame(ftype: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def shortstr(s: str | bytes) -> bytes:
    raw = s.encode("utf-8") if isinstance(s, str) else s
    return bytes((len(raw) & 0xFF,)) + raw[:255]


def method_frame(method, channel: int) -> bytes:
    return pframe.marshal(method, channel)


# -- field tables --------------------------------------------------------------------------------------

field_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-2 ** 31, 2 ** 31 - 1), st.text(max_size=10),
              st.floats(allow_nan=False, allow_infinity=False), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3)),
    max_leaves=8)
tables = st.dictionaries(st.text(min_size=1, max_size=8), field_values, max_size=4)


def encode_table(table: dict) -> bytes:
    try:
        return pencode.field_table(table)
    except Exception:  # pamqp refuses a few values (e.g. floats it cannot place): an empty table
        return b"\x00\x00\x00\x00"


def deep_table(depth: int) -> bytes:
    """{"a": {"a": {... depth levels ...}}}: deeper than Python's recursion limit."""
    inner = b"\x00\x00\x00\x00"
    for _ in range(depth):
        entry = b"\x01aF" + inner
        inner = struct.pack(">I", len(entry)) + entry
    return inner


@st.composite
def bad_tables(draw) -> bytes:
    """A field table encoding that is broken in one of many ways (or, rarely, fine)."""
    raw = bytearray(encode_table(draw(tables)))
    how = draw(st.sampled_from(["truncate", "flip", "type", "length", "huge-length", "deep",
                                "bad-utf8-key", "huge-array", "timestamp", "decimal", "trailing"]))
    if how == "truncate" and len(raw) > 4:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif how == "flip" and len(raw) > 4:
        i = draw(st.integers(4, len(raw) - 1))
        raw[i] ^= draw(st.integers(1, 255))
    elif how == "type":
        body = b"\x01k" + bytes([draw(st.integers(0, 255))]) + draw(st.binary(max_size=12))
        raw = bytearray(struct.pack(">I", len(body)) + body)
    elif how == "length":
        raw[0:4] = struct.pack(">I", draw(st.integers(0, 1 << 16)))
    elif how == "huge-length":
        raw[0:4] = struct.pack(">I", draw(st.sampled_from([0x7FFFFFFF, 0xFFFFFFFF, 1 << 30])))
    elif how == "deep":
        raw = bytearray(deep_table(draw(st.sampled_from([50, 900, 1100, 3000]))))
    elif how == "bad-utf8-key":
        body = b"\x02\xff\xfe" + b"t\x01"
        raw = bytearray(struct.pack(">I", len(body)) + body)
    elif how == "huge-array":
        body = b"\x01kA" + struct.pack(">I", draw(st.sampled_from([0xFFFFFFF0, 1 << 20, 5]))) + b"I\x00"
        raw = bytearray(struct.pack(">I", len(body)) + body)
    elif how == "timestamp":  # datetimes out of any calendar
        body = b"\x01kT" + struct.pack(">Q", draw(st.sampled_from([2 ** 64 - 1, 2 ** 63, 10 ** 15])))
        raw = bytearray(struct.pack(">I", len(body)) + body)
    elif how == "decimal":
        body = b"\x01kD" + bytes([draw(st.integers(0, 255))]) + struct.pack(">i", -1)
        raw = bytearray(struct.pack(">I", len(body)) + body)
    elif how == "trailing":
        raw += draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


# -- methods carrying a (bad) table ----------------------------------------------------------------------

NAMES = st.sampled_from(["", "q1", "q2", "x1", "amq.direct", "amq.topic", "amq.gen-abc", "é", "a" * 255])


@st.composite
def table_methods(draw, channel: int = 1) -> bytes:
    table = draw(bad_tables())
    name = draw(NAMES)
    kind = draw(st.sampled_from(["queue.declare", "exchange.declare", "queue.bind", "basic.consume",
                                 "exchange.bind", "queue.unbind", "headers-property"]))
    bits = bytes([draw(st.integers(0, 255))])
    if kind == "queue.declare":
        payload = struct.pack(">HHH", 50, 10, 0) + shortstr(name) + bits + table
    elif kind == "exchange.declare":
        payload = struct.pack(">HHH", 40, 10, 0) + shortstr(name) + shortstr(
            draw(st.sampled_from(["direct", "topic", "headers", "fanout", "x-delayed-message", "nope"]))) + bits + table
    elif kind == "queue.bind":
        payload = struct.pack(">HHH", 50, 20, 0) + shortstr(name) + shortstr("amq.headers") + shortstr("k") + bits + table
    elif kind == "queue.unbind":
        payload = struct.pack(">HHH", 50, 50, 0) + shortstr(name) + shortstr("amq.headers") + shortstr("k") + table
    elif kind == "exchange.bind":
        payload = struct.pack(">HHH", 40, 30, 0) + shortstr("amq.fanout") + shortstr("amq.headers") + \
            shortstr("k") + bits + table
    elif kind == "basic.consume":
        payload = struct.pack(">HHH", 60, 20, 0) + shortstr(name) + shortstr("") + bits + table
    else:  # a publish whose content header carries a bad headers table (to a headers exchange)
        exchange = draw(st.sampled_from(["amq.headers", "amq.direct", "", "amq.fanout"]))
        publish = method_frame(commands.Basic.Publish(exchange=exchange, routing_key="q1"), channel)
        props = struct.pack(">H", 0x2000) + table
        header = frame(2, channel, struct.pack(">HHQ", 60, 0, 3) + props)
        return publish + header + frame(3, channel, b"abc")
    return frame(1, channel, payload)


# -- real methods, in random order ---------------------------------------------------------------------

tags = st.integers(0, 5)


def _publish(exchange: str, rk: str, body: bytes, channel: int, props: commands.Basic.Properties,
             size_delta: int = 0) -> bytes:
    out = method_frame(commands.Basic.Publish(exchange=exchange, routing_key=rk), channel)
    out += method_frame(pheader.ContentHeader(0, max(0, len(body) + size_delta), props), channel)
    if body:
        out += method_frame(pbody.ContentBody(body), channel)
    return out


properties = st.builds(
    commands.Basic.Properties,
    delivery_mode=st.sampled_from([None, 1, 2]),
    priority=st.sampled_from([None, 0, 9, 255]),
    expiration=st.sampled_from([None, "0", "10", "-1", "abc", "99999999999999999999"]),
    headers=st.one_of(st.none(), st.sampled_from([{"x-delay": 10}, {"x-delay": -5}, {"CC": ["q1", "q2"]},
                                                  {"BCC": ["q2"]}, {"x-match": "any", "a": 1}])),
    message_id=st.sampled_from([None, "m1"]),
    reply_to=st.sampled_from([None, "amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.bogus"]))


def _args():
    return st.sampled_from([None, {"x-message-ttl": 5}, {"x-max-length": 1, "x-overflow": "reject-publish"},
                            {"x-dead-letter-exchange": "amq.fanout"}, {"x-max-priority": 5},
                            {"x-queue-type": "stream"}, {"x-queue-type": "bogus"}, {"x-expires": 1},
                            {"x-single-active-consumer": True}, {"x-message-ttl": "bad"},
                            {"x-delayed-type": "direct"}, {"alternate-exchange": "amq.fanout"},
                            # argument values of unexpected AMQP types
                            {"x-queue-type": bytearray(b"classic")}, {"x-queue-type": {"a": 1}},
                            {"x-queue-type": ["stream"]}, {"x-max-length": "10"}, {"x-message-ttl": 1.5},
                            {"x-dead-letter-exchange": 5}, {"x-expires": -1}, {"x-max-priority": 100000},
                            {"alternate-exchange": bytearray(b"amq.fanout")}, {"x-overflow": ["drop-head"]},
                            {"x-delayed-type": {"t": "direct"}}, {"x-max-age": "1Y"}, {"x-max-age": b"\xff"}])


@st.composite
def one_method(draw) -> bytes:
    ch = draw(st.sampled_from([1, 1, 1, 2, 3, 0]))
    name = draw(st.sampled_from(["q1", "q2", "", "amq.rabbitmq.reply-to", "amq.q"]))
    xname = draw(st.sampled_from(["x1", "amq.direct", "", "amq.headers", "dx"]))
    kind = draw(st.integers(0, 26))
    C, Q, E, B = commands.Channel, commands.Queue, commands.Exchange, commands.Basic
    if kind == 0:
        m = C.Open()
    elif kind == 1:
        m = C.Close(reply_code=200, reply_text="bye")
    elif kind == 2:
        m = C.CloseOk()
    elif kind == 3:
        m = C.Flow(active=draw(st.booleans()))
    elif kind == 4:
        m = Q.Declare(queue=name, passive=draw(st.booleans()), durable=draw(st.booleans()),
                      exclusive=draw(st.booleans()), auto_delete=draw(st.booleans()),
                      nowait=draw(st.booleans()), arguments=draw(_args()))
    elif kind == 5:
        m = E.Declare(exchange=xname, exchange_type=draw(st.sampled_from(
            ["direct", "fanout", "topic", "headers", "x-delayed-message", "weird"])),
            passive=draw(st.booleans()), durable=draw(st.booleans()), auto_delete=draw(st.booleans()),
            internal=draw(st.booleans()), nowait=draw(st.booleans()), arguments=draw(_args()))
    elif kind == 6:
        m = Q.Bind(queue=name, exchange=xname, routing_key=draw(st.sampled_from(["", "k", "#"])),
                   nowait=draw(st.booleans()), arguments=draw(st.sampled_from([None, {"x-match": "all"}, {"x-match": 1}])))
    elif kind == 7:
        m = Q.Unbind(queue=name, exchange=xname, routing_key="k")
    elif kind == 8:
        m = Q.Purge(queue=name, nowait=draw(st.booleans()))
    elif kind == 9:
        m = Q.Delete(queue=name, if_unused=draw(st.booleans()), if_empty=draw(st.booleans()),
                     nowait=draw(st.booleans()))
    elif kind == 10:
        m = E.Delete(exchange=xname, if_unused=draw(st.booleans()))
    elif kind == 11:
        m = E.Bind(destination=xname, source=draw(st.sampled_from(["amq.fanout", "x1", ""])), routing_key="k")
    elif kind == 12:
        m = E.Unbind(destination=xname, source="amq.fanout", routing_key="k")
    elif kind == 13:
        m = B.Qos(prefetch_count=draw(st.integers(0, 3)), global_=draw(st.booleans()),
                  prefetch_size=draw(st.sampled_from([0, 0, 10])))
    elif kind == 14:
        m = B.Consume(queue=name, consumer_tag=draw(st.sampled_from(["", "c1", "c1", "c2"])),
                      no_ack=draw(st.booleans()), exclusive=draw(st.booleans()), nowait=draw(st.booleans()),
                      arguments=draw(st.sampled_from([None, {"x-priority": 5}, {"x-stream-offset": "first"},
                                                      {"x-priority": "bad"}])))
    elif kind == 15:
        m = B.Cancel(consumer_tag=draw(st.sampled_from(["c1", "c2", "nope"])), nowait=draw(st.booleans()))
    elif kind == 16:
        m = B.Get(queue=name, no_ack=draw(st.booleans()))
    elif kind == 17:
        m = B.Ack(delivery_tag=draw(tags), multiple=draw(st.booleans()))
    elif kind == 18:
        m = B.Nack(delivery_tag=draw(tags), multiple=draw(st.booleans()), requeue=draw(st.booleans()))
    elif kind == 19:
        m = B.Reject(delivery_tag=draw(tags), requeue=draw(st.booleans()))
    elif kind == 20:
        m = B.Recover(requeue=draw(st.booleans()))
    elif kind == 21:
        m = commands.Confirm.Select(nowait=draw(st.booleans()))
    elif kind == 22:
        m = draw(st.sampled_from([commands.Tx.Select(), commands.Tx.Commit(), commands.Tx.Rollback()]))
    elif kind == 23:  # a whole message (or one whose body does not match its declared size)
        body = draw(st.binary(max_size=40))
        return _publish(xname if draw(st.booleans()) else "", draw(st.sampled_from(["q1", "q2", "k", "amq.rabbitmq.reply-to"])),
                        body, ch, draw(properties), draw(st.sampled_from([0, 0, 0, 1, -1])))
    elif kind == 24:  # half a message: method, maybe a header, then something else entirely
        out = method_frame(B.Publish(exchange="", routing_key="q1"), ch)
        if draw(st.booleans()):
            out += method_frame(pheader.ContentHeader(0, 10, commands.Basic.Properties()), ch)
        return out
    elif kind == 25:  # server-only and connection-class methods from the client
        m = draw(st.sampled_from([B.Deliver("c", 1, False, "", "k"), Q.DeclareOk("q", 0, 0),
                                  commands.Connection.Open(), commands.Connection.Tune(),
                                  commands.Connection.UpdateSecret(new_secret="x", reason="r"),
                                  commands.Connection.Blocked(reason="r"), B.GetEmpty(), B.QosOk()]))
    else:
        return frame(8, ch, b"")  # a heartbeat, on the wrong channel unless ch == 0
    try:
        return method_frame(m, ch)
    except Exception:  # pamqp refuses to marshal some arguments: send a bare heartbeat instead
        return frame(8, 0, b"")


odd_names = st.one_of(st.text(max_size=30), st.sampled_from(["q!", "é" * 127, "a b", "x\u2028y", "\U0001f600" * 63]))
EMPTY_TABLE = b"\x00\x00\x00\x00"


@st.composite
def named_method(draw) -> bytes:
    """Methods carrying arbitrary (valid UTF-8) names, encoded by hand: pamqp's own checks
    would refuse many names RabbitMQ accepts, and the broker must cope with all of them."""
    name = draw(odd_names).encode("utf-8")[:255].decode("utf-8", "ignore")
    ch = draw(st.sampled_from([1, 1, 2]))
    bits = bytes([draw(st.sampled_from([0, 0, 2, 8, 16]))])
    kind = draw(st.sampled_from(["qdeclare", "xdeclare", "consume", "bind", "qdelete", "get", "purge",
                                 "xdelete", "publish"]))
    if kind == "qdeclare":
        payload = struct.pack(">HHH", 50, 10, 0) + shortstr(name) + bits + EMPTY_TABLE
    elif kind == "xdeclare":
        payload = struct.pack(">HHH", 40, 10, 0) + shortstr(name) + shortstr("fanout") + bits + EMPTY_TABLE
    elif kind == "consume":
        payload = struct.pack(">HHH", 60, 20, 0) + shortstr(name) + shortstr(name) + bits + EMPTY_TABLE
    elif kind == "bind":
        payload = struct.pack(">HHH", 50, 20, 0) + shortstr(name) + shortstr(name) + shortstr(name) + b"\x00" + EMPTY_TABLE
    elif kind == "qdelete":
        payload = struct.pack(">HHH", 50, 40, 0) + shortstr(name) + b"\x00"
    elif kind == "get":
        payload = struct.pack(">HHH", 60, 70, 0) + shortstr(name) + b"\x00"
    elif kind == "purge":
        payload = struct.pack(">HHH", 50, 30, 0) + shortstr(name) + b"\x00"
    elif kind == "xdelete":
        payload = struct.pack(">HHH", 40, 20, 0) + shortstr(name) + b"\x00"
    else:
        payload = struct.pack(">HHH", 60, 40, 0) + shortstr(name) + shortstr(name) + bits[:1]
        return frame(1, ch, payload) + frame(2, ch, struct.pack(">HHQH", 60, 0, 1, 0)) + frame(3, ch, b"x")
    return frame(1, ch, payload)


method_sequences = st.lists(st.one_of(one_method(), named_method()), min_size=1, max_size=25)


# -- frame-level damage ----------------------------------------------------------------------------------

@st.composite
def damaged_frames(draw) -> bytes:
    how = draw(st.sampled_from(["truncated", "huge-size", "bad-end", "bad-type", "random-payload",
                                "random-method-args", "content-without-method", "oversize-body",
                                "zero-channel-content", "big-channel"]))
    ch = draw(st.sampled_from([0, 1, 2, 65535]))
    if how == "truncated":  # claims more than it sends; the socket is then closed
        full = method_frame(commands.Queue.Declare(queue="q1"), 1)
        return full[:draw(st.integers(1, len(full) - 1))]
    if how == "huge-size":
        return struct.pack(">BHI", draw(st.sampled_from([1, 2, 3])), ch,
                           draw(st.sampled_from([0xFFFFFFFF, 1 << 31, 1 << 24, 131073]))) + b"\x00" * 16
    if how == "bad-end":
        return frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00" * 4, end=bytes([draw(st.integers(0, 0xCD))]))
    if how == "bad-type":
        return frame(draw(st.integers(0, 255)), ch, draw(st.binary(max_size=20)))
    if how == "random-payload":
        return frame(draw(st.sampled_from([1, 2, 3])), ch, draw(st.binary(max_size=64)))
    if how == "random-method-args":
        mid = draw(st.sampled_from(METHOD_IDS))
        return frame(1, ch, struct.pack(">I", mid) + draw(st.binary(max_size=48)))
    if how == "content-without-method":
        return method_frame(pheader.ContentHeader(0, 3, commands.Basic.Properties()), 1) + frame(3, 1, b"abc")
    if how == "oversize-body":  # a content header declaring an enormous body
        size = draw(st.sampled_from([2 ** 64 - 1, 2 ** 40, 128 * 1024 * 1024 + 1]))
        return (method_frame(commands.Basic.Publish(exchange="", routing_key="q1"), 1)
                + frame(2, 1, struct.pack(">HHQH", 60, 0, size, 0)) + frame(3, 1, b"x" * 100))
    if how == "zero-channel-content":
        return frame(2, 0, struct.pack(">HHQH", 60, 0, 1, 0)) + frame(3, 0, b"x")
    return method_frame(commands.Channel.Open(), draw(st.sampled_from([2048, 65535, 4096])))


hostile_chunks = st.lists(st.one_of(one_method(), named_method(), damaged_frames(), table_methods(),
                                    st.binary(min_size=1, max_size=64)), min_size=1, max_size=12)


@st.composite
def pre_handshake(draw) -> list[bytes]:
    """Bytes before or during the handshake: wrong headers, partial headers, bad start-ok."""
    how = draw(st.sampled_from(["garbage", "other-protocol", "partial", "bad-start-ok", "bad-tune-ok",
                                "frames-before-open", "bad-client-properties"]))
    if how == "garbage":
        return [draw(st.binary(min_size=1, max_size=64))]
    if how == "other-protocol":
        return [draw(st.sampled_from([b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x00\x0a", b"GET / HTTP/1.1\r\n\r\n",
                                      b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"AMQP\x03\x01\x00\x00"]))]
    if how == "partial":
        return [PROTOCOL_HEADER[:draw(st.integers(1, 7))]]
    start_ok = method_frame(commands.Connection.StartOk(
        client_properties={"product": "fuzz"}, mechanism=draw(st.sampled_from(["PLAIN", "AMQPLAIN", "EXTERNAL", ""])),
        response=draw(st.sampled_from(["\x00guest\x00guest", "\x00guest\x00bad", "guest", "\x00\x00", "\x00é\x00x"]))), 0)
    if how == "bad-start-ok":
        return [PROTOCOL_HEADER, start_ok]
    if how == "bad-client-properties":
        payload = struct.pack(">HH", 10, 11) + draw(bad_tables()) + shortstr("PLAIN") + \
            struct.pack(">I", 12) + b"\x00guest\x00guest" + shortstr("en_US")
        return [PROTOCOL_HEADER, frame(1, 0, payload)]
    good_start = method_frame(commands.Connection.StartOk(client_properties={}, mechanism="PLAIN",
                                                          response="\x00guest\x00guest"), 0)
    if how == "bad-tune-ok":
        tune = struct.pack(">HHHIH", 10, 31, draw(st.sampled_from([0, 1, 2047, 65535])),
                           draw(st.sampled_from([0, 1, 4095, 4096, 131072, 131073, 2 ** 32 - 1])),
                           draw(st.sampled_from([0, 1, 65535])))
        return [PROTOCOL_HEADER, good_start, frame(1, 0, tune),
                method_frame(commands.Connection.Open(virtual_host=draw(st.sampled_from(["/", "nope", ""]))), 0)]
    return [PROTOCOL_HEADER, good_start] + draw(st.lists(st.one_of(one_method(), damaged_frames()), max_size=4))
