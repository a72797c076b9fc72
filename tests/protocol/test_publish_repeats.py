"""A publisher repeating the same publish (method, content header, body size) is read by the
connection's shortest path: the frames up to the body are known byte for byte from the last whole
publish. Each repeat is still checked as any frame is: its frame end, its channel still open and
idle, input cut anywhere."""

from __future__ import annotations

from pamqp import commands

from exchange_broker.protocol import events as ev
from test_connection_sansio import m, opened, publish_frames, sent


def bodies(events: list) -> list:
    out = []
    for e in events:
        if type(e) in (ev.Publish, ev.Publishes):
            out += [(p.channel, p.body) for p in (e.items if type(e) is ev.Publishes else [e])]
    return out


def test_repeats_across_reads_and_cut_anywhere():
    conn = opened()
    frames = [publish_frames(1, bytes([65 + i]) * 8, routing_key="k") for i in range(6)]
    data = b"".join(frames)
    got = []
    for cut in (5, 30, len(frames[0]) + 3, len(data) - 1, len(data)):
        got += bodies(conn.receive_data(data[:cut]))
        data = data[cut:]
        if not data:
            break
    got += bodies(conn.receive_data(data))
    assert got == [(1, bytes([65 + i]) * 8) for i in range(6)]
    [p] = conn.receive_data(frames[0])
    assert (p.exchange, p.routing_key, p.mandatory, p.quick[0]) == ("", "k", False, 0)


def test_a_repeat_with_a_bad_frame_end_is_a_frame_error():
    conn = opened()
    one = publish_frames(1, b"x" * 8)
    assert bodies(conn.receive_data(one)) == [(1, b"x" * 8)]
    events = conn.receive_data(one[:-1] + b"\x00")
    assert events == [ev.Closing(501, "invalid frame end byte 0x00", False)]


def test_a_repeat_on_a_closed_channel_is_a_channel_error():
    conn = opened(channels=(1, 2))
    one = publish_frames(1, b"x" * 8)
    assert bodies(conn.receive_data(one + one)) == [(1, b"x" * 8)] * 2
    assert conn.receive_data(m(commands.Channel.Close(200, "bye", 0, 0), 1)) == [ev.ChannelClosed(1)]
    sent(conn)
    events = conn.receive_data(one)
    closing = [e for e in events if type(e) is ev.Closing]
    assert closing and closing[0].code == 504 and "channel.open" in closing[0].text
    assert not bodies(events)


def test_a_repeat_after_a_publish_on_another_channel_keeps_each_on_its_channel():
    conn = opened(channels=(1, 2))
    a, b = publish_frames(1, b"a" * 4), publish_frames(2, b"b" * 4)
    assert bodies(conn.receive_data(a + a + b + a + b + b)) == \
        [(1, b"a" * 4)] * 2 + [(2, b"b" * 4), (1, b"a" * 4)] + [(2, b"b" * 4)] * 2
