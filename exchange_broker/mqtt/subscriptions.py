"""An MQTT client's subscriptions as RabbitMQ's plugin keeps them: one queue per client id and
QoS (``mqtt-subscription-<client id>qos0`` / ``qos1``) bound to ``amq.topic`` once per topic
filter, durable for a persistent session and auto-delete for a clean one; a shared subscription
(``$share/group/filter``, MQTT 5) is one queue per group and filter, its members consuming in turn.

:class:`MQTTConsumer` is the sink such a queue delivers through (``core/ports.Consumer``), the
same narrow interface an AMQP channel's consumers offer."""

from __future__ import annotations

from exchange_broker.core import permissions as perms
from exchange_broker.mqtt import topics

SUB_ID_ARG = "x-mqtt-subscription-id"


def queue_name(client_id: str, qos: int) -> str:
    return f"mqtt-subscription-{client_id}qos{qos}"


def shared_queue_name(group: str, topic_filter: str) -> str:
    return f"mqtt-shared-{group}-{topics.to_routing_key(topic_filter)}"


class MQTTConsumer:
    """Deliveries of one subscription queue to one MQTT connection."""

    __slots__ = ("tag", "session", "queue", "qos", "no_ack", "exclusive", "arguments", "priority",
                 "active", "unacked", "outstanding")
    channel = None  # no AMQP channel (the admin API shows the connection)

    def __init__(self, session, queue, qos: int) -> None:
        self.tag = f"mqtt-{session.client_id}-{queue.name}"
        self.session = session
        self.queue = queue
        self.qos = qos
        self.no_ack = qos == 0
        self.exclusive = False
        self.arguments: dict = {}
        self.priority = 0
        self.active = True
        self.unacked = 0
        self.outstanding: set = set()  # packet ids of its deliveries awaiting PUBACK

    @property
    def prefetch(self) -> int:
        return 0 if self.no_ack else self.session.receive_max

    def can_take(self) -> bool:
        s = self.session
        if s.closed or not s.writable:
            return False
        return self.no_ack or len(s.unacked) < s.receive_max

    def blocked_by_socket(self) -> bool:
        return not self.session.writable

    @property
    def closed(self) -> bool:
        return self.session.closed

    def deliver(self, msg) -> int:
        return self.session.deliver(self, msg)

    def queue_deleted(self) -> None:
        self.active = False
        self.session.consumers.pop(self.queue.name, None)


def ensure_queue(session, name: str, durable: bool, expires_ms: int | None):
    """Declare (configure permission) the subscription queue ``name`` if it is missing."""
    vhost = session.vhost
    q = vhost.queues.get(name)
    if q is not None:
        return q
    perms.queue_declare(session, name, None)
    args = {"x-expires": expires_ms} if expires_ms else {}
    return vhost.declare_queue(name, durable=durable, auto_delete=not durable, arguments=args)


def bind(session, q, topic_filter: str, sub_id: int | None) -> None:
    """Bind ``q`` to amq.topic for ``topic_filter`` (write on the queue, read on the exchange,
    topic read permission), replacing a binding of the same filter with another identifier."""
    key = topics.to_routing_key(topic_filter)
    perms.binding(session, "queue", q.name, topics.EXCHANGE, key)
    args = {SUB_ID_ARG: sub_id} if sub_id else {}
    for old in bound_args(session, q.name, key):
        if old != args:
            session.vhost.unbind(topics.EXCHANGE, "queue", q.name, key, old, 50, 50)
    session.vhost.bind(topics.EXCHANGE, "queue", q.name, key, args, 50, 20)


def bound_args(session, queue: str, key: str | None = None) -> list[dict]:
    """The arguments of ``queue``'s bindings on amq.topic (for ``key``, or all of them)."""
    ex = session.vhost.exchanges.get(topics.EXCHANGE)
    if ex is None:
        return []
    return [dict(args) for (kind, dest), rk, args in ex.index.bindings()
            if kind == "q" and dest == queue and (key is None or rk == key)]


def filters_of(session, queue: str) -> dict[str, int | None]:
    """topic filter -> subscription identifier, for every binding of ``queue`` on amq.topic."""
    ex = session.vhost.exchanges.get(topics.EXCHANGE)
    if ex is None:
        return {}
    return {topics.to_topic(rk): (args or {}).get(SUB_ID_ARG)
            for (kind, dest), rk, args in ex.index.bindings() if kind == "q" and dest == queue}


def unbind(session, queue: str, topic_filter: str) -> bool:
    """Remove every binding of ``queue`` for ``topic_filter``; True when there was one."""
    key = topics.to_routing_key(topic_filter)
    found = bound_args(session, queue, key)
    for args in found:
        session.vhost.unbind(topics.EXCHANGE, "queue", queue, key, args, 50, 50)
    return bool(found)
