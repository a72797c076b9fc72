"""The event exchange (RabbitMQ's rabbitmq_event_exchange plugin; ``serve --event-exchange``).

The broker's internal events are published to the internal topic exchange ``amq.rabbitmq.event`` of
the default vhost ``/``, one message per event: routing key the event type (``queue.created``,
``queue.deleted``, ``exchange.created``, ``exchange.deleted``, ``binding.created``,
``binding.deleted``, ``connection.created``, ``connection.closed``, ``channel.created``,
``channel.closed``, ``consumer.created``, ``consumer.deleted``, ``vhost.created``,
``vhost.deleted``, ``user.created``, ``user.deleted``, ``user.tags.set``, ``permission.created``,
``permission.deleted``, ``topic.permission.created``, ``topic.permission.deleted``, ``policy.set``,
``policy.cleared``, ``alarm.set``, ``alarm.cleared``, ``user.authentication.success``,
``user.authentication.failure``), an empty body, delivery mode 2, the
``timestamp`` property (seconds) and the event's fields as headers, named as RabbitMQ names them
(a resource is its name plus a ``vhost`` header; ``timestamp_in_ms`` is always there). As the
plugin, nothing is published while the exchange has no bindings, and messages go at most once.

``user_who_performed_action`` is the user of the AMQP connection whose method caused the event;
actions of the admin API and of the broker itself say ``rmq-internal`` (RabbitMQ names the API's
user there). Process ids (``pid``, ``owner_pid``) have no equivalent here and are left out.
"""
from __future__ import annotations

import datetime
import logging

from exchange_broker.core.auth_backends import LoginRefused
from exchange_broker.core.exchange import Exchange
from exchange_broker.core.message import Message
from exchange_broker.protocol import codec

log = logging.getLogger(__name__)
EVENT_EXCHANGE = "amq.rabbitmq.event"
INTERNAL_USER = "rmq-internal"
NODE = "exchange-broker@localhost"
_TYPE_MODULE = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue",
                "stream": "rabbit_stream_queue"}


