"""The chain of authentication backends (RabbitMQ's ``auth_backends.1 = internal`` ...).

A backend answers a login (user name, password, peer address) with one of three things:

* an :class:`AuthenticatedUser` (allowed): the user's name, its tags, and an ``authz`` that
  answers the permission questions for the rest of the connection (``None``: the broker's own
  permission tables, as for users stored in the broker);
* :class:`LoginRefused` raised (refused): the credentials are the backend's and are wrong;
* ``None`` (not mine): the backend has nothing to say (an unknown user, a password that is not
  a token).

The chain asks the backends in order; as in RabbitMQ (``rabbit_access_control``), a refusal does
not end the walk: the next backend is asked, and the first that allows wins. When none does, the
login is refused and the reasons are logged, each with the backend that gave it.

Backends that need the network (the JWKS of an OAuth 2.0 issuer, an LDAP server) say so with
``needs_io``; the chain then hands their ``login`` to an ``offload`` function given by the server
layer (it runs it off the event loop, with a timeout, and calls back on the loop). This module
stays pure: no threads, no sockets, no asyncio.

The one entry point every protocol uses is :meth:`Broker.login` (``core/broker.py``), which calls
:meth:`AuthChain.login` here; ``exchange_broker.auth.offload.authenticate`` wraps it in a coroutine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


CONFIGURE, WRITE, READ = "configure", "write", "read"


class Authz(Protocol):
    """What an external backend grants a logged-in user (permission names: configure/write/read)."""

    def vhost_access(self, vhost: str) -> bool: ...

    def resource_access(self, vhost: str, kind: str, name: str, permission: str) -> bool: ...

    def topic_access(self, vhost: str, exchange: str, routing_key: str, permission: str) -> bool: ...


@dataclass
class AuthenticatedUser:
    name: str
    tags: list[str] = field(default_factory=list)
    backend: str = "internal"
    authz: Any = None               # an Authz, or None: the broker's own permission tables
    expires_at: float | None = None  # wall-clock seconds (a token's exp), None: never
    credential: Any = None           # what the backend keeps to re-check the user (a decoded token)


def expiry_timer(clock, user: AuthenticatedUser | None, fn: Callable[[], None]):
    """A timer calling ``fn`` when ``user``'s credential expires (None: it never does); both
    AMQP and MQTT connections close then, as RabbitMQ's readers do."""
    expires = user.expires_at if user is not None else None
    if expires is None:
        return None
    return clock.call_later(max(0.0, expires - clock.wall()), fn)


class LoginRefused(Exception):
    """A login refused; ``reasons`` are (backend, why) pairs, for the log (never for the client)."""

    def __init__(self, reasons: list[tuple[str, str]], client_text: str | None = None) -> None:
        self.reasons = reasons
        self.client_text = client_text  # what the client is told, when not the generic refusal
        super().__init__("; ".join(f"{b}: {r}" for b, r in reasons) or "no backend")


class BackendRefusal(Exception):
    """Raised by a backend's ``login``: the credentials are its own and they are wrong."""


class Backend(Protocol):
    name: str

    def needs_io(self, username: str, password: str | None) -> bool:
        """True when ``login`` would wait on the network (it is then run off the event loop)."""

    def login(self, username: str, password: str | None, peer_host: str) -> AuthenticatedUser | None:
        """Allowed (a user), not mine (None), or refused (raise BackendRefusal)."""


Done = Callable[[Any], None]            # called with an AuthenticatedUser or a LoginRefused
Offload = Callable[[Callable[[], Any], Callable[[Any], None]], None]  # fn, on_done(result|exception)


def run_inline(fn: Callable[[], Any], on_done: Callable[[Any], None]) -> None:
    """The offload of a broker without an event loop (tests, tools): run now, on this thread."""
    try:
        result = fn()
    except Exception as exc:  # handed to on_done like the executor's
        result = exc
    on_done(result)


class AuthChain:
    def __init__(self, backends: list, offload: Offload | None = None) -> None:
        self.backends = list(backends)
        self.offload = offload or run_inline

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def login(self, username: str, password: str | None, peer_host: str, done: Done,
              backends: list | None = None) -> None:
        """Walk the chain; ``done`` gets the user or a LoginRefused. ``done`` is called before
        this returns when no backend needed the network, later (on the loop) otherwise."""
        self._step(list(self.backends if backends is None else backends), 0, username, password,
                   peer_host, [], done)

    def _step(self, backends, i, username, password, peer_host, reasons, done) -> None:
        while i < len(backends):
            backend = backends[i]
            i += 1
            if password is None and backend.name != "internal":
                continue  # EXTERNAL (a certificate) is for the broker's own users only
            if backend.needs_io(username, password):
                def finished(result, backend=backend, i=i) -> None:
                    if self._settle(backend, result, reasons, done):
                        return
                    self._step(backends, i, username, password, peer_host, reasons, done)
                self.offload(lambda backend=backend: backend.login(username, password, peer_host),
                             finished)
                return
            try:
                result = backend.login(username, password, peer_host)
            except Exception as exc:
                result = exc
            if self._settle(backend, result, reasons, done):
                return
        done(LoginRefused(reasons or [("chain", "no backend knows the user")]))

    @staticmethod
    def _settle(backend, result, reasons: list, done: Done) -> bool:
        """True when ``result`` ends the walk (allowed)."""
        if isinstance(result, AuthenticatedUser):
            if not result.backend or result.backend == "internal":
                result.backend = backend.name
            done(result)
            return True
        if isinstance(result, BackendRefusal):
            reasons.append((backend.name, str(result)))
        elif isinstance(result, Exception):  # a backend's failure (network down, a bug) refuses
            reasons.append((backend.name, f"error: {result or type(result).__name__}"))
        return False


class InternalBackend:
    """The users, passwords and permissions stored in the broker (``rabbit_auth_backend_internal``)."""

    name = "internal"

    def __init__(self, broker) -> None:
        self.broker = broker

    def needs_io(self, username: str, password: str | None) -> bool:
        return False

    def login(self, username: str, password: str | None, peer_host: str) -> AuthenticatedUser | None:
        broker = self.broker
        if broker.is_internal_user(username):
            if password is not None and broker.check_link_password(password, username):
                return AuthenticatedUser(username, [])  # AMQP within the broker only: no admin API tags
            raise BackendRefusal(f"wrong password for the internal user '{username}'")
        user = broker.users.get(username)
        if user is None:
            return None
        if password is not None and not user.check(password):
            raise BackendRefusal(f"invalid credentials for user '{username}'")
        return AuthenticatedUser(username, list(user.tags))
