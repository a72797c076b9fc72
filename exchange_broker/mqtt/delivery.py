"""Deliveries to an MQTT client, a part of ``session.py``: a message from a subscription queue
becomes a PUBLISH (``messages.from_amqp``) with what MQTT 5's subscription options say (the
subscription identifiers of the filters it matched; its RETAIN flag kept only when one of them
has retain-as-published, cleared otherwise and always for 3.1.1), a topic alias when the client
allows them (``Topic Alias Maximum`` in its CONNECT: the first PUBLISHes of a topic name assign
an alias, later ones send the alias and an empty topic, as RabbitMQ does), and its packet id
until the client's PUBACK settles the message in its queue."""

from __future__ import annotations

from exchange_broker.mqtt import codec, messages, topics
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import subscriptions as subs
from exchange_broker.mqtt.publish import Refused

OUTPUT_BUDGET = 512 * 1024  # delivery bytes queued before the next flush


class DeliveryMethods:
    def _init_delivery(self) -> None:
        self.unacked: dict[int, tuple] = {}  # packet id -> (message or None, consumer or None)
        self._next_id = 0
        self.filters: dict[str, subs.Options] = {}  # routing key -> own subscription's options
        self.no_local = self.sub_ids = False        # any own filter with no-local / an identifier
        self.alias_max_out = 0                      # aliases the client takes (its CONNECT's)
        self.aliases_out: dict[str, int] = {}       # topic name -> the alias we gave it

    def _packet_id(self) -> int:
        for _ in range(65535):
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in self.unacked:
                return self._next_id
        raise Refused("no packet identifier left", p.RECEIVE_MAXIMUM_EXCEEDED)

    def deliver(self, consumer: subs.MQTTConsumer, msg) -> int:
        """A message from a subscription queue (``MQTTConsumer.deliver``)."""
        pub = messages.from_amqp(msg, consumer.qos, self.version)
        q = msg.queue
        self.stats_delivered += 1
        self.broker.stats["deliver"] += 1
        if self.version == p.V5:
            self._apply_options(consumer, pub)
        else:
            pub.retain = False  # an established subscription's messages go without RETAIN
        pid = 0
        if pub.qos:
            pid = self._packet_id()
            pub.packet_id, pub.dup = pid, msg.redelivered
            q.stats_deliver += 1
            self.unacked[pid] = (msg, consumer)
            consumer.outstanding.add(pid)
            consumer.unacked += 1
            q.unacked += 1
            if msg.stored:
                q.delivered(msg)
        else:
            q.stats_deliver_no_ack += 1
            q.settle(msg)
        self._send_delivery(pub)
        return pid

    def _matched(self, consumer, topic: str) -> list[subs.Options]:
        """The options of the subscriptions of ``consumer``'s queue that ``topic`` matches."""
        qos = consumer.qos
        if consumer.queue.name.startswith(subs.SHARED_PREFIX):
            found = [subs.options_from_args(topics.to_topic(rk), qos, args)
                     for rk, args in subs.bindings_of(self, consumer.queue.name).items()]
        else:
            found = [o for o in self.filters.values() if o.qos == qos]
        return [o for o in found if topics.matches(o.topic_filter, topic)]

    def filters_changed(self) -> None:
        """After ``filters`` changed: what publishes and deliveries must look at."""
        self.no_local = any(o.no_local for o in self.filters.values())
        self.sub_ids = any(o.sub_id for o in self.filters.values())

    def _apply_options(self, consumer, pub: p.Publish) -> None:
        if not pub.retain and not self.sub_ids and not consumer.queue.name.startswith(subs.SHARED_PREFIX):
            return  # nothing to add or clear (the common case)
        matched = self._matched(consumer, pub.topic)
        ids = sorted({o.sub_id for o in matched if o.sub_id})
        if ids:
            pub.properties["subscription_identifier"] = ids
        if pub.retain and not any(o.retain_as_published for o in matched):
            pub.retain = False

    def _send_delivery(self, pub: p.Publish) -> None:
        topic, new_alias = pub.topic, 0
        if self.alias_max_out:
            alias = self.aliases_out.get(topic)
            if alias is not None:
                pub.properties["topic_alias"] = alias
                pub.topic = ""
            elif len(self.aliases_out) < self.alias_max_out and len(topic) > 1:
                new_alias = len(self.aliases_out) + 1  # (a 1-byte name is as short as an alias)
                pub.properties["topic_alias"] = new_alias
        if self.client_max_packet:  # MQTT 5: what the client cannot take is dropped (MQTT-3.1.2-25)
            if len(codec.encode(pub, self.version)) > self.client_max_packet:
                if pub.qos:
                    self._settle(pub.packet_id)
                return  # (an alias given in a dropped PUBLISH is not given)
        if new_alias:
            self.aliases_out[topic] = new_alias
        self.send(pub)
        if self.out_pending > OUTPUT_BUDGET:
            self.writable = False

    def _settle(self, pid: int) -> None:
        entry = self.unacked.pop(pid, None)
        if entry is None:
            return
        msg, consumer = entry
        if msg is None:
            return  # a retained message: nothing to settle
        consumer.outstanding.discard(pid)
        consumer.unacked -= 1
        q = msg.queue
        q.unacked -= 1
        q.stats_ack += 1
        self.stats_acked += 1
        self.broker.stats["ack"] += 1
        q.settle(msg)
        if q.wants_dispatch:
            q.dispatch()

    def _redispatch(self) -> None:
        for c in list(self.consumers.values()):
            if c.queue.wants_dispatch:
                c.queue.dispatch()
