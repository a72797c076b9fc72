"""Client-id takeover across the nodes of a cluster (``--cluster-mode leaders``), a part of
``session.py``, for sessions with subscription queues (persistent ones, or any with a
subscription whose queue another node leads).

A client id's subscription queue is where its connections meet: a connection on another node
consumes it through that node's placeholder, which the queue's leader sees as a consumer of the
cluster's link user (``cluster/remote.py``'s relay). On the leader, an MQTT connection of the
client id checks its subscription queues when it starts consuming and then once a second:

* a relay consumer that was there before it: an older connection on another node -> that
  consumer is cancelled (basic.cancel over the link); the other node's placeholder cancels the
  old connection's consumer, and that connection closes (``MQTTConsumer.queue_deleted``;
  MQTT 5: DISCONNECT 0x8E);
* a relay consumer that came after it: a newer connection on another node -> this connection is
  taken over (MQTT 5: DISCONNECT 0x8E), its will published, its unacknowledged messages requeued.

When both connections are on nodes other than the leader, the leader sees two relayed consumers
and no MQTT connection: :func:`cancel_older_relays` (the hub's once-a-second tick) keeps the one
that came last (in the order its scans first saw them) and cancels the others, whose nodes close
those connections. Two connections of one client id appearing within the same second on such
nodes may keep either.

Not covered: a client id without subscriptions (no queue to meet at); RabbitMQ keeps a
cluster-wide client-id registry.
"""

from __future__ import annotations

import logging

from exchange_broker.core.names import logsafe
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import subscriptions as subs

log = logging.getLogger("exchange_broker.mqtt")


def _relayed(broker, consumer) -> bool:
    """A consumer that another node relays (a consumer of the link user's AMQP connection)."""
    channel = getattr(consumer, "channel", None)
    user = getattr(getattr(channel, "session", None), "user", None)
    return bool(user) and broker.is_link_user(user)


class TakeoverMethods:
    @property
    def broker_in_cluster(self) -> bool:
        return self.broker.definitions_shared  # a cluster with per-queue leaders

    def check_cluster_takeover(self) -> None:
        for c in list(self.consumers.values()):
            q = c.queue
            if q.name.startswith(subs.SHARED_PREFIX) or self.closed:
                continue
            for other in list(q.consumers):
                if other is c or not _relayed(self.broker, other):
                    continue
                if other in c.older:
                    log.info("MQTT connection %s: client id '%s' takes over its older connection on "
                             "another node (consumer of %s cancelled)", self.name, logsafe(self.client_id),
                             logsafe(q.name))
                    q.remove_consumer(other)
                    other.queue_deleted()
                else:
                    log.info("MQTT connection %s: client id '%s' connected on another node",
                             self.name, logsafe(self.client_id))
                    self.taken_over()
                    return

    def consuming_queue_gone(self, q) -> None:
        """A subscription queue deleted, or its consumer cancelled by the leader (the client id
        took over on another node, or the queue's leader moved): the connection closes."""
        if self.closed:
            return
        if q.deleted:
            log.info("closing MQTT connection %s (client id '%s'): its queue %s was deleted", self.name,
                     logsafe(self.client_id), logsafe(q.name))
            if self.version == p.V5 and self.state == "open":
                self.send(p.Disconnect(p.ADMINISTRATIVE_ACTION, {"reason_string": "subscription queue deleted"}))
        else:
            log.info("closing MQTT connection %s (client id '%s'): its consumer of %s was cancelled (the "
                     "client id connected on another node, or the queue's leader moved)", self.name,
                     logsafe(self.client_id), logsafe(q.name))
            if self.version == p.V5 and self.state == "open":
                self.send(p.Disconnect(p.SESSION_TAKEN_OVER))
        self.close()


def cancel_older_relays(hub) -> None:
    """On this node, a client's own subscription queue consumed only through other nodes, by
    more than one of them: the newest relayed consumer stays, the older ones are cancelled."""
    broker = hub.broker
    seen = hub.relays_seen  # (vhost, queue) -> its relayed consumers, in the order first seen
    now: dict = {}
    for vhost in list(broker.vhosts.values()):
        for name, q in list(vhost.queues.items()):
            if not name.startswith(subs.OWN_PREFIX):
                continue
            consumers = list(getattr(q, "consumers", ()))
            if not consumers or any(isinstance(c, subs.MQTTConsumer) for c in consumers):
                continue  # no consumer, or an MQTT connection here checks for itself
            relayed = [c for c in consumers if _relayed(broker, c)]
            if not relayed:
                continue
            key = (vhost.name, name)
            before = seen.get(key, [])
            order = [c for c in before if c in relayed] + [c for c in relayed if c not in before]
            for old in order[:-1]:
                log.info("client id of %s connected on two other nodes: the older connection's consumer is "
                         "cancelled", logsafe(name))
                q.remove_consumer(old)
                old.queue_deleted()
            now[key] = order[-1:]
    hub.relays_seen = now