class EventExchange:
    def __init__(self, broker, vhost: str = "/") -> None:
        self.broker = broker
        self.vhost = vhost
        self.acting_user: str | None = None   # the AMQP user whose method is being handled

    def install(self) -> None:
        """Declare ``amq.rabbitmq.event`` (topic, internal) in the vhost, creating it if need be."""
        vh = self.broker.add_vhost(self.vhost)
        if EVENT_EXCHANGE not in vh.exchanges:
            vh._add_exchange(Exchange(self.vhost, EVENT_EXCHANGE, "topic", durable=True, internal=True))

    def emit(self, key: str, props: dict) -> None:
        """Publish one event (at most once: a failure is logged, never raised into the action)."""
        try:
            self._emit(key, props)
        except Exception:  # noqa: BLE001 - an event must not break the operation it reports
            log.exception("event %s not published", key)

    def _emit(self, key: str, props: dict) -> None:
        vh = self.broker.vhosts.get(self.vhost)
        ex = vh.exchanges.get(EVENT_EXCHANGE) if vh is not None else None
        if ex is None or not len(ex.index):
            return
        now_ms = self.broker.now_ms()
        headers = {"timestamp_in_ms": now_ms}
        for name, value in props.items():
            if isinstance(value, tuple) and len(value) == 2:  # a resource: (vhost, name)
                headers[name] = value[1]
                headers["vhost"] = value[0]
            elif value is not None:
                headers[name] = value
        stamp = datetime.datetime.fromtimestamp(now_ms // 1000, datetime.timezone.utc)
        raw = codec.encode_properties({"delivery_mode": 2, "headers": headers, "timestamp": stamp})
        queues = vh.route(ex, key, None)
        if queues:
            self.broker.enqueue(queues, Message(EVENT_EXCHANGE, key, raw, b"", True))

    def _user(self, owner=None) -> str:
        user = getattr(owner, "user", None) or self.acting_user
        return user or INTERNAL_USER

    # -- the events (fields as RabbitMQ's emitters name them) ----------------------------------
    def queue_created(self, q, owner=None) -> None:
        self.emit("queue.created", {
            "name": (q.vhost, q.name), "type": _TYPE_MODULE.get(q.queue_type, q.queue_type),
            "durable": q.durable, "auto_delete": q.auto_delete, "arguments": dict(q.arguments),
            "exclusive": q.exclusive, "user_who_performed_action": self._user(owner)})

    def queue_deleted(self, q) -> None:
        self.emit("queue.deleted", {"name": (q.vhost, q.name),
                                    "type": _TYPE_MODULE.get(q.queue_type, q.queue_type),
                                    "user_who_performed_action": self._user()})

    def exchange_created(self, ex) -> None:
        self.emit("exchange.created", {
            "name": (ex.vhost, ex.name), "type": ex.type, "durable": ex.durable,
            "auto_delete": ex.auto_delete, "internal": ex.internal, "arguments": dict(ex.arguments),
            "user_who_performed_action": self._user()})

    def exchange_deleted(self, ex) -> None:
        self.emit("exchange.deleted", {"name": (ex.vhost, ex.name),
                                       "user_who_performed_action": self._user()})

    def binding(self, created: bool, vhost: str, source: str, dest_type: str, dest: str,
                routing_key: str, arguments: dict, owner=None) -> None:
        self.emit("binding.created" if created else "binding.deleted", {
            "source_name": source, "source_kind": "exchange", "destination_name": dest,
            "destination_kind": dest_type, "routing_key": routing_key, "arguments": dict(arguments or {}),
            "vhost": vhost, "user_who_performed_action": self._user(owner)})

    def connection_created(self, sess) -> None:
        conn = sess.conn
        peer = sess.peer or ("", 0)
        self.emit("connection.created", {
            "name": sess.name, "peer_host": peer[0], "peer_port": peer[1], "node": NODE,
            "protocol": "AMQP 0-8" if conn.amqp_0_8 else "AMQP 0-9-1", "user": sess.user, "vhost": sess.vhost.name,
            "timeout": conn.heartbeat, "frame_max": conn.frame_max, "channel_max": conn.channel_max,
            "client_properties": dict(sess.client_properties or {}),
            "connected_at": self.broker.now_ms(), "user_who_performed_action": sess.user})

    def connection_closed(self, sess) -> None:
        props = {"name": sess.name, "node": NODE, "client_properties": dict(sess.client_properties or {})}
        provided = (sess.client_properties or {}).get("connection_name")
        if provided:
            props["user_provided_name"] = provided
        self.emit("connection.closed", props)

    def channel_created(self, sess, number: int) -> None:
        self.emit("channel.created", {
            "name": f"{sess.name} ({number})", "connection": sess.name, "number": number,
            "user": sess.user, "vhost": sess.vhost.name if sess.vhost else "",
            "user_who_performed_action": sess.user})

    def channel_closed(self, channel) -> None:
        sess = channel.session
        self.emit("channel.closed", {"name": f"{sess.name} ({channel.number})",
                                     "user_who_performed_action": sess.user,
                                     "consumer_count": len(channel.consumers)})

    def consumer_created(self, channel, consumer) -> None:
        q = consumer.queue
        self.emit("consumer.created", {
            "consumer_tag": consumer.tag, "exclusive": consumer.exclusive,
            "ack_required": not consumer.no_ack, "channel": f"{channel.session.name} ({channel.number})",
            "queue": (q.vhost, q.name), "prefetch_count": channel.prefetch,
            "arguments": dict(consumer.arguments or {}), "user_who_performed_action": channel.session.user})

    def consumer_deleted(self, channel, consumer) -> None:
        q = consumer.queue
        self.emit("consumer.deleted", {
            "consumer_tag": consumer.tag, "channel": f"{channel.session.name} ({channel.number})",
            "queue": (q.vhost, q.name), "user_who_performed_action": channel.session.user})

    def changed(self, key: str, props: dict) -> None:
        """An operator's change (a permission, a policy, a user's tags), with who made it."""
        self.emit(key, {**props, "user_who_performed_action": self._user()})

    def authentication(self, username: str, mechanism: str, conn_name: str, peer_host: str, result) -> None:
        """A login decided (``result``: an AuthenticatedUser, or a LoginRefused saying why)."""
        ok = not isinstance(result, LoginRefused)
        self.emit("user.authentication.success" if ok else "user.authentication.failure",
                  {"name": username, "auth_mechanism": mechanism, "connection_name": conn_name,
                   "peer_host": peer_host, "error": None if ok else str(result)})

    def alarm(self, resource: str, on: bool) -> None:
        self.emit("alarm.set" if on else "alarm.cleared", {"source": resource, "node": NODE})

    def vhost_event(self, created: bool, name: str) -> None:
        self.emit("vhost.created" if created else "vhost.deleted",
                  {"name": name, "user_who_performed_action": self._user()})

    def user_event(self, created: bool, name: str) -> None:
        self.emit("user.created" if created else "user.deleted",
                  {"name": name, "user_who_performed_action": self._user()})
