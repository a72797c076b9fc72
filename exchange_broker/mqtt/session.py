"""One MQTT connection, sans-IO: bytes in (``data_received``), packets handled against the broker
core as RabbitMQ's MQTT plugin maps them, bytes out through ``write`` once per event-loop turn.

A PUBLISH goes through the broker's publish path on ``amq.topic`` (its QoS 1 PUBACK once the
store has the message, in order); SUBSCRIBE declares and binds the client's subscription queues
(``subscriptions.py``) and consumes from them through :class:`MQTTConsumer`; deliveries are
``delivery.py``'s. The connection is closed (nothing else is disturbed) on malformed or
oversized input, a packet before CONNECT, a second CONNECT, an AUTH packet, a refused PUBLISH,
keep-alive silence (1.5 x the keep-alive), its subscription queue deleted, or a takeover by a new
connection with the same client id (on another node of a cluster: ``takeover.py``); the will is
published unless the client said DISCONNECT. The vhost is ``vhost_choice.py``'s.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from typing import Callable

from exchange_broker.core import permissions as perms
from exchange_broker.core.backpressure import BackPressure
from exchange_broker.core.names import logsafe
from exchange_broker.mqtt import codec, topics, vhost_choice
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt import subscriptions as subs
from exchange_broker.mqtt.delivery import DeliveryMethods
from exchange_broker.mqtt.login import MQTTLogin
from exchange_broker.mqtt.publish import PublishMethods, Refused
from exchange_broker.mqtt.subscribe import subscribe, unsubscribe
from exchange_broker.mqtt.takeover import TakeoverMethods
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.mqtt")

UNAUTHENTICATED_MAX = 65_536  # largest packet before CONNECT succeeded


class MQTTSession(MQTTLogin, PublishMethods, DeliveryMethods, TakeoverMethods, BackPressure):
    def __init__(self, hub, write: Callable[[bytes], None], close: Callable[[], None],
                 peer: tuple = ("", 0), set_reading: Callable[[bool], None] = lambda on: None) -> None:
        self.hub = hub
        self.broker = hub.broker
        self._write = write
        self._close_transport = close
        self._set_reading = set_reading
        self.peer = peer
        self.name = f"{peer[0]}:{peer[1]}"
        # before a login succeeds, RabbitMQ's mqtt.max_packet_size_unauthenticated (64 KiB) holds
        self.parser = codec.Parser(min(UNAUTHENTICATED_MAX, hub.settings.max_packet_size))
        self.version = p.V311
        self.state = "connect"        # connect -> (login) -> open -> closed
        self.closed = False
        self.client_id = ""
        self.user: str | None = None
        self.vhost = None
        self.keep_alive = 0
        self.clean = True
        self.will: p.Will | None = None
        self.persistent = False          # the session outlives the connection (queues durable)
        self.expiry: int | None = None   # MQTT 5's session expiry interval (s)
        self.opened_at = self.last_read = hub.broker.clock.time()
        # the core's Connection port (core/ports.py)
        self.has_published = False
        self.exclusive_queues: set = set()
        self.throttled_by: set = set()
        self.blocked = False
        self.reading = True
        # output
        self.out: list[bytes] = []
        self.out_pending = 0
        self.dirty = False
        self.writable = True
        self.paused = False
        # deliveries (delivery.py): queue name -> consumer
        self.consumers: dict[str, subs.MQTTConsumer] = {}
        self.receive_max = hub.settings.prefetch
        self.client_max_packet = 0
        self._init_delivery()
        self.pubacks: deque = deque()   # [packet id, done, reason code] in arrival order
        self.qos2_ids: set[int] = set()  # QoS 2 PUBLISHes routed, awaiting their PUBREL
        self.aliases: dict[int, str] = {}
        self.stats_published = self.stats_delivered = self.stats_acked = 0
        self.channels: dict = {}  # none: the admin API and the limits count AMQP channels here
        self.connected_at: int | None = None
        self.listener: tuple[str, int] = ("", 0)  # the listener's address (set by the server)
        self.tls = False
        self._init_login()

    # -- output ------------------------------------------------------------------------------------
    def send(self, pkt) -> None:
        data = codec.encode(pkt, self.version)
        self.out.append(data)
        self.out_pending += len(data)
        if not self.dirty:
            self.dirty = True
            self.broker.clock.call_soon(self.flush)

    def flush(self) -> None:
        self.dirty = False
        if self.out:
            data, self.out = b"".join(self.out), []
            if not self.closed or self.state == "closing":
                self._write(data)
        self.out_pending = 0
        if not self.writable and not self.paused and not self.closed:
            self.writable = True
            self._redispatch()
        if self.state == "closing":
            self.state = "closed"
            self._close_transport()

    # -- input -------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_read = self.broker.clock.time()
        if self.state == "login":  # held until the login is decided (login.py); reading is paused
            self._held_bytes.append(data)
            return
        self._guarded(lambda: self._handle_all(self.parser.feed(data)))

    def _handle(self, pkt) -> None:
        t = type(pkt)
        if self.state == "connect":
            if t is not p.Connect:
                raise Refused(f"{t.__name__.upper()} before CONNECT")
            self._connect(pkt)
            return
        if t is p.Publish:
            self._publish(pkt)
        elif t is p.Ack:
            self._ack(pkt)
        elif t is p.Subscribe:
            self._subscribe(pkt)
        elif t is p.Unsubscribe:
            self._unsubscribe(pkt)
        elif t is p.PingReq:
            self.send(p.PingResp())
        elif t is p.Disconnect:
            if pkt.properties.get("session_expiry_interval") and not self.expiry:  # MQTT-3.14.2-2
                raise Refused("session expiry in DISCONNECT after none in CONNECT", p.PROTOCOL_ERROR)
            if pkt.code != p.DISCONNECT_WITH_WILL:
                self.will = None
            if pkt.properties.get("session_expiry_interval") == 0:  # MQTT 5: the session ends now
                self.persistent = False
            log.info("closing MQTT connection %s (client id '%s'): DISCONNECT from the client",
                     self.name, logsafe(self.client_id))
            self.close()
        elif t is p.Connect:
            raise Refused("second CONNECT")
        elif t is p.Auth:  # its CONNECT had no Authentication Method (those are refused): 0x82
            raise Refused("AUTH packet: enhanced authentication is not supported", p.PROTOCOL_ERROR)
        else:
            raise Refused(f"unexpected {t.__name__.upper()}")

    def _refuse(self, text: str, code: int) -> None:
        log.info("closing MQTT connection %s (client id '%s'): %s", self.name,
                 logsafe(self.client_id), logsafe(text))
        if self.version == p.V5 and self.state == "open":
            self.send(p.Disconnect(code, {"reason_string": text[:200]}))
        self.close()

    # -- CONNECT -----------------------------------------------------------------------------------
    def _connect(self, c: p.Connect) -> None:
        self.version = c.version
        settings = self.hub.settings
        v5 = c.version == p.V5
        expiry = c.properties.get("session_expiry_interval", 0) if v5 else None
        persistent = bool(expiry) if v5 else not c.clean_start
        client_id, assigned = c.client_id, False
        if not client_id:
            if not c.clean_start and not v5:
                return self._connack_refused(p.CLIENT_ID_NOT_VALID, "empty client id with clean session off")
            client_id, assigned = f"mqtt-{uuid.uuid4().hex}", True
        self.client_id = client_id
        if v5 and "authentication_method" in c.properties:  # no enhanced authentication (AUTH)
            log.info("MQTT connection %s refused: authentication method '%s' is not supported", self.name,
                     logsafe(c.properties["authentication_method"]))
            return self._connack_refused(p.BAD_AUTHENTICATION_METHOD,
                                         "enhanced authentication (AUTH) is not supported")
        if v5 and "authentication_data" in c.properties:  # MQTT-3.1.2.11.10: data without a method
            return self._connack_refused(p.PROTOCOL_ERROR, "authentication data without a method")
        name = c.username
        password = c.password.decode("utf-8", "replace") if c.password is not None else None
        if name is None and password is None and settings.allow_anonymous:
            name, password = settings.default_user, settings.default_pass
        # "vhost:user" (an OAuth 2.0 token's user name too), the port's vhost, or mqtt.vhost
        vhost, name = vhost_choice.choose(name, self.listener[1], settings)
        # the token is the password, the user name may be anything (RabbitMQ's oauth2 with MQTT)
        self._login(name or "", password or "",
                    lambda result: self._logged_in(c, result, vhost, persistent, expiry, assigned))

    def _logged_in(self, c: p.Connect, result, vhost: str, persistent: bool, expiry, assigned: bool) -> None:
        if self._login_refused(result):
            return
        settings = self.hub.settings
        v5 = c.version == p.V5
        client_id, user = self.client_id, result.name
        self.auth_user, self.authz = result, result.authz
        try:
            self.broker.open_vhost(user, vhost, self.authz)
        except AMQPError as err:
            log.info("MQTT connection %s refused: user '%s', vhost '%s': %s", self.name, logsafe(user),
                     logsafe(vhost), logsafe(err.text))
            return self._connack_refused(p.NOT_AUTHORIZED, "")
        self.user, self.vhost = user, self.broker.vhosts[vhost]
        self.keep_alive, self.clean, self.will = c.keep_alive, c.clean_start, c.will
        self.persistent, self.expiry = persistent, expiry
        if v5:
            self.receive_max = min(settings.prefetch, c.properties.get("receive_maximum", 65535))
            self.client_max_packet = c.properties.get("maximum_packet_size", 0)
            self.alias_max_out = min(c.properties.get("topic_alias_maximum", 0), settings.topic_alias_maximum)
        if self.will is not None and not topics.valid_name(self.will.topic):
            raise Refused("invalid will topic", p.TOPIC_NAME_INVALID)
        old = self.hub.clients.get((vhost, client_id))
        if old is not None and old is not self:
            old.taken_over()
        self.hub.clients[(vhost, client_id)] = self
        delayed_will = self.hub.pending_wills.pop((vhost, client_id), None)
        if delayed_will is not None:  # back before its will delay ran out: no will
            delayed_will.cancel()
        if c.clean_start:  # a clean start forgets the previous session's subscriptions
            for qos in (0, 1):
                q = self.vhost.queues.get(subs.queue_name(client_id, qos))
                if q is not None and not q.consumers:
                    self.vhost.remove_queue(q)
        present = any(subs.queue_name(client_id, qos) in self.vhost.queues for qos in (0, 1))
        self.filters = subs.own_filters(self)
        self.filters_changed()
        self.state = "open"
        self.parser.max_packet_size = self.hub.settings.max_packet_size
        props = {}
        if v5:
            props = {"topic_alias_maximum": settings.topic_alias_maximum, "retain_available": 1,
                     "wildcard_subscription_available": 1, "subscription_identifier_available": 1,
                     "shared_subscription_available": 1, "maximum_packet_size": settings.max_packet_size,
                     "receive_maximum": 65535}
            if assigned:
                props["assigned_client_identifier"] = client_id
        self.send(p.ConnAck(present and not c.clean_start, p.SUCCESS, props))
        log.info("MQTT connection %s opened: %s, client id '%s', user '%s', vhost '%s'", self.name,
                 p.VERSION_TEXT[self.version], logsafe(client_id), logsafe(user), logsafe(vhost))
        self.hub.sessions.add(self)
        self.broker.sessions.add(self)  # connection limits, resource alarms, the admin API
        self.connected_at = int(time.time() * 1000)
        self._arm_expiry()
        for qos in (0, 1):  # a persistent session's queues deliver again at once
            q = self.vhost.queues.get(subs.queue_name(client_id, qos))
            if q is not None:
                self._consume(q, qos)

    def _connack_refused(self, code: int, text: str) -> None:
        props = {"reason_string": text} if text and self.version == p.V5 else {}
        self.send(p.ConnAck(False, code, props))
        self.close(publish_will=False)

    # -- deliveries: delivery.py ---------------------------------------------------------------------
    def _consume(self, q, qos: int) -> None:
        if q.name in self.consumers:
            return
        perms.check(self, perms.READ, "queue", q.name)
        c = subs.MQTTConsumer(self, q, qos)
        self.consumers[q.name] = c
        q.add_consumer(c)
        if self.broker_in_cluster:
            self.check_cluster_takeover()

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------------------------
    def _subscribe(self, s: p.Subscribe) -> None:
        subscribe(self, s)

    def _unsubscribe(self, u: p.Unsubscribe) -> None:
        unsubscribe(self, u)

    # -- the core's Connection port ------------------------------------------------------------------
    def block(self, reason: str) -> None:
        if not self.blocked and not self.closed:
            self.blocked = True
            self._update_reading()

    def unblock(self) -> None:
        if self.blocked:
            self.blocked = False
            self._update_reading()

    def server_close(self, code: int, text: str) -> None:
        """Closed by the broker (the admin API, a deleted user or vhost): the will goes out."""
        log.info("closing MQTT connection %s (client id '%s'): %s", self.name,
                 logsafe(self.client_id), logsafe(text))
        if self.version == p.V5 and self.state == "open":
            self.send(p.Disconnect(p.ADMINISTRATIVE_ACTION, {"reason_string": text[:200]}))
        self.close()

    def shutdown(self) -> None:
        """The broker stops: no failure of the client, so no will (a persistent session stays)."""
        if self.version == p.V5 and self.state == "open":
            self.send(p.Disconnect(p.SERVER_SHUTTING_DOWN))
        self.close(publish_will=False)

    def check_consumer_timeouts(self, now: float, default_ms: int) -> None:
        pass  # MQTT has no consumer timeout: a client that does not PUBACK holds its quota

    def nack_overdue_confirms(self, now: float, bound: float) -> None:
        pass  # a QoS 1 PUBLISH waits for its PUBACK until the store has it (MQTT 3 has no nack)

    def _update_reading(self) -> None:
        want = not self.throttled_by and not self.blocked and not self.closed and not self.paused \
            and self.state != "login"
        if want != self.reading:
            self.reading = want
            self._set_reading(want)

    # -- the admin API (/api/connections) ------------------------------------------------------------
    @property
    def listener_name(self) -> str:
        return f"{self.listener[0]}:{self.listener[1]}"

    def admin_info(self) -> dict:
        host, port = self.listener
        state = "blocked" if self.blocked else "running" if self.reading else "flow"
        return {"name": f"{self.name} -> {self.listener_name}", "protocol": p.VERSION_TEXT[self.version],
                "vhost": self.vhost.name, "user": self.user, "user_who_performed_action": self.user,
                "host": host, "port": port, "peer_host": self.peer[0], "peer_port": self.peer[1],
                "state": "closing" if self.closed else state, "channels": 0, "channel_max": 0,
                "frame_max": self.hub.settings.max_packet_size, "timeout": self.keep_alive,
                "client_properties": {"client_id": self.client_id}, "user_provided_name": self.client_id,
                "auth_mechanism": "PLAIN", "ssl": self.tls, "connected_at": self.connected_at}

    # -- keep-alive, takeover, close -------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.closed:
            return
        if self.state == "login":
            return  # the backend's answer comes within --auth-timeout (auth/offload.py)
        if self.state == "connect":
            if now - self.opened_at > self.hub.settings.connect_timeout:
                self._refuse("no CONNECT in time", p.PROTOCOL_ERROR)
            return
        if not self.reading:
            self.last_read = now  # not reading: the silence is ours
        elif self.keep_alive and now - self.last_read > 1.5 * self.keep_alive:
            self._refuse(f"keep-alive of {self.keep_alive} s timed out", p.KEEP_ALIVE_TIMEOUT)
        if self.broker_in_cluster and not self.closed:
            self.check_cluster_takeover()

    def taken_over(self) -> None:
        log.info("MQTT connection %s: client id '%s' taken over by a new connection", self.name,
                 logsafe(self.client_id))
        if self.version == p.V5:
            self.send(p.Disconnect(p.SESSION_TAKEN_OVER))
        self.close()

    def connection_lost(self) -> None:
        if not self.closed and self.state == "open":
            log.info("closing MQTT connection %s (client id '%s'): client closed the TCP connection",
                     self.name, logsafe(self.client_id))
        self.close(transport_gone=True)

    def close(self, publish_will: bool = True, transport_gone: bool = False) -> None:
        """Release everything (idempotent): the will goes out unless DISCONNECT cleared it, QoS 1
        deliveries not acknowledged go back to their queues, a clean session's queues go."""
        if self.closed:
            return
        self.closed = True
        was_open = self.vhost is not None and self.state == "open"
        self.state = "closed" if transport_gone else "closing"
        if was_open and publish_will and self.will is not None:
            self._publish_will()
        self.will = None
        self._disarm_expiry()
        self._release()
        if was_open and self.hub.clients.get((self.vhost.name, self.client_id)) is self:
            del self.hub.clients[(self.vhost.name, self.client_id)]
        self.hub.sessions.discard(self)
        self.broker.sessions.discard(self)
        if not transport_gone:
            self.flush()

    def _release(self) -> None:
        back: dict = {}
        for msg, consumer in self.unacked.values():
            if msg is not None:
                consumer.unacked -= 1
                msg.queue.unacked -= 1
                back.setdefault(msg.queue, []).append(msg)
        self.unacked.clear()
        for q, msgs in back.items():
            if not q.deleted:
                q.requeue(msgs)
        for c in list(self.consumers.values()):
            c.active = False
            c.queue.remove_consumer(c)
        self.consumers.clear()
        for q in list(self.throttled_by):
            q.flow_blocked.discard(self)
        self.throttled_by.clear()
        if self.vhost is not None and not self.persistent:
            for qos in (0, 1):
                q = self.vhost.queues.get(subs.queue_name(self.client_id, qos))
                if q is not None and not q.consumers:
                    self.vhost.remove_queue(q)
