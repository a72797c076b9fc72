"""AMQP 0-8 as RabbitMQ 3.x serves it (protocol/amqp_0_8.py), sans-IO: the differences from 0-9-1
that Mono's RabbitMQ.Client and other 0-8 clients see, checked byte for byte against what
RabbitMQ 3.10 sent to the same frames. A real 0-8 client: tests/interop/test_other_languages.py."""

from __future__ import annotations

import struct

import pytest
from pamqp import decode as pdecode

from exchange_broker.protocol import events as ev
from test_connection_sansio import new_conn, raw_frame


def sstr(value: bytes) -> bytes:
    return bytes([len(value)]) + value


def method(channel: int, class_id: int, method_id: int, fields: bytes = b"") -> bytes:
    return raw_frame(1, channel, struct.pack(">HH", class_id, method_id) + fields)


def frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while data:
        _, channel, size = struct.unpack_from(">BHI", data)
        out.append((channel, data[7:7 + size]))
        data = data[8 + size:]
    return out


def opened(header: bytes = b"AMQP\x01\x01\x08\x00"):
    conn, _ = new_conn()
    conn.receive_data(header)
    [(_, start)] = frames(conn.data_to_send())
    conn.receive_data(method(0, 10, 11, struct.pack(">I", 0) + sstr(b"PLAIN") +
                             struct.pack(">I", 12) + b"\0guest\0guest" + sstr(b"en_US")))
    conn.receive_data(method(0, 10, 31, struct.pack(">HIH", 2047, 131072, 60)))
    events = conn.receive_data(method(0, 10, 40, sstr(b"/") + sstr(b"") + b"\0"))
    assert [type(e) for e in events] == [ev.Opened]
    conn.data_to_send()
    return conn, start


@pytest.mark.parametrize("header", [b"AMQP\x01\x01\x08\x00", b"AMQP\x01\x01\x09\x01"])
def test_0_8_headers_get_connection_start_8_0_without_capabilities(header):
    conn, start = opened(header)
    assert start[:6] == struct.pack(">HHBB", 10, 10, 8, 0)
    properties = pdecode.field_table(start[6:])[1]
    assert properties["capabilities"] == {} and properties["product"] == "exchange-broker"
    assert conn.amqp_0_8


def test_channel_open_ok_has_no_fields_and_access_request_gets_ticket_1():
    conn, _ = opened()
    assert [type(e) for e in conn.receive_data(method(1, 20, 10, sstr(b"")))] == [ev.ChannelOpened]
    assert frames(conn.data_to_send()) == [(1, struct.pack(">HH", 20, 11))]
    assert conn.receive_data(method(1, 30, 10, sstr(b"/data") + b"\x1e")) == []
    assert frames(conn.data_to_send()) == [(1, struct.pack(">HHH", 30, 11, 1))]


def open_channel(conn) -> None:
    conn.receive_data(method(1, 20, 10, sstr(b"")))
    conn.data_to_send()


def test_basic_consume_without_arguments_table_is_a_consume():
    conn, _ = opened()
    open_channel(conn)
    [event] = conn.receive_data(method(1, 60, 20, struct.pack(">H", 1) + sstr(b"q08") + sstr(b"ctag") + b"\x02"))
    assert type(event) is ev.Method
    consume = event.method
    assert (consume.queue, consume.consumer_tag, consume.no_ack, consume.arguments) == ("q08", "ctag", True, {})


def test_connection_close_and_close_ok_are_numbered_60_and_61():
    conn, _ = opened()
    events = conn.receive_data(method(0, 10, 60, struct.pack(">H", 200) + sstr(b"Goodbye") + struct.pack(">HH", 0, 0)))
    assert [type(e) for e in events] == [ev.Closing, ev.Closed]
    assert frames(events[0].reply) == [(0, struct.pack(">HH", 10, 61))]


@pytest.mark.parametrize("class_id, method_id, fields, name", [
    (85, 10, b"\0", "confirm.select"),
    (40, 30, struct.pack(">H", 0) + sstr(b"a") + sstr(b"b") + sstr(b"k") + b"\0" + struct.pack(">I", 0), "exchange.bind"),
    (60, 120, struct.pack(">Q", 1) + b"\0", "basic.nack"),
])
def test_0_9_1_extensions_close_the_connection_with_540(class_id, method_id, fields, name):
    conn, _ = opened()
    open_channel(conn)
    events = conn.receive_data(method(1, class_id, method_id, fields))
    assert [type(e) for e in events] == [ev.Closing] and events[0].code == 540
    [(channel, close)] = frames(conn.data_to_send())
    assert channel == 0 and close[:6] == struct.pack(">HHH", 10, 60, 540)  # 0-8's connection.close
    assert f"{name} is not part of AMQP 0-8".encode() in close
    # the client's close-ok (0-8's 61) ends the connection
    assert [type(e) for e in conn.receive_data(method(0, 10, 61))] == [ev.Closed]


def test_0_9_1_clients_are_unchanged():
    conn, start = opened(b"AMQP\x00\x00\x09\x01")
    assert start[4:6] == b"\x00\x09" and not conn.amqp_0_8
    assert pdecode.field_table(start[6:])[1]["capabilities"]["publisher_confirms"] is True
    open_channel(conn)
    events = conn.receive_data(method(1, 85, 10, b"\0"))
    assert type(events[0]) is ev.Method  # confirm.select goes up to the channel
