"""protocol.names.method: pamqp methods naming queues and exchanges as RabbitMQ allows (any
UTF-8 up to 255 bytes), encoded by the one codec and read back by pamqp's decoder."""

from __future__ import annotations

import pytest
from pamqp import commands
from pamqp import frame as pframe

from exchange_broker.protocol import codec
from exchange_broker.protocol.names import method


def test_names_pamqp_refuses_are_encoded_as_given():
    with pytest.raises(ValueError):
        commands.Queue.Bind(queue="a>b", exchange="x")
    m = method(commands.Queue.Bind, queue="orders > eu (é)", exchange="events!", routing_key="k")
    assert isinstance(m, commands.Queue.Bind) and m.name == "Queue.Bind"
    _n, channel, back = pframe.unmarshal(codec.method_frame(3, m))
    assert (channel, back.queue, back.exchange, back.routing_key) == (3, "orders > eu (é)", "events!", "k")


def test_a_name_longer_than_255_bytes_is_refused():
    method(commands.Queue.Declare, queue="é" * 127)  # 254 bytes
    with pytest.raises(ValueError, match="queue is longer than 255 bytes"):
        method(commands.Queue.Declare, queue="é" * 128)
