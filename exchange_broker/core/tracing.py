"""The firehose (RabbitMQ's rabbit_trace): with tracing on in a vhost, every message published in it
and every message delivered from it is copied to the vhost's internal topic exchange
``amq.rabbitmq.trace``:

* routing key ``publish.<exchange>`` for a publish (``publish.`` for the default exchange), with
  the headers ``exchange_name``, ``routing_keys`` (the routing key, then any CC keys),
  ``properties`` (the message's properties as a table), ``node``, ``vhost``, ``connection``,
  ``channel``, ``user`` and ``routed_queues``;
* routing key ``deliver.<queue>`` for a delivery (basic.deliver or basic.get-ok), with
  ``exchange_name``, ``routing_keys``, ``properties``, ``node``, ``redelivered`` (0 or 1),
  ``vhost``, ``connection``, ``channel`` and ``user``.

The copy has the original body and only those headers as properties, and is routed at most once
(no confirms, no flow control), as RabbitMQ does; messages of ``amq.rabbitmq.trace`` itself are
never traced again. Tracing is switched per vhost (``PUT /api/vhosts/{name}`` with ``tracing``,
``exchange-broker admin trace on|off``) and, as RabbitMQ's ``trace_on``, not kept over a restart.
"""
from __future__ import annotations

import datetime

from exchange_broker.core.message import Message
from exchange_broker.protocol import codec

TRACE_EXCHANGE = "amq.rabbitmq.trace"
NODE = "exchange-broker@localhost"
_PROPERTY_NAMES = {"message_type": "type"}  # pamqp's name -> AMQP's (RabbitMQ's P_basic field)


def _properties_table(props: dict) -> dict:
    out = {}
    for name, value in props.items():
        if isinstance(value, datetime.datetime):
            value = int(value.timestamp())
        out[_PROPERTY_NAMES.get(name, name)] = value
    return out


def _routing_keys(msg: Message) -> list:
    keys = [msg.routing_key]
    cc = (msg.headers or {}).get("CC")
    if isinstance(cc, list):
        keys += [k.decode("utf-8", "replace") if isinstance(k, bytes) else k for k in cc
                 if isinstance(k, (str, bytes))]
    return keys


def _emit(broker, vhost, key: str, msg: Message, extra: dict) -> None:
    ex = vhost.exchanges.get(TRACE_EXCHANGE)
    if ex is None:
        return
    headers = {"exchange_name": msg.exchange, "routing_keys": _routing_keys(msg),
               "properties": _properties_table(msg.props), "node": NODE, **extra}
    copy = Message(TRACE_EXCHANGE, key, codec.encode_properties({"headers": headers}), msg.body)
    queues = vhost.route(ex, key, None)
    if queues:
        broker.enqueue(queues, copy)


def tap_in(broker, vhost, msg: Message, queues: list, connection, channel: int) -> None:
    """A publish in a traced vhost (``queues``: the queues it was routed to)."""
    if msg.exchange == TRACE_EXCHANGE:
        return
    _emit(broker, vhost, f"publish.{msg.exchange}", msg, {
        "vhost": vhost.name, "connection": getattr(connection, "name", ""), "channel": channel,
        "user": getattr(connection, "user", "") or "", "routed_queues": [q.name for q in queues]})


def tap_out(broker, vhost, msg: Message, connection, channel: int) -> None:
    """A delivery from a traced vhost."""
    if msg.exchange == TRACE_EXCHANGE or msg.queue is None:
        return
    _emit(broker, vhost, f"deliver.{msg.queue.name}", msg, {
        "redelivered": 1 if msg.redelivered else 0, "vhost": vhost.name,
        "connection": getattr(connection, "name", ""), "channel": channel,
        "user": getattr(connection, "user", "") or ""})
