"""An MQTT client's subscriptions as RabbitMQ's plugin keeps them: one queue per client id and
QoS (``mqtt-subscription-<client id>qos0`` / ``qos1``) bound to ``amq.topic`` once per topic
filter, durable for a persistent session and auto-delete for a clean one; a shared subscription
(``$share/group/filter``, MQTT 5) is one queue per group and filter, its members consuming in turn.

:class:`MQTTConsumer` is the sink such a queue delivers through (``core/ports.Consumer``), the
same narrow interface an AMQP channel's consumers offer.

MQTT 5's subscription options live in the binding's arguments (so a persistent session keeps
them): the subscription identifier, no-local and retain-as-published. :class:`Options` is one
filter's, as the session keeps them for its own queues (``Session.filters``, by routing key)."""

from __future__ import annotations

from typing import NamedTuple

from exchange_broker.core import permissions as perms
from exchange_broker.core.queue import delivery_guard
from exchange_broker.mqtt import topics

SUB_ID_ARG = "x-mqtt-subscription-id"
NO_LOCAL_ARG = "x-mqtt-no-local"
RAP_ARG = "x-mqtt-retain-as-published"


class Options(NamedTuple):
    """One subscription of the client's own queues: its filter, the queue's QoS, its options."""
    topic_filter: str
    qos: int
    sub_id: int | None = None
    no_local: bool = False
    retain_as_published: bool = False


def binding_args(sub_id: int | None, no_local: bool = False, retain_as_published: bool = False) -> dict:
    """The binding arguments that keep a subscription's options (none for the defaults)."""
    args: dict = {}
    if sub_id:
        args[SUB_ID_ARG] = sub_id
    if no_local:
        args[NO_LOCAL_ARG] = True
    if retain_as_published:
        args[RAP_ARG] = True
    return args


def options_from_args(topic_filter: str, qos: int, args: dict | None) -> Options:
    args = args or {}
    sub_id = args.get(SUB_ID_ARG)
    return Options(topic_filter, qos, sub_id if isinstance(sub_id, int) and not isinstance(sub_id, bool) else None,
                   args.get(NO_LOCAL_ARG) is True, args.get(RAP_ARG) is True)


def own_filters(session) -> dict[str, Options]:
    """routing key -> Options, for the bindings of the client's own queues (a resumed session)."""
    out: dict[str, Options] = {}
    for qos in (0, 1):
        name = queue_name(session.client_id, qos)
        if name not in session.vhost.queues:  # (a clean session: nothing to scan for)
            continue
        for rk, args in bindings_of(session, name).items():
            out[rk] = options_from_args(topics.to_topic(rk), qos, args)
    return out


OWN_PREFIX = "mqtt-subscription-"


def queue_name(client_id: str, qos: int) -> str:
    return f"{OWN_PREFIX}{client_id}qos{qos}"


SHARED_PREFIX = "mqtt-shared-"


def shared_queue_name(group: str, topic_filter: str) -> str:
    return f"{SHARED_PREFIX}{group}-{topics.to_routing_key(topic_filter)}"


class MQTTConsumer:
    """Deliveries of one subscription queue to one MQTT connection."""

    __slots__ = ("tag", "session", "queue", "qos", "no_ack", "exclusive", "arguments", "priority",
                 "active", "unacked", "outstanding", "older", "guard")
    channel = None  # no AMQP channel (the admin API shows the connection)
    deliver_run = None  # one message at a time

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
        self.older = list(queue.consumers)  # the queue's consumers before this one (takeover.py)
        # a cluster node that may no longer lead the (durable) queue: False, nothing is sent
        self.guard = delivery_guard(queue)

    @property
    def prefetch(self) -> int:
        return 0 if self.no_ack else self.session.receive_max

    def can_take(self) -> bool:
        if self.guard is not None and not self.guard():
            return False
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
        """The queue was deleted, or (a queue another node leads) the leader cancelled this
        consumer: the connection closes, as RabbitMQ's when its consuming queue is gone."""
        self.active = False
        self.session.consumers.pop(self.queue.name, None)
        self.session.consuming_queue_gone(self.queue)


def ensure_queue(session, name: str, durable: bool, expires_ms: int | None):
    """Declare (configure permission) the subscription queue ``name`` if it is missing."""
    vhost = session.vhost
    q = vhost.queues.get(name)
    if q is not None:
        return q
    perms.queue_declare(session, name, None)
    args = {"x-expires": expires_ms} if expires_ms else {}
    return vhost.declare_queue(name, durable=durable, auto_delete=not durable, arguments=args)


def bind(session, q, topic_filter: str, args: dict) -> None:
    """Bind ``q`` to amq.topic for ``topic_filter`` (write on the queue, read on the exchange,
    topic read permission), replacing a binding of the same filter with other options
    (``args``: :func:`binding_args`)."""
    key = topics.to_routing_key(topic_filter)
    perms.binding(session, "queue", q.name, topics.EXCHANGE, key)
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


def bindings_of(session, queue: str) -> dict[str, dict]:
    """routing key -> binding arguments, for every binding of ``queue`` on amq.topic."""
    ex = session.vhost.exchanges.get(topics.EXCHANGE)
    if ex is None:
        return {}
    return {rk: dict(args or {}) for (kind, dest), rk, args in ex.index.bindings()
            if kind == "q" and dest == queue}


def unbind(session, queue: str, topic_filter: str) -> bool:
    """Remove every binding of ``queue`` for ``topic_filter``; True when there was one."""
    key = topics.to_routing_key(topic_filter)
    found = bound_args(session, queue, key)
    for args in found:
        session.vhost.unbind(topics.EXCHANGE, "queue", queue, key, args, 50, 50)
    return bool(found)
