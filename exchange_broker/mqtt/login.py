"""The login of an MQTT connection, a part of ``session.py``: CONNECT's credentials go to
``Broker.login``, the one entry point of every protocol (the backend chain: internal, OAuth 2.0
tokens, LDAP). When a backend asks the network the answer comes later, on the event loop; the
session is then in state ``login``: it stops reading and holds what the client sent after its
CONNECT, then handles it in order once the login is decided (as the AMQP session does).

The result's ``authz`` stays on the session (``core/permissions`` reads ``session.authz``: OAuth
2.0 scopes and LDAP queries decide publish and subscribe), and a credential that expires (a
token's ``exp``) closes the connection then, as RabbitMQ's MQTT reader does: MQTT 5 clients get
DISCONNECT 0xA0 (maximum connect time), and a token already expired is refused (0x87).
"""

from __future__ import annotations

import logging
from collections import deque

from exchange_broker.core.auth_backends import LoginRefused, expiry_timer
from exchange_broker.core.names import logsafe
from exchange_broker.mqtt import packets as p
from exchange_broker.mqtt.publish import Refused
from exchange_broker.mqtt.wire import MalformedPacket

log = logging.getLogger("exchange_broker.mqtt")

MAXIMUM_CONNECT_TIME = 0xA0  # MQTT 5 DISCONNECT reason: RabbitMQ's on an expired credential


class MQTTLogin:
    def _init_login(self) -> None:
        self.auth_user = None     # core/auth_backends.AuthenticatedUser, once logged in
        self.authz = None         # an external backend's grants (None: the broker's tables)
        self._login_waiting = False
        self._held: deque = deque()       # packets parsed after CONNECT while the login is pending
        self._held_bytes: list[bytes] = []  # bytes received meanwhile (reading is paused)
        self._expiry = None       # the credential's expiry timer

    def _login(self, name: str, password: str, then) -> None:
        """``then(result)`` with an AuthenticatedUser or a LoginRefused: now, or later on the
        loop when a backend asks the network (the session holds its input until then)."""
        decided: list = []
        self.broker.login(name, password, self.peer[0], "PLAIN",
                          lambda r: self._login_decided(r, then) if self._login_waiting else decided.append(r),
                          self.name)
        if decided:
            then(decided[0])
            return
        self._login_waiting = True
        self.state = "login"
        self._update_reading()

    def _login_decided(self, result, then) -> None:
        if not self._login_waiting or self.closed:
            return
        self._login_waiting = False
        self.state = "connect"
        held = list(self._held)
        self._held.clear()
        self._guarded(lambda: then(result))
        if self.closed:
            return
        self._update_reading()
        self._guarded(lambda: self._handle_all(held))
        if self._held_bytes and not self.closed:
            data = b"".join(self._held_bytes)
            self._held_bytes.clear()
            self.data_received(data)

    def _handle_all(self, packets) -> None:
        for pkt in packets:
            if self.state == "login":  # (a second CONNECT is refused before this can happen)
                self._held.append(pkt)
                continue
            self._handle(pkt)
            if self.closed:
                return

    def _guarded(self, fn) -> None:
        """Run ``fn``; a refusal or a bug closes this connection only."""
        try:
            fn()
        except (MalformedPacket, Refused) as exc:
            self._refuse(str(exc), exc.code)
        except Exception:  # a bug must never take the server down: close this connection only
            log.exception("internal error on MQTT connection %s", self.name)
            self._refuse("internal error", p.IMPLEMENTATION_SPECIFIC)

    def _login_refused(self, result) -> bool:
        """True (the CONNACK refusal sent) when the login was refused or its credential expired."""
        if isinstance(result, LoginRefused):  # Broker.login logged why, with each backend's reason
            self._connack_refused(p.BAD_USER_NAME_OR_PASSWORD, "")
            return True
        if result.expires_at is not None and result.expires_at <= self.broker.clock.wall():
            log.warning("MQTT connection %s refused: the credential of user '%s' has expired", self.name,
                        logsafe(result.name))
            self._connack_refused(p.NOT_AUTHORIZED, "")
            return True
        return False

    # -- credentials that expire (OAuth 2.0 tokens) -----------------------------------------------
    def _arm_expiry(self) -> None:
        self._expiry = expiry_timer(self.broker.clock, self.auth_user, self._credential_expired)

    def _credential_expired(self) -> None:
        self._expiry = None
        if self.closed:
            return
        log.warning("closing MQTT connection %s (client id '%s') of user '%s': credential has expired",
                    self.name, logsafe(self.client_id), logsafe(self.user or ""))
        if self.version == p.V5 and self.state == "open":
            self.send(p.Disconnect(MAXIMUM_CONNECT_TIME, {"reason_string": "credential expired"}))
        self.close()

    def _disarm_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
