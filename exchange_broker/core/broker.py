"""The broker core: the registry of vhosts, users, permissions and open connections, and the
publish path (route, then hand to each queue). Synchronous; no IO, no asyncio, no threads.

It is given everything from outside through its constructor: the durability (what must be
stored, ``core/ports.py``), the clock (timers, ``core/clock.py``) and the queue types
(``x-queue-type`` name -> a ``core/queue.QueueType`` subclass).
"""

from __future__ import annotations

import hmac
import logging
import platform
from typing import Callable

import routing

from exchange_broker import __version__
from exchange_broker.core import alarms as alarms_mod
from exchange_broker.core import limits, tracing
from exchange_broker.core import permissions as perms
from exchange_broker.core import users as users_mod
from exchange_broker.core.auth import HASHING_SHA256, User, hash_password, is_loopback
from exchange_broker.core.auth_backends import AuthChain, AuthenticatedUser, InternalBackend, LoginRefused
from exchange_broker.core.actions import joined
from exchange_broker.core.clock import Clock, NoClock
from exchange_broker.core.deadletter import dead_lettered_copy, is_cycle
from exchange_broker.core.delayed import DelayedExchanges
from exchange_broker.core.exchange import Exchange
from exchange_broker.core.message import Message
from exchange_broker.core.names import describe, logsafe
from exchange_broker.core.ports import Connection, Durability, NullDurability, Waiter
from exchange_broker.core.queue import QueueType
from exchange_broker.core.queue_args import amqp_type
from exchange_broker.core.reply_to import ReplyTo
from exchange_broker.core.vhost import VHost
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import ACCESS_REFUSED, NOT_ALLOWED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

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
    def __init__(self, *, durability: Durability | None = None, clock: Clock | None = None,
                 queue_types: dict[str, type[QueueType]] | None = None, default_user: str = "guest",
                 default_pass: str = "guest", loopback_users: tuple[str, ...] = ("guest",),
                 consumer_timeout_ms: int = 30 * 60 * 1000, max_connections: int = 0) -> None:
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], tuple[str, str, str]] = {}
        # (user, vhost) -> {exchange: (write, read)}: core/permissions.py; limits: core/limits.py
        self.topic_permissions: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self.vhost_limits: dict[str, dict[str, int]] = {}
        self.user_limits: dict[str, dict[str, int]] = {}
        self.sessions: set[Connection] = set()   # open AMQP connections (connection/session.py)
        self.durability: Durability = durability or NullDurability()
        self.clock: Clock = clock or NoClock()
        self.queue_types: dict[str, type[QueueType]] = dict(queue_types or {})
        self.consumer_timeout_ms = consumer_timeout_ms  # RabbitMQ's default: 30 minutes
        # seconds a publish may wait for its confirm from the store before it is nacked (0: no bound;
        # serve --database-outage-nack-after; connection/confirms.py)
        self.confirm_nack_after = 0.0
        self.max_connections = max_connections  # open AMQP connections allowed (0: no limit); 530 beyond
        self.alarms: dict[str, str] = {}  # resource alarms in force: name -> detail
        self.reply_to = ReplyTo()
        self.loopback_users = set(loopback_users)
        # (name, password) of the internal users cluster nodes (link_login) and movers (shovels,
        # federation: movers_login) log in as: never stored, not listed, allowed everything in every
        # vhost (None: no such user yet). What the cluster's link user publishes is not relayed to
        # another node (it was relayed already); what the movers' user publishes is, as a client's.
        self.link_login: tuple[str, str] | None = None
        self.movers_login: tuple[str, str] | None = None
        self.auth = AuthChain([InternalBackend(self)])  # app.py sets --auth-backends' chain
        self.cluster_name = "exchange-broker"  # RabbitMQ's cluster_name (--cluster-name; movers/start.py)
        # a cluster with per-queue leaders: transient and exclusive queues, transient exchanges and
        # their bindings are stored too (the other nodes route to them; they die with their node)
        self.definitions_shared = False
        # such a cluster: (vhost, new queue) -> the queue, or a placeholder for it on another node
        self.place_queue: Callable | None = None
        # such a cluster: False while this node's lease may have run out (``LeaderNode.guard``):
        # the durable queues it leads hand out nothing meanwhile (``core.queue.delivery_guard``)
        self.delivery_guard: Callable[[], bool] | None = None
        # such a cluster: why definition changes cannot be stored now (the database is away), or
        # None; declares and other changes answer 541 (AMQP) or 503 (admin API) meanwhile
        self.definitions_unavailable: Callable[[], str | None] = lambda: None
        self.delayed = DelayedExchanges(self)  # messages held by x-delayed-message exchanges
        # while a run of publishes is routed, queues that could deliver wait here and dispatch
        # once at its end (see dispatch_deferred); None: they dispatch at once
        self.dispatch_later: list | None = None
        self.stats = {"publish": 0, "deliver": 0, "ack": 0, "confirm": 0, "return_unroutable": 0}
        self.events = None  # core/events.py EventExchange with serve --event-exchange
        # such a cluster (unless --no-cluster-connection-handoff): (session, event) -> True when the leader
        # of the queue a connection first asks for takes the whole connection (cluster/handoff.py)
        self.handoff: Callable | None = None
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
            "cluster_name": self.cluster_name,
            "capabilities": dict(CAPABILITIES),
        }

    def add_vhost(self, name: str, store: bool = True) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(self, name)
            if store:
                self.durability.vhost_added(name)
            if self.events is not None:
                self.events.vhost_event(True, name)
        return vh

    def set_default_queue_type(self, name: str, queue_type: str | None, store: bool = True) -> None:
        """The vhost's default queue type (None: classic as without one); ValueError for a type the
        broker does not have."""
        if queue_type is not None and queue_type not in self.queue_types:
            raise ValueError(f"unsupported queue type '{queue_type}' (one of "
                             f"{', '.join(sorted(self.queue_types))})")
        vh = self.vhosts[name]
        if vh.default_queue_type != queue_type:
            vh.default_queue_type = queue_type
            if store:
                self.durability.vhost_added(name, queue_type)

    def set_tracing(self, name: str, on: bool) -> None:
        """The firehose on or off in vhost ``name`` (RabbitMQ's trace_on / trace_off)."""
        vh = self.vhosts[name]
        if vh.tracing != on:
            vh.tracing = on
            log.info("%s tracing for vhost '%s'", "enabling" if on else "disabling", name)

    def add_user(self, name: str, password: str | None, tags: list[str] | None = None, *,
                 password_hash: str | None = None, hashing_algorithm: str | None = None,
                 store: bool = True) -> User:
        if password_hash is None:
            password_hash = hash_password(password) if password else ""
        user = User(name, password_hash, hashing_algorithm or HASHING_SHA256, list(tags or []))
        if self.events is not None and name not in self.users:
            self.events.user_event(True, name)
        elif store and name in self.users and self.users[name].tags != user.tags:
            self.event("user.tags.set", {"name": name, "tags": user.tags})
        self.users[name] = user
        if store:
            users_mod.stored_user(self, user)
        return user

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str,
                        store: bool = True) -> None:
        self.permissions[(user, vhost)] = (configure, write, read)
        if store:
            users_mod.stored_permission(self, user, vhost)
            self.event("permission.created", {"user": user, "vhost": vhost, "configure": configure,
                                              "write": write, "read": read})

    # users.py: run-time changes (stored, and applied to open connections as RabbitMQ does)
    def set_user_tags(self, name: str, tags: list[str]) -> bool:
        return users_mod.set_user_tags(self, name, tags)

    def delete_user(self, name: str, store: bool = True) -> bool:
        """Remove the user and its permissions; its connections are closed with 320. ``store``
        False (here and in ``clear_permissions``, ``delete_vhost``): written elsewhere already."""
        if not users_mod.delete_user(self, name, store):
            return False
        if self.events is not None:
            self.events.user_event(False, name)
        perms.forget_topic_permissions(self, user=name, store=store)
        limits.forget_user(self, name, store)
        return True

    def clear_permissions(self, user: str, vhost: str, store: bool = True) -> bool:
        return users_mod.clear_permissions(self, user, vhost, store)

    def event(self, key: str, props: dict) -> None:
        """An operator's change, to the event exchange when there is one (core/events.py)."""
        if self.events is not None:
            self.events.changed(key, props)

    def delete_vhost(self, name: str, store: bool = True) -> bool:
        """Close its connections (320), drop its queues, exchanges and permissions."""
        if not users_mod.delete_vhost(self, name, store):
            return False
        if self.events is not None:
            self.events.vhost_event(False, name)
        perms.forget_topic_permissions(self, vhost=name, store=store)
        limits.forget_vhost(self, name, store)
        return True

    def make_queue(self, vhost: VHost, name: str, durable: bool, owner, auto_delete: bool,
                   arguments: dict) -> QueueType:
        """A new queue of the declared x-queue-type (none: classic; unknown: 406)."""
        qtype = arguments.get("x-queue-type")
        if isinstance(qtype, (bytes, bytearray)):
            qtype = bytes(qtype).decode("utf-8", "replace")
        kind = self.queue_types.get("classic" if qtype is None else qtype) \
            if isinstance(qtype, (str, type(None))) else None
        if kind is None:
            raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for "
                            f"{describe('queue', name, vhost.name)}: \"unsupported queue type "
                            f"'{qtype}'\"", 50, 10, hard=False)
        q = kind.declare(self, vhost, name, durable, owner, auto_delete, arguments)
        q.on_empty_consumers = self._queue_lost_consumers
        q.touch()
        if owner is not None:
            owner.exclusive_queues.add(q)
        return q

    # -- authentication ------------------------------------------------------------------------
    def login(self, username: str, password: str | None, peer_host: str, mechanism: str,
              done: Callable, conn_name: str = "") -> None:
        """THE login of every protocol (AMQP, MQTT, the admin API): the backend chain
        (``core/auth_backends.py``), then RabbitMQ's loopback_users rule. ``done`` gets an
        AuthenticatedUser or a LoginRefused (logged here, once, with each backend's reason);
        ``password`` None: EXTERNAL, a verified TLS client certificate vouched for the user."""
        def finished(result) -> None:
            if isinstance(result, AuthenticatedUser) and result.name in self.loopback_users \
                    and not is_loopback(peer_host):
                result = LoginRefused([(result.backend, "loopback-only user")],
                                      f"{mechanism} login refused: user '{result.name}' can only "
                                      f"connect via localhost")
            if isinstance(result, LoginRefused):  # the client is told to see the log: it says why
                result.client_text = result.client_text or (
                    f"Login was refused using authentication mechanism {mechanism}. For details "
                    f"see the broker logfile.")
                log.info("login refused on connection %s: user '%s', mechanism %s: %s (%s)",
                         conn_name or peer_host or "local", logsafe(username), mechanism,
                         result.client_text, logsafe(str(result)))
            if self.events is not None:
                self.events.authentication(username, mechanism, conn_name, peer_host, result)
            done(result)
        self.auth.login(username, password, peer_host, finished)

    def authenticate(self, username: str, password: str | None, peer_is_loopback: bool,
                     mechanism: str = "PLAIN") -> str:
        """The former synchronous login, for callers not on ``login`` yet: the user name, or 403.
        A backend that needs the network cannot answer here: the login is refused."""
        decided: list = []
        self.login(username, password, "" if peer_is_loopback else "0.0.0.0", mechanism, decided.append)
        if decided and isinstance(decided[0], AuthenticatedUser):
            return decided[0].name
        text = decided[0].client_text if decided else f"{mechanism} login needs Broker.login (a backend asks the network)"
        raise AMQPError(ACCESS_REFUSED, text, 10, 11, hard=True)

    def check_link_password(self, password: str, user: str | None = None) -> bool:
        login = self.internal_login(user) if user is not None else self.link_login
        return login is not None and hmac.compare_digest(password.encode(), login[1].encode())

    def update_secret(self, user, new_secret: str, peer_host: str, done: Callable) -> None:
        """connection.update-secret: the backend that logged ``user`` in checks the new secret
        (the same user name, as RabbitMQ's oauth2 backend insists); ``done`` as for login."""
        backend = next((b for b in self.auth.backends if b.name == user.backend), None)
        if backend is None or user.backend == "internal":
            done(LoginRefused([(user.backend, "the backend cannot update a secret")]))
            return
        def finished(result) -> None:
            if isinstance(result, AuthenticatedUser) and result.name != user.name:
                result = LoginRefused([(user.backend, "Not allowed to change username on refreshed token")])
            done(result)
        self.auth.login(user.name, new_secret, peer_host, finished, backends=[backend])

    def open_vhost(self, user: str, vhost: str, authz=None) -> None:
        """connection.open: limits, the vhost, and the user's access to it (``authz``: an external
        backend's answer, else the broker's permission table)."""
        if self.max_connections and len(self.sessions) >= self.max_connections:
            raise AMQPError(NOT_ALLOWED, f"connection refused: node connection limit "
                            f"({self.max_connections}) is reached", 10, 40, hard=True)
        limits.check_connection(self, user, vhost)  # vhost and user max-connections (530)
        if vhost not in self.vhosts:
            raise AMQPError(NOT_ALLOWED, f"vhost {vhost} not found", 10, 40, hard=True)
        if (not authz.vhost_access(vhost) if authz is not None else
                (user, vhost) not in self.permissions and not self.is_internal_user(user)):
            raise AMQPError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'",
                            10, 40, hard=True)

    def is_link_user(self, user: str) -> bool:
        return self.link_login is not None and user == self.link_login[0]

    def internal_login(self, user: str) -> tuple[str, str] | None:
        """(name, password) of the cluster's link user or the movers' named ``user``, else None."""
        return next((x for x in (self.link_login, self.movers_login) if x is not None and x[0] == user), None)

    def is_internal_user(self, user: str) -> bool:  # everything allowed, user_id not checked
        return self.internal_login(user) is not None

    def check_write(self, session: Connection, exchange: str, routing_key: str | None = None) -> None:
        """basic.publish: write permission on the exchange (403 before the 404, as RabbitMQ), then
        the topic permission's write pattern on the routing key (topic exchanges only)."""
        perms.check(session, perms.WRITE, "exchange", exchange)
        if routing_key is not None and (self.topic_permissions or session.__dict__.get("authz") is not None):
            perms.check_topic(session, exchange, routing_key, perms.WRITE)

    def check_channel_open(self, session: Connection, open_here: int) -> None:
        """channel.open: the user's max-channels limit (530), ``open_here`` channels being open
        on ``session``."""
        if self.user_limits:
            limits.check_channel_open(self, session, open_here)

    # -- publish path --------------------------------------------------------------------------
    def publish(self, vhost: VHost, ex: Exchange, msg: Message, has_headers: bool,
                publisher: Connection | None = None, channel: int = 0) -> tuple[bool, Waiter | None, bool]:
        """Route and enqueue a message (made by ``message.from_wire``; its per-message TTL is
        ``msg.ttl``). Returns (routed, durability waiter or None, rejected), the waiter wrapped in
        the queues' ``Block`` actions for ``publisher`` (``core/actions.py``). ``channel``: the
        publisher's channel number (the firehose's ``channel`` header)."""
        self.stats["publish"] += 1
        ex.stats_in += 1  # the exchange's publish_in (admin API message_stats)
        if ex.holds_messages:  # x-delayed-message
            held = self.delayed.publish(vhost, ex, msg, publisher)  # None: no (valid) x-delay, route now
            if held is not None:
                return held
        if has_headers or vhost.property_exchanges:
            raw = msg.properties
            cc = has_headers and (b"\x02CC" in raw or b"\x03BCC" in raw)
            headers = msg.headers if has_headers and (vhost.headers_exchanges or cc) else None
            if vhost.property_exchanges:  # x-consistent-hash on a property: match sees the properties
                headers = routing.RoutingFields(msg.headers if has_headers else None, msg.props)
            queues = vhost.route(ex, msg.routing_key, headers)
            if cc:
                queues = self._route_cc(vhost, ex, msg, headers, queues)
        else:  # the usual publish: nothing but the routing key to route by
            queues = vhost.route(ex, msg.routing_key, None)
        if vhost.tracing:
            tracing.tap_in(self, vhost, msg, queues, publisher, channel)
        if not queues:
            self.stats["return_unroutable"] += 1
            return False, None, False
        ex.stats_out += len(queues)  # publish_out: one per queue reached, as RabbitMQ counts it
        if len(queues) == 1:  # enqueue, inlined for one queue
            waiter = queues[0].enqueue(msg, publisher, msg.ttl)
            return True, waiter, waiter is None and msg.rejected
        return self.enqueue(queues, msg, publisher)

    def dispatch_deferred(self, later: list) -> None:
        """End of a run of publishes: the queues that waited deliver now."""
        self.dispatch_later = None
        for q in later:
            q.dispatch_queued = False
            q.dispatch()

    def enqueue(self, queues: list[QueueType], msg: Message, publisher: Connection | None = None
                ) -> tuple[bool, Waiter | None, bool]:
        """Hand a routed message to each queue (a cheap copy per extra queue); each queue type
        stores what it must and says whether the publisher is to be nacked (or blocked)."""
        waiter = None
        rejected = False
        first = True
        expires = msg.expires_ms  # as routed: one queue's TTL, stamped on msg, must not reach the copies
        for q in queues:
            if first:
                m = msg
                first = False
            else:
                m = msg.copy()
                m.expires_ms = expires
            w = q.enqueue(m, publisher, m.ttl)
            if w is not None:  # different waiters (another node's confirm): all must fire; a
                # queue's Block (core/actions.py) is passed on to the publisher's channel with them
                waiter = w if waiter is None or waiter is w else joined(waiter, w)
            elif m.rejected:
                rejected = True
        return True, waiter, rejected

    def _route_cc(self, vhost: VHost, ex: Exchange, msg: Message, headers: dict,
                  queues: list[QueueType]) -> list[QueueType]:
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
        if ex.name == "":
            found = [q for key in keys for q in vhost.route(ex, key, headers)]
        else:  # every key at every exchange on the way, as RabbitMQ routes (e2e bindings too)
            found = vhost.route(ex, (msg.routing_key, *keys), headers)
        for q in found:
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

    def dead_letter(self, q: QueueType, msg: Message, reason: str, settle: bool = True) -> None:
        """Republish to the queue's dead-letter exchange with x-death; then forget the original."""
        dlx = q.options.dead_letter_exchange
        vh = self.vhosts.get(q.vhost)
        ex = vh.exchanges.get(dlx) if (vh is not None and dlx is not None) else None
        copy = None
        if ex is not None:
            try:
                copy = dead_lettered_copy(msg, q.name, reason, dlx, q.options.dead_letter_routing_key,
                                          self.clock.wall())
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
            q.settle(msg)

    def expire_queue(self, q: QueueType) -> None:
        """x-expires elapsed with no consumers and no use: delete the queue."""
        vh = self.vhosts.get(q.vhost)
        if vh is not None and vh.queues.get(q.name) is q:
            log.info("queue '%s' in vhost '%s' expired (x-expires)", q.name, q.vhost)
            vh.remove_queue(q)

    def now_ms(self) -> int:
        """The wall clock in milliseconds since the epoch (TTL deadlines, timestamps): the clock's."""
        return int(self.clock.wall() * 1000)

    def call_later(self, delay: float, fn: Callable[[], None]):
        """A timer on the broker's clock (None when the clock has no timers)."""
        return self.clock.call_later(delay, fn)

    # -- resource alarms (memory high watermark, disk free limit) -------------------------------
    def alarm_reason(self) -> str:
        return "low on " + " and ".join(sorted(self.alarms)) if self.alarms else ""

    def set_alarm(self, resource: str, on: bool, detail: str = "") -> None:
        """Raise or clear a resource alarm (core/alarms.py)."""
        alarms_mod.set_alarm(self, resource, on, detail)

    # -- periodic checks (the server calls tick once a second) -----------------------------------
    def tick(self, now: float | None = None) -> None:
        """``now``: the clock's ``time()`` (read here when not given)."""
        now = self.clock.time() if now is None else now
        self._check_consumer_timeouts(now)
        if self.confirm_nack_after:
            for sess in list(self.sessions):
                sess.nack_overdue_confirms(now, self.confirm_nack_after)

    def _check_consumer_timeouts(self, now: float) -> None:
        for sess in list(self.sessions):
            sess.check_consumer_timeouts(now, self.consumer_timeout_ms)

    # -- lifecycle hooks ----------------------------------------------------------------------
    def _queue_lost_consumers(self, q: QueueType) -> None:
        if q.auto_delete and q.had_consumer and not q.deleted:
            vh = self.vhosts.get(q.vhost)
            if vh is not None:
                vh.remove_queue(q)

    def on_queue_deleted(self, q: QueueType) -> None:
        for c in list(q.consumers):
            c.queue_deleted()  # the channel forgets it and tells the client (basic.cancel)
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
        if ex.holds_messages:
            self.delayed.exchange_deleted(ex)
