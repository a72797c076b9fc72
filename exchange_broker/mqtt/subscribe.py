"""SUBSCRIBE and UNSUBSCRIBE of one MQTT connection (a part of ``session.py``): the permission
checks RabbitMQ's plugin makes (configure on the queue, write on it and read on ``amq.topic``
to bind, the topic permission's read pattern, read on the queue to consume), the SUBACK codes and
the retained messages a new subscription receives (as retain handling says), and MQTT 5's
subscription options (kept in the binding's arguments and in ``session.filters``)."""

from __future__ import annotations

import logging

from exchange_broker.core.names import logsafe
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import subscriptions as subs
from exchange_broker.mqtt import topics
from exchange_broker.mqtt.publish import Refused
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.mqtt")


def subscribe(session, s: p.Subscribe) -> None:
    v5 = session.version == p.V5
    sub_id = s.properties.get("subscription_identifier", [None])[0] if v5 else None
    codes, retained = [], []
    for sub in s.subscriptions:
        if sub.no_local and topics.shared(sub.topic_filter) is not None:  # MQTT-3.8.3-4
            raise Refused(f"no-local on the shared subscription '{sub.topic_filter}'", p.PROTOCOL_ERROR)
    for sub in s.subscriptions:
        code, new = _one(session, sub, sub_id, v5)
        codes.append(code)
        if code < 0x80 and not topics.shared(sub.topic_filter):
            if sub.retain_handling == 0 or (sub.retain_handling == 1 and new):
                retained.append((sub, code))
    session.filters_changed()
    session.send(p.SubAck(s.packet_id, codes))
    for sub, granted in retained:
        for r in session.hub.retained.matching(session.vhost.name, sub.topic_filter):
            qos = min(r.qos, granted)
            props = dict(r.properties) if v5 else {}
            if v5 and sub_id:
                props["subscription_identifier"] = [sub_id]
            pub = p.Publish(r.topic, r.payload, qos, True, properties=props)
            if qos:
                pub.packet_id = session._packet_id()
                session.unacked[pub.packet_id] = (None, None)
            session._send_delivery(pub)


def _one(session, sub: p.Subscription, sub_id: int | None, v5: bool) -> tuple[int, bool]:
    """(SUBACK code, whether the subscription is new)."""
    topic_filter = sub.topic_filter
    share = topics.shared(topic_filter)
    if share is not None:
        if not v5 or not share[0]:
            return (p.TOPIC_FILTER_INVALID if v5 else p.SUBACK_FAILURE), False
        topic_filter = share[1]
    if not topics.valid_filter(topic_filter):
        return (p.TOPIC_FILTER_INVALID if v5 else p.SUBACK_FAILURE), False
    granted = min(sub.qos, 1)  # QoS 2 is granted as 1, as RabbitMQ does
    if share is not None:
        name = subs.shared_queue_name(share[0], topic_filter)
    else:
        name = subs.queue_name(session.client_id, granted)
    expires = None
    if v5 and session.expiry and session.expiry != 0xFFFFFFFF:
        expires = session.expiry * 1000
    try:
        q = subs.ensure_queue(session, name, session.persistent, expires)
        key = topics.to_routing_key(topic_filter)
        new = not subs.bound_args(session, name, key)
        options = (sub_id, sub.no_local, sub.retain_as_published) if v5 else (None,)
        subs.bind(session, q, topic_filter, subs.binding_args(*options))
        session._consume(q, granted)
    except AMQPError as err:
        log.info("MQTT connection %s: subscription to '%s' refused: %s", session.name,
                 logsafe(sub.topic_filter), logsafe(err.text))
        return (p.NOT_AUTHORIZED if v5 else p.SUBACK_FAILURE), False
    if share is None:  # the same filter at the other QoS is replaced
        subs.unbind(session, subs.queue_name(session.client_id, 1 - granted), topic_filter)
        session.filters[key] = subs.Options(topic_filter, granted, *options)
    return granted, new


def unsubscribe(session, u: p.Unsubscribe) -> None:
    codes = []
    for topic_filter in u.topic_filters:
        share = topics.shared(topic_filter)
        if share is not None:  # this member stops; the group's queue goes with its last member
            c = session.consumers.pop(subs.shared_queue_name(*share), None)
            found = c is not None
            if c is not None:
                c.active = False
                c.queue.remove_consumer(c)
                if not c.queue.consumers and not c.queue.deleted:
                    subs.unbind(session, c.queue.name, share[1])
        else:
            found = False
            for qos in (0, 1):
                found = subs.unbind(session, subs.queue_name(session.client_id, qos), topic_filter) or found
            session.filters.pop(topics.to_routing_key(topic_filter), None)
        codes.append(p.SUCCESS if found else p.NO_SUBSCRIPTION_EXISTED)
    session.filters_changed()
    session.send(p.UnsubAck(u.packet_id, codes))
