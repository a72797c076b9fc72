"""The broker core: vhosts, users, connections, and the publish path. Synchronous; no IO.

This object is also the service facade the admin API uses.
"""

from __future__ import annotations

import logging
import platform
from typing import TYPE_CHECKING, Callable

import routing
from pamqp import commands

from . import __version__
from .auth import User, hash_password
from .durability import NullDurability, Waiter
from .exchange import Exchange
from .message import Message
from .protocol import codec
from .protocol.constants import ACCESS_REFUSED, NOT_ALLOWED
from .protocol.errors import AMQPError
from .queue import FLOW_HIGH, Queue
from .vhost import VHost

if TYPE_CHECKING:
    from .session import Session

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
    "direct_reply_to": False,
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
        self.loopback_users = set(loopback_users)
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
                self.durability.vhost_added(name) if hasattr(self.durability, "vhost_added") else None
        return vh

    def add_user(self, name: str, password: str | None, tags: list[str] | None = None, *,
                 password_hash: str | None = None, hashing_algorithm: str | None = None,
                 store: bool = True) -> User:
        from .auth import HASHING_SHA256
        if password_hash is None:
            password_hash = hash_password(password) if password else ""
        user = User(name, password_hash, hashing_algorithm or HASHING_SHA256, list(tags or []))
        self.users[name] = user
        return user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str,
                        store: bool = True) -> None:
        self.permissions[(user, vhost)] = (configure, write, read)

    def make_index(self, type: str, arguments: dict):
        factory = self.extra_exchange_types.get(type)
        return factory(arguments) if factory else routing.make_index(type)

    def make_queue(self, vhost: VHost, name: str, durable: bool, owner, auto_delete: bool,
                   arguments: dict) -> Queue:
        q = Queue(vhost.name, name, durable, owner, auto_delete, arguments)
        q.on_empty_consumers = self._queue_lost_consumers
        if owner is not None:
            owner.exclusive_queues.add(q)
        return q

    # -- authentication ------------------------------------------------------------------------
    def authenticate(self, username: str, password: str, peer_is_loopback: bool) -> str:
        user = self.users.get(username)
        if user is None or not user.check(password):
            raise AMQPError(ACCESS_REFUSED, f"Login was refused using authentication mechanism PLAIN. "
                            f"For details see the broker logfile.", 10, 11, hard=True)
        if username in self.loopback_users and not peer_is_loopback:
            raise AMQPError(ACCESS_REFUSED, f"User '{username}' can only connect via localhost",
                            10, 11, hard=True)
        return username

    def open_vhost(self, user: str, vhost: str) -> None:
        if vhost not in self.vhosts:
            raise AMQPError(NOT_ALLOWED, f"vhost {vhost} not found", 10, 40, hard=True)
        if (user, vhost) not in self.permissions:
            raise AMQPError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'",
                            10, 40, hard=True)

    def check_write(self, session: "Session", ex: Exchange) -> None:
        """Permission hook on publish (issue 8 fills this in)."""

    # -- publish path --------------------------------------------------------------------------
    def publish(self, vhost: VHost, ex: Exchange, msg: Message, has_headers: bool,
                publisher: "Session | None" = None) -> tuple[bool, Waiter | None, bool]:
        """Route and enqueue. Returns (routed, durability waiter or None, rejected)."""
        self.stats["publish"] += 1
        headers = msg.headers if has_headers and vhost.headers_exchanges else None
        queues = vhost.route(ex, msg.routing_key, headers)
        if not queues:
            self.stats["return_unroutable"] += 1
            return False, None, False
        waiter = None
        durability = self.durability
        first = True
        for q in queues:
            m = msg if first else msg.copy()
            first = False
            m.seq = q.next_seq
            q.next_seq += 1
            m.queue = q
            if m.persistent and q.store_id is not None:
                waiter = durability.append(q, m) or waiter
            q.push(m)
            if publisher is not None and len(q.ready) > FLOW_HIGH and q.congested():
                publisher.throttle(q)
        return True, waiter, False

    def settle(self, msg: Message) -> None:
        """A message is done with (acked, or delivered with no_ack)."""
        if msg.stored:
            self.durability.remove(msg)

    def delivered(self, msg: Message) -> None:
        if msg.stored:
            self.durability.mark_delivered(msg)

    def rejected(self, msg: Message) -> None:
        """Rejected/nacked without requeue (dead-lettering hooks in here later)."""
        self.settle(msg)

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
        owner = q.exclusive_owner
        if owner is not None:
            owner.exclusive_queues.discard(q)
        if q.flow_blocked:
            q.release_publishers()

    def on_exchange_deleted(self, ex: Exchange) -> None:
        pass

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
