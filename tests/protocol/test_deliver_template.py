"""``codec.deliver_template``: the frames of a delivery made from a run's template are, byte for
byte, those ``deliver_frames`` makes (and pamqp reads them back as the same delivery)."""

from __future__ import annotations

import pytest
from pamqp import commands, frame as pframe

from exchange_broker.protocol import codec


@pytest.mark.parametrize("redelivered", [False, True])
@pytest.mark.parametrize("tag", [1, 255, 2 ** 32 + 7, 2 ** 63 - 1])
def test_template_frames_equal_the_whole_frames(redelivered, tag):
    ctag, ex, rk = codec.short_str("ctag-1"), codec.short_str("amq.topic"), codec.short_str("a.b.c")
    props = codec.encode_properties({"delivery_mode": 2, "headers": {"k": "v"}})
    body = b"payload" * 9
    before, after = codec.deliver_template(7, ctag, redelivered, ex, rk, props, len(body), 131072)
    made = before + tag.to_bytes(8, "big") + after + body + codec.FRAME_END_BYTE
    whole = b"".join(codec.deliver_frames(7, ctag, tag, redelivered, ex, rk, props, body, 131072))
    assert made == whole
    n, channel, deliver = pframe.unmarshal(made)
    assert channel == 7 and isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.delivery_tag, deliver.redelivered, deliver.exchange, deliver.routing_key) == \
        (tag, redelivered, "amq.topic", "a.b.c")


def test_no_template_for_an_empty_body_or_one_over_a_frame():
    args = (1, codec.short_str("c"), False, b"\x00", codec.short_str("q"), b"\x00\x00")
    assert codec.deliver_template(*args, 0, 4096) is None
    assert codec.deliver_template(*args, 4096 - 7, 4096) is None
    assert codec.deliver_template(*args, 4096 - 8, 4096) is not None


@pytest.mark.parametrize("offset", [0, 1, 2 ** 40 + 3])
@pytest.mark.parametrize("published", [{}, {"delivery_mode": 2, "headers": {"k": "v"}},
                                       {"content_type": "text/plain", "priority": 3}])
def test_holed_template_frames_equal_a_stream_deliverys_whole_frames(offset, published):
    """A stream's delivery: its properties are a template around its offset (x-stream-offset)."""
    from exchange_broker.queue_types.stream_delivery import _delivery

    ctag, ex, rk = codec.short_str("ctag-2"), codec.short_str(""), codec.short_str("s")
    body = b"x" * 100
    raw = codec.encode_properties(published)
    msg = _delivery("", "s", raw, body, offset, 0, None)
    head, tail = msg.props_shape
    before, middle, after = codec.deliver_template_holed(3, ctag, False, ex, rk, head, tail,
                                                         len(body), 131072)
    made = before + (5).to_bytes(8, "big") + middle + offset.to_bytes(8, "big") + after + body + \
        codec.FRAME_END_BYTE
    whole = b"".join(codec.deliver_frames(3, ctag, 5, False, ex, rk, msg.properties, body, 131072))
    assert made == whole
    props = codec.parse_properties(msg.properties)
    assert props["headers"]["x-stream-offset"] == offset
    assert {k: v for k, v in props.items() if k != "headers"} == \
        {k: v for k, v in codec.parse_properties(raw).items() if k != "headers"}
