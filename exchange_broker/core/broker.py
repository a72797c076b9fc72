"""The broker core: vhosts, users, connections, and the publish path. Synchronous; no IO.

This object is also the service facade the admin API uses.
"""

from __future__ import annotations

import logging
import platform
from typing import TYPE_CHECKING, Callable

import routing
from pamqp import commands

from exchange_broker import __version__
from exchange_broker.core import permissions as perms
from exchange_broker.core import users as users_mod
from exchange_broker.core.auth import User, hash_password
from exchange_broker.core.ports import NullDurability, Waiter
from exchange_broker.core.exchange import Exchange
from exchange_broker.core.message import Message
from exchange_broker.protocol import codec
from exchange_broker.core.deadletter import dead_lettered_copy, is_cycle
from exchange_broker.protocol.constants import ACCESS_REFUSED, NOT_ALLOWED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types.classic import FLOW_HIGH, Queue
from exchange_broker.core.queue_args import amqp_type, parse_queue_arguments
from exchange_broker.core.reply_to import ReplyTo
from exchange_broker.queue_types.stream import find_stream, make_typed_queue
from exchange_broker.core.vhost import VHost

if TYPE_CHECKING:
    from exchange_broker.connection.session import Session

log = logging.getLogger("exchange_broker")

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


class Broker:
    def __init__(self, *, durability=None, default_user: str = "guest", default_pass: str = "guest",
                 loopback_users: tuple[str, ...] = ("guest",)) -> None:
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.sessions: set["Session"] = set()
        self.durability = durability or NullDurability()
        self.extra_exchange_types: dict[str, Callable] = {}
        self.delayed = None  # delayed-message exchange manager (exchange type x-delayed-message)
        from exchange_broker.core.delayed import DelayedExchanges
        self.delayed = DelayedExchanges(self)  # registers the type in extra_exchange_types
        self._call_later: Callable | None = None
        self.consumer_timeout_ms = 30 * 60 * 1000  # RabbitMQ's default delivery acknowledgement timeout
        self.alarms: dict[str, str] = {}
        self.reply_to = ReplyTo()  # resource alarms in force: name -> detail
        self.loopback_users = set(loopback_users)
        self.max_connections = 0  # open AMQP connections allowed (0: no limit); 530 beyond it
        self._dirty: list["Session"] = []
        self._flush_scheduled = False
        self.schedule_flush: Callable[[], None] = lambda: None
        self.blocked_reason: str | None = None
        self.stats = {"publish": 0, "deliver": 0, "ack": 0, "confirm": 0, "return_unroutable": 0}
        self.add_vhost("/", store=False)
        if default_user:
            self.add_user(default_user, default_pass, ["administrator"], store=False)
            self.set_permissions(default_user, "/", ".*", ".*", ".*", store=False)

    # -- configuration -------------------------------------------------------------------------
    def server_properties(self) -> dict:
        return {
            "product": "exchange-broker",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "copyright": "exchange-broker developers",
            "information": "A RabbitMQ-compatible AMQP 0-9-1 broker",
            "cluster_name": "exchange-broker",
            "capabilities": dict(CAPABILITIES),
        }

    def add_vhost(self, name: str, store: bool = True) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(self, name)
            if store:
                self.durability.vhost_added(name)
        return vh

    def add_user(self, name: str, password: str | None, tags: list[str] | None = None, *,
                 password_hash: str | None = None, hashing_algorithm: str | None = None,
                 store: bool = True) -> User:
        from exchange_broker.core.auth import HASHING_SHA256
        if password_hash is None:
            password_hash = hash_password(password) if password else ""
        user = User(name, password_hash, hashing_algorithm or HASHING_SHA256, list(tags or []))
        self.users[name] = user
        if store:
            users_mod.stored_user(self, user)
        return user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str,
                        store: bool = True) -> None:
        self.permissions[(user, vhost)] = (configure, write, read)
        if store:
            users_mod.stored_permission(self, user, vhost)

    # users.py: run-time changes (stored, and applied to open connections as RabbitMQ does)
    def set_user_tags(self, name: str, tags: list[str]) -> bool:
        return users_mod.set_user_tags(self, name, tags)

    def delete_user(self, name: str) -> bool:
        """Remove the user and its permissions; its connections are closed with 320."""
        return users_mod.delete_user(self, name)

    def clear_permissions(self, user: str, vhost: str) -> bool:
        return users_mod.clear_permissions(self, user, vhost)

    def delete_vhost(self, name: str) -> bool:
        """Close its connections (320), drop its queues, exchanges and permissions."""
        return users_mod.delete_vhost(self, name)

    def make_index(self, type: str, arguments: dict):
        factory = self.extra_exchange_types.get(type)
        return factory(arguments) if factory else routing.make_index(type)

    def make_queue(self, vhost: VHost, name: str, durable: bool, owner, auto_delete: bool,
                   arguments: dict) -> Queue:
        if arguments.get("x-queue-type") is not None:  # x-queue-type: stream.py (406 if unknown)
            typed = make_typed_queue(self, vhost, name, durable, owner, auto_delete, arguments)
            if typed is not None:
                return typed
        options = parse_queue_arguments(arguments, vhost.describe("queue", name))
        q = Queue(vhost.name, name, durable, owner, auto_delete, arguments, options)
        q.broker = self
        q.on_empty_consumers = self._queue_lost_consumers
        q.touch()
        if owner is not None:
            owner.exclusive_queues.add(q)
        return q

    # -- authentication ------------------------------------------------------------------------
    def authenticate(self, username: str, password: str, peer_is_loopback: bool,
                     mechanism: str = "PLAIN") -> str:
        user = self.users.get(username)
        if user is None or not user.check(password):
            raise AMQPError(ACCESS_REFUSED, f"Login was refused using authentication mechanism "
                            f"{mechanism}. For details see the broker logfile.", 10, 11, hard=True)
        if username in self.loopback_users and not peer_is_loopback:  # RabbitMQ's loopback_users
            raise AMQPError(ACCESS_REFUSED, f"{mechanism} login refused: user '{username}' can only "
                            f"connect via localhost", 10, 11, hard=True)
        return username

    def open_vhost(self, user: str, vhost: str) -> None:
        if self.max_connections and len(self.sessions) >= self.max_connections:
            raise AMQPError(NOT_ALLOWED, f"connection refused: node connection limit "
                            f"({self.max_connections}) is reached", 10, 40, hard=True)
        if vhost not in self.vhosts:
            raise AMQPError(NOT_ALLOWED, f"vhost {vhost} not found", 10, 40, hard=True)
        if (user, vhost) not in self.permissions:
            raise AMQPError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'",
                            10, 40, hard=True)

    def check_write(self, session: "Session", exchange: str) -> None:
        """basic.publish: write permission on the exchange (403 before the 404, as RabbitMQ)."""
        perms.check(session, perms.WRITE, "exchange", exchange)

    # -- publish path --------------------------------------------------------------------------
    def publish(self, vhost: VHost, ex: Exchange, msg: Message, has_headers: bool,
                publisher: "Session | None" = None, per_message_ttl: int | None = None
                ) -> tuple[bool, Waiter | None, bool]:
        """Route and enqueue. Returns (routed, durability waiter or None, rejected)."""
        self.stats["publish"] += 1
        if ex.type == "x-delayed-message" and self.delayed is not None:
            held = self.delayed.publish(vhost, ex, msg)  # None: no (valid) x-delay, route now
            if held is not None:
                return held
        raw = msg.properties
        cc = has_headers and (b"\x02CC" in raw or b"\x03BCC" in raw)
        headers = msg.headers if has_headers and (vhost.headers_exchanges or cc) else None
        queues = vhost.route(ex, msg.routing_key, headers)
        if cc:
            queues = self._route_cc(vhost, ex, msg, headers, queues)
        if not queues:
            self.stats["return_unroutable"] += 1
            return False, None, False
        return self.enqueue(queues, msg, publisher, per_message_ttl)

    def enqueue(self, queues: list[Queue], msg: Message, publisher: "Session | None" = None,
                per_message_ttl: int | None = None) -> tuple[bool, Waiter | None, bool]:
        """Put a routed message on each queue (a cheap copy per extra queue); store what is durable."""
        waiter = None
        rejected = False
        durability = self.durability
        first = True
        for q in queues:
            m = msg if first else msg.copy()
            first = False
            if q.is_stream:  # stream queues append to their log (stream.py)
                waiter = q.append(m, publisher) or waiter
                continue
            if not q.admit(m, per_message_ttl):
                rejected = rejected or m.rejected
                continue
            m.seq = q.next_seq
            q.next_seq += 1
            m.queue = q
            if m.persistent and q.store_id is not None:
                waiter = durability.append(q, m) or waiter
            q.push(m)
            if publisher is not None and len(q.ready) > FLOW_HIGH and q.congested():
                publisher.throttle(q)
        return True, waiter, rejected

    def _route_cc(self, vhost: VHost, ex: Exchange, msg: Message, headers: dict,
                  queues: list[Queue]) -> list[Queue]:
        """Sender-selected distribution: CC and BCC routing keys add destinations; BCC is stripped."""
        keys = []
        for name in ("CC", "BCC"):
            value = headers.get(name)
            if isinstance(value, list):
                keys += [k.decode("utf-8", "replace") if isinstance(k, bytes) else k
                         for k in value if isinstance(k, (str, bytes))]
            elif name in headers:  # RabbitMQ: CC/BCC must be an array (of longstr)
                raise AMQPError(PRECONDITION_FAILED, f'invalid message: {{unacceptable_type_in_header,'
                                f'"{name}",{amqp_type(value)}}}', 60, 40, hard=False)
        seen = set(queues)
        out = list(queues)
        for key in keys:
            for q in vhost.route(ex, key, headers):
                if q not in seen:
                    seen.add(q)
                    out.append(q)
        if "BCC" in headers:
            props = dict(msg.props)
            stripped = dict(headers)
            del stripped["BCC"]
            props["headers"] = stripped
            msg.properties = codec.encode_properties(props)
            msg._props = props
        return out

    def settle(self, msg: Message) -> None:
        """A message is done with (acked, or delivered with no_ack)."""
        if msg.stored:
            self.durability.remove(msg)

    def delivered(self, msg: Message) -> None:
        if msg.stored:
            self.durability.mark_delivered(msg)

    def rejected(self, msg: Message) -> None:
        """Rejected or nacked without requeue: dead-lettered if the queue has a DLX."""
        q = msg.queue
        if q is not None and q.options.dead_letter_exchange is not None and not q.deleted:
            self.dead_letter(q, msg, "rejected")
        else:
            self.settle(msg)

    def dead_letter(self, q: Queue, msg: Message, reason: str, settle: bool = True) -> None:
        """Republish to the queue's dead-letter exchange with x-death; then forget the original."""
        dlx = q.options.dead_letter_exchange
        vh = self.vhosts.get(q.vhost)
        ex = vh.exchanges.get(dlx) if (vh is not None and dlx is not None) else None
        copy = None
        if ex is not None:
            try:
                copy = dead_lettered_copy(msg, q.name, reason, dlx, q.options.dead_letter_routing_key)
            except AMQPError as err:  # undecodable properties (published raw): cannot add x-death
                log.warning("message from queue '%s' in vhost '%s' dropped, not dead-lettered: %s",
                            q.name, q.vhost, err.text)
        if copy is not None:
            headers = copy.headers
            queues = vh.route(ex, copy.routing_key, headers)
            if q.options.dead_letter_routing_key is None and headers and ("CC" in headers):
                queues = self._route_cc(vh, ex, copy, headers, queues)
            queues = [t for t in queues if not is_cycle(copy, t.name)]
            if queues:
                self.enqueue(queues, copy)
        elif dlx is not None and ex is None:
            log.debug("dead-letter exchange '%s' of queue '%s' does not exist; message dropped", dlx, q.name)
        if settle:
            self.settle(msg)

    def expire_queue(self, q: Queue) -> None:
        """x-expires elapsed with no consumers and no use: delete the queue."""
        vh = self.vhosts.get(q.vhost)
        if vh is not None and vh.queues.get(q.name) is q:
            log.info("queue '%s' in vhost '%s' expired (x-expires)", q.name, q.vhost)
            vh.remove_queue(q)

    def call_later(self, delay: float, fn: Callable[[], None]):
        """Timer hook; the server installs the event loop's call_later. Without a loop: no timers."""
        if self._call_later is None:
            return None
        return self._call_later(delay, fn)

    # -- stream queues: named consumer offsets and log state (stream.py; for the admin API) ------
    def stream_offset(self, vhost: str, queue: str, name: str) -> int | None:
        """The stored offset of named consumer ``name`` on stream ``queue`` (None: none stored).
        KeyError: no such queue; ValueError: not a stream."""
        return find_stream(self, vhost, queue).query_offset(name)

    def set_stream_offset(self, vhost: str, queue: str, name: str, offset: int) -> None:
        """Store an offset for a named consumer (its next consume without x-stream-offset starts
        at offset + 1)."""
        find_stream(self, vhost, queue).set_offset(name, offset)

    def stream_offsets(self, vhost: str, queue: str) -> dict[str, int]:
        return dict(find_stream(self, vhost, queue).offsets)

    def stream_info(self, vhost: str, queue: str) -> dict:
        """first/next offset, message and byte counts, segments, consumers, stored offsets."""
        return find_stream(self, vhost, queue).info()

    # -- resource alarms (memory high watermark, disk free limit) -------------------------------
    def alarm_reason(self) -> str:
        return "low on " + " and ".join(sorted(self.alarms)) if self.alarms else ""

    def set_alarm(self, resource: str, on: bool, detail: str = "") -> None:
        """Raise or clear an alarm. While any is raised, every publishing connection is sent
        connection.blocked and is not read; consumers keep draining."""
        if on == (resource in self.alarms):
            return
        if on:
            self.alarms[resource] = detail
            log.warning("%s alarm set (%s): blocking publishers", resource, detail)
            reason = self.alarm_reason()
            for sess in list(self.sessions):
                if sess.has_published:
                    sess.block(reason)
        else:
            del self.alarms[resource]
            log.warning("%s alarm cleared", resource)
            if not self.alarms:
                for sess in list(self.sessions):
                    sess.unblock()

    # -- periodic checks (the server calls tick once a second) -----------------------------------
    def tick(self, now: float) -> None:
        self._check_consumer_timeouts(now)

    def _check_consumer_timeouts(self, now: float) -> None:
        default = self.consumer_timeout_ms
        for sess in list(self.sessions):
            for ch in list(sess.channels.values()):
                if not ch.unacked:
                    continue
                for n, (msg, consumer) in enumerate(ch.unacked.values()):
                    if n >= 64:
                        break
                    q = msg.queue
                    timeout = (q.options.consumer_timeout if q is not None else None) or default
                    if timeout and msg.delivered_at and now - msg.delivered_at > timeout / 1000.0:
                        sess.channel_error(ch.number, AMQPError(
                            PRECONDITION_FAILED, f"delivery acknowledgement on channel {ch.number} timed "
                            f"out. Timeout value used: {timeout} ms. This timeout value can be configured, "
                            f"see consumers doc guide to learn more", hard=False))
                        break

    # -- lifecycle hooks ----------------------------------------------------------------------
    def _queue_lost_consumers(self, q: Queue) -> None:
        if q.auto_delete and q.had_consumer and not q.deleted:
            vh = self.vhosts.get(q.vhost)
            if vh is not None:
                vh.remove_queue(q)

    def on_queue_deleted(self, q: Queue) -> None:
        for c in list(q.consumers):
            ch = c.channel
            ch.consumers.pop(c.tag, None)
            c.active = False
            sess = ch.session
            if sess.conn.capabilities.get("consumer_cancel_notify") and not ch.closed:
                sess.conn.send_method(ch.number, commands.Basic.Cancel(c.tag, nowait=True))
                sess.mark_dirty()
        q.consumers.clear()
        q.cancel_timers()
        if q.waiting_gets:
            self.call_later(0, q.answer_waiting_gets)  # they now get the queue's 404
        owner = q.exclusive_owner
        if owner is not None:
            owner.exclusive_queues.discard(q)
        if q.flow_blocked:
            q.release_publishers()

    def on_exchange_deleted(self, ex: Exchange) -> None:
        if self.delayed is not None:
            self.delayed.exchange_deleted(ex)

    # -- output scheduling -----------------------------------------------------------------------
    def mark_dirty(self, session: "Session") -> None:
        if not session.dirty:
            session.dirty = True
            self._dirty.append(session)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.schedule_flush()

    def flush(self) -> None:
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        for s in dirty:
            s.dirty = False
            s.flush()
