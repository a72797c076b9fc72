"""An MQTT PUBLISH as an AMQP message on ``amq.topic`` and back, as RabbitMQ's MQTT plugin maps
them: QoS 1 messages are persistent, the QoS travels in the ``x-mqtt-publish-qos`` header, and the
MQTT 5 properties map onto AMQP's (content type, correlation id, reply-to, expiration, headers
for user properties). A retained PUBLISH also carries ``x-mqtt-retain: true``, so that a
subscription with MQTT 5's retain-as-published can keep its RETAIN flag (``Publish.retain`` of
:func:`from_amqp`; the session clears it for the other subscriptions)."""

from __future__ import annotations

import time

from exchange_broker.core.message import Message, from_wire
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import topics
from exchange_broker.protocol import codec

QOS_HEADER = "x-mqtt-publish-qos"
DUP_HEADER = "x-mqtt-dup"
RETAIN_HEADER = "x-mqtt-retain"


def _plain_headers(q: int, d: bool, r: bool) -> dict:
    headers = {QOS_HEADER: q, DUP_HEADER: d}
    if r:
        headers[RETAIN_HEADER] = True
    return headers


# the properties of a PUBLISH without MQTT 5 properties, by (QoS, DUP, RETAIN): encoded once
_PLAIN = {(q, d, r): codec.encode_properties({"delivery_mode": 2 if q else 1, "headers": _plain_headers(q, d, r)})
          for q in (0, 1) for d in (False, True) for r in (False, True)}
_PLAIN_QOS = {raw: (q, r) for (q, _d, r), raw in _PLAIN.items()}
_PLAIN_QUICK = {raw: codec.quick_properties(raw) for raw in _PLAIN.values()}  # parsed once, not per publish


def to_amqp(pkt: p.Publish, qos: int) -> Message:
    """The message routed on amq.topic, made by ``message.from_wire`` as every publish path's
    (persistence from the QoS, the per-message TTL from MQTT 5's message expiry)."""
    if not pkt.properties:
        raw = _PLAIN[qos, pkt.dup, pkt.retain]
        return from_wire(topics.EXCHANGE, topics.to_routing_key(pkt.topic), raw, pkt.payload, quick=_PLAIN_QUICK[raw])
    headers: dict = _plain_headers(qos, pkt.dup, pkt.retain)
    props: dict = {"delivery_mode": 2 if qos else 1}
    mp = pkt.properties
    ttl = None
    if mp:
        for name, value in mp.get("user_property", ()):
            if name in (QOS_HEADER, DUP_HEADER, RETAIN_HEADER):
                continue
            if name in headers:  # a repeated user property: an array header keeps every value
                old = headers[name]
                headers[name] = (old if isinstance(old, list) else [old]) + [value]
            else:
                headers[name] = value
        if "content_type" in mp:
            props["content_type"] = mp["content_type"][:255]
        if "correlation_data" in mp:
            cid = mp["correlation_data"]
            try:
                text = cid.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None and len(cid) <= 255:
                props["correlation_id"] = text
            else:
                headers["x-correlation-id"] = cid
        if "response_topic" in mp:
            props["reply_to"] = topics.to_routing_key(mp["response_topic"])[:255]
        if "message_expiry_interval" in mp:
            ttl = mp["message_expiry_interval"] * 1000
            props["expiration"] = str(ttl)
        if "payload_format_indicator" in mp:
            headers["x-mqtt-payload-format-indicator"] = mp["payload_format_indicator"]
    props["headers"] = headers
    raw = codec.encode_properties(props)
    return from_wire(topics.EXCHANGE, topics.to_routing_key(pkt.topic), raw, pkt.payload)


def from_amqp(msg: Message, sub_qos: int, version: int) -> p.Publish:
    """The PUBLISH for a delivery from a subscription queue of QoS ``sub_qos`` (packet id unset)."""
    plain = _PLAIN_QOS.get(msg.properties)
    if plain is not None and (version != p.V5 or msg.expires_ms is None):  # from MQTT, no properties
        return p.Publish(topics.to_topic(msg.routing_key), msg.body, min(plain[0], sub_qos), plain[1])
    pr = msg.props
    headers = pr.get("headers") or {}
    qos = headers.get(QOS_HEADER)
    if not isinstance(qos, int) or isinstance(qos, bool):
        qos = 1 if pr.get("delivery_mode") == 2 else 0
    qos = min(qos, sub_qos, 1)
    out = p.Publish(topics.to_topic(msg.routing_key), msg.body, qos, headers.get(RETAIN_HEADER) is True)
    if version == p.V5:
        mp: dict = {}
        users = []
        for name, value in headers.items():
            if name in (QOS_HEADER, DUP_HEADER) or name.startswith("x-mqtt-") or name == "x-correlation-id":
                continue
            for v in value if isinstance(value, list) else (value,):
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                    users.append((str(name), str(v)))
        if users:
            mp["user_property"] = users
        if "content_type" in pr:
            mp["content_type"] = pr["content_type"]
        if "correlation_id" in pr:
            mp["correlation_data"] = pr["correlation_id"].encode("utf-8")
        elif isinstance(headers.get("x-correlation-id"), bytes):
            mp["correlation_data"] = headers["x-correlation-id"]
        if "reply_to" in pr:
            mp["response_topic"] = topics.to_topic(pr["reply_to"])
        if headers.get("x-mqtt-payload-format-indicator") in (0, 1):
            mp["payload_format_indicator"] = headers["x-mqtt-payload-format-indicator"]
        if msg.expires_ms is not None:
            mp["message_expiry_interval"] = max(0, int(msg.expires_ms - time.time() * 1000) // 1000)
        out.properties = mp
    return out
