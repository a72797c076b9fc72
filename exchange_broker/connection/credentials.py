"""A connection's credentials after the handshake's login: the answer of the backend chain
(``core/auth_backends.py``) when it comes later (a backend asked the network), a credential that
expires (an OAuth 2.0 token: the connection is closed then, 320 "credential expired", as
RabbitMQ's reader does), and ``connection.update-secret`` (the same backend checks the new one).
A mixin of ``Session``: it uses the session's protocol connection, clock and close paths."""

from __future__ import annotations

import logging

from pamqp import commands

from exchange_broker.core.auth_backends import LoginRefused, expiry_timer
from exchange_broker.core.names import logsafe
from exchange_broker.protocol import events as ev
from exchange_broker.protocol.constants import ACCESS_REFUSED, CONNECTION_FORCED, NOT_ALLOWED
from exchange_broker.protocol.errors import AMQPError

log = logging.getLogger("exchange_broker.session")


class Credentials:
    def _login_result(self, result, mechanism: str) -> str:
        """The chain's answer (core/auth_backends.py): the user name, or the refusal (403)."""
        if isinstance(result, LoginRefused):  # the broker logged why; the client sees the log hint
            raise AMQPError(ACCESS_REFUSED, result.client_text or "Login was refused", 10, 11, hard=True)
        self.auth_user = result
        self.authz = result.authz
        return result.name

    def login_decided(self, result) -> None:
        """The answer of a login that needed the network arrives (on the event loop)."""
        if not self._login_waiting or self.closed:
            return
        self._login_waiting = False
        try:
            user = self._login_result(result, self.auth_mechanism)
        except AMQPError as err:
            for event in self.conn.refuse_login(err):  # as a refusal in the handshake is handled
                self._handle(event)
            self.mark_dirty()
            return
        self.conn.login_done(user)
        self.mark_dirty()
        self.data_received(b"")  # what the client sent meanwhile

    # -- credentials that expire (OAuth 2.0 tokens) -------------------------------------------
    def _arm_expiry(self) -> None:
        """As RabbitMQ's reader: a credential with an expiry closes the connection then (320
        "credential expired"); update-secret re-arms it."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._expiry = expiry_timer(self.broker.clock, self.auth_user, self._credential_expired)

    def _credential_expired(self) -> None:
        self._expiry = None
        if self.closed or self.conn.state in ("closing", "closed"):
            return
        log.warning("closing connection %s of user '%s': credential has expired", self.name,
                    logsafe(self.user or ""))
        self.server_close(CONNECTION_FORCED, "credential expired")

    def _update_secret(self, event: ev.UpdateSecret) -> None:
        """connection.update-secret: the backend that logged the user in checks the new secret;
        refused: 530 "New secret was refused by one of the backends" (RabbitMQ's words)."""
        if self.auth_user is None or self.auth_user.backend == "internal":
            self.conn.send_method(0, commands.Connection.UpdateSecretOk())  # the internal backend keeps its state (RabbitMQ: ok)
            return
        host = self.peer[0] if self.peer else ""
        secret = event.secret.decode("utf-8", "replace") if isinstance(event.secret, bytes) else event.secret
        self.broker.update_secret(self.auth_user, secret, host, lambda r: self._secret_decided(r, event.reason))

    def _secret_decided(self, result, reason: str) -> None:
        if self.closed or self.conn.state != "opened":
            return
        if isinstance(result, LoginRefused):
            log.error("secret update was refused for user '%s' on connection %s: %s",
                      logsafe(self.user or ""), self.name, logsafe(str(result)))
            self._error(0, AMQPError(NOT_ALLOWED, "New secret was refused by one of the backends",
                                     10, 70, hard=True))
            return
        self.auth_user = result
        self.authz = result.authz
        self._perm_cache = None
        self._arm_expiry()
        log.info("connection %s: user '%s' updated secret, reason: %s", self.name,
                 logsafe(self.user or ""), logsafe(reason))
        self.conn.send_method(0, commands.Connection.UpdateSecretOk())
        self.mark_dirty()
