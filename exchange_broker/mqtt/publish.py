"""PUBLISH from an MQTT client and its acknowledgements, a part of ``session.py``: topic aliases
(MQTT 5), the write and topic permissions on ``amq.topic`` RabbitMQ's plugin checks, retained
messages, the broker's publish path, and PUBACKs (PUBRECs for QoS 2, routed as QoS 1) in the
order the PUBLISHes came, each once the store has its message; the will on an abnormal close.

MQTT 5's no-local: a PUBLISH whose topic matches only no-local subscriptions of the publisher's
own queue does not reach that queue (RabbitMQ drops it from the routed queues the same way)."""

from __future__ import annotations

import logging
from functools import partial

import routing

from exchange_broker.core import tracing
from exchange_broker.core.names import logsafe
from exchange_broker.core.ports import Waiter
from exchange_broker.mqtt import messages, topics
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import subscriptions as subs
from exchange_broker.mqtt.retained import Retained
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.mqtt")


class Refused(Exception):
    """Close the connection (5.0: DISCONNECT with ``code`` first)."""

    def __init__(self, text: str, code: int = p.PROTOCOL_ERROR) -> None:
        super().__init__(text)
        self.code = code


class PublishMethods:
    def _publish(self, pkt: p.Publish) -> None:
        alias = pkt.properties.pop("topic_alias", None) if pkt.properties else None
        if alias is not None:
            if not 0 < alias <= self.hub.settings.topic_alias_maximum:
                raise Refused(f"topic alias {alias}", p.TOPIC_ALIAS_INVALID)
            if pkt.topic:
                self.aliases[alias] = pkt.topic
            elif alias in self.aliases:
                pkt.topic = self.aliases[alias]
            else:
                raise Refused(f"unknown topic alias {alias}", p.PROTOCOL_ERROR)
        if not topics.valid_name(pkt.topic):
            raise Refused(f"invalid topic name '{pkt.topic}'", p.TOPIC_NAME_INVALID)
        if pkt.qos == 2 and pkt.packet_id in self.qos2_ids:  # sent again before our PUBREC: once
            self.send(p.Ack(p.PUBREC, pkt.packet_id))
            return
        key = topics.to_routing_key(pkt.topic)
        try:
            self.broker.check_write(self, topics.EXCHANGE, key)
        except AMQPError as err:
            log.info("MQTT connection %s: publish refused: %s", self.name, logsafe(err.text))
            if self.version == p.V5 and pkt.qos:
                self._queue_ack(pkt, p.NOT_AUTHORIZED)
                return
            raise Refused(err.text, p.NOT_AUTHORIZED) from None
        if not self.has_published:
            self.has_published = True
            if self.broker.alarms:
                self.block(self.broker.alarm_reason())
        kept = None  # the store's write of a retained message: its PUBACK waits for it too
        if pkt.retain:
            kept = self.hub.retained.set(self.vhost.name, Retained(pkt.topic, pkt.payload, min(pkt.qos, 1),
                                                                   dict(pkt.properties)))
        self.stats_published += 1
        routed, waiter = self.route(pkt, min(pkt.qos, 1))
        if kept is not None:
            waiter = kept if waiter is None else Waiter.all(waiter, kept)
        if not pkt.qos:
            return
        entry = self._queue_ack(pkt, None)
        if waiter is None:
            entry[1], entry[2] = True, (p.SUCCESS if routed else p.NO_MATCHING_SUBSCRIBERS)
            self._send_acks()
        else:
            waiter.add(self._stored, (entry, routed))

    def route(self, pkt: p.Publish, qos: int):
        """Publish ``pkt`` on amq.topic through the broker's publish path: (routed, waiter)."""
        ex = self.vhost.exchanges.get(topics.EXCHANGE)
        if ex is None:
            return False, None
        msg = messages.to_amqp(pkt, qos)
        has_headers = bool(pkt.properties and "user_property" in pkt.properties)  # else ours only
        if self.no_local:
            own = self._no_local_queues(pkt.topic)
            if own:
                return self._route_except(ex, msg, has_headers, own)
        routed, waiter, _rejected = self.broker.publish(self.vhost, ex, msg, has_headers, self)
        return routed, self.apply_actions(waiter)  # a queue's Block: stop reading this client

    def _no_local_queues(self, topic: str) -> set[str]:
        """This client's own queues that ``topic`` reaches only through no-local subscriptions."""
        keep: dict[int, bool] = {}
        for o in self.filters.values():
            if topics.matches(o.topic_filter, topic):
                keep[o.qos] = keep.get(o.qos, False) or not o.no_local
        return {subs.queue_name(self.client_id, qos) for qos, kept in keep.items() if not kept}

    def _route_except(self, ex, msg, has_headers: bool, skip: set[str]):
        """``Broker.publish`` for amq.topic (never a delayed-message exchange), without the queues
        named in ``skip``: (routed, waiter)."""
        broker, vhost = self.broker, self.vhost
        broker.stats["publish"] += 1
        ex.stats_in += 1
        headers = msg.headers if has_headers and vhost.headers_exchanges else None
        if vhost.property_exchanges:  # x-consistent-hash on a property behind amq.topic
            headers = routing.RoutingFields(msg.headers if has_headers else None, msg.props)
        queues = [q for q in vhost.route(ex, msg.routing_key, headers) if q.name not in skip]
        if vhost.tracing:
            tracing.tap_in(broker, vhost, msg, queues, self, 0)
        if not queues:
            broker.stats["return_unroutable"] += 1
            return False, None
        ex.stats_out += len(queues)
        routed, waiter, _rejected = broker.enqueue(queues, msg, self)
        return routed, self.apply_actions(waiter)

    def _queue_ack(self, pkt: p.Publish, code: int | None) -> list:
        entry = [pkt.packet_id, code is not None, code or p.SUCCESS, pkt.qos]
        self.pubacks.append(entry)
        if pkt.qos == 2:
            self.qos2_ids.add(pkt.packet_id)
        if code is not None:
            self._send_acks()
        return entry

    def _stored(self, arg, ok: bool) -> None:
        entry, routed = arg
        entry[1] = True
        entry[2] = (p.SUCCESS if routed else p.NO_MATCHING_SUBSCRIBERS) if ok else p.UNSPECIFIED_ERROR
        if not ok and self.version != p.V5:
            self._refuse("the store failed to keep a QoS 1 message", p.UNSPECIFIED_ERROR)
            return
        self._send_acks()

    def _send_acks(self) -> None:
        """PUBACKs (PUBRECs for QoS 2) go out in the order their PUBLISHes came in."""
        acks = self.pubacks
        while acks and acks[0][1]:
            pid, _, code, qos = acks.popleft()
            if self.closed:
                continue
            v5code = code if self.version == p.V5 else p.SUCCESS
            self.send(p.Ack(p.PUBREC if qos == 2 else p.PUBACK, pid, v5code))

    def _ack(self, a: p.Ack) -> None:
        if a.kind == p.PUBACK:
            self._settle(a.packet_id)
        elif a.kind == p.PUBREL:  # the end of a QoS 2 PUBLISH of the client
            known = a.packet_id in self.qos2_ids
            self.qos2_ids.discard(a.packet_id)
            code = p.SUCCESS if known or self.version != p.V5 else 0x92  # packet id not found
            self.send(p.Ack(p.PUBCOMP, a.packet_id, code))
        elif a.kind == p.PUBREC:  # we never send QoS 2; answer as the protocol says
            self.send(p.Ack(p.PUBREL, a.packet_id, p.SUCCESS if self.version != p.V5 else 0x92))
            self._settle(a.packet_id)

    def _publish_will(self) -> None:
        """Now, or (MQTT 5) after its will delay unless the client id connects again first."""
        w = self.will
        delay = w.properties.get("will_delay_interval", 0) if self.version == p.V5 else 0
        if delay:
            key = (self.vhost.name, self.client_id)
            handle = self.broker.call_later(delay, partial(self._delayed_will, w, key))
            if handle is not None:
                self.hub.pending_wills[key] = handle
                return
        self._send_will(w)

    def _delayed_will(self, w: p.Will, key: tuple) -> None:
        self.hub.pending_wills.pop(key, None)
        self._send_will(w)

    def _send_will(self, w: p.Will) -> None:
        try:
            self.broker.check_write(self, topics.EXCHANGE, topics.to_routing_key(w.topic))
        except AMQPError as err:
            log.info("MQTT connection %s: will refused: %s", self.name, logsafe(err.text))
            return
        pkt = p.Publish(w.topic, w.payload, min(w.qos, 1), w.retain, properties=dict(w.properties))
        pkt.properties.pop("will_delay_interval", None)
        if w.retain:
            self.hub.retained.set(self.vhost.name, Retained(w.topic, w.payload, pkt.qos, dict(pkt.properties)))
        self.route(pkt, pkt.qos)

