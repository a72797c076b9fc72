"""What every resource module of the admin API shares.

* :class:`AdminContext`: the broker, the AMQP listener (for connection names), start time and rates.
* :class:`ServiceError` and the helpers making RabbitMQ's error bodies (404, 400, 401).
* :class:`Principal`: the authenticated API user.
* Lookups that answer 404 / 401 the way RabbitMQ does, and the permission checks (the rule itself
  lives in ``core/permissions.py``; this only turns a refusal into the API's 401).

Everything here is synchronous and runs on the broker's event loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from exchange_broker.core import permissions
from exchange_broker.management.samples import DEFAULT_INTERVAL, Rates
from exchange_broker.protocol.constants import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, RESOURCE_LOCKED
from exchange_broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from exchange_broker.core.broker import Broker
    from exchange_broker.core.vhost import VHost

NODE = "exchange-broker@localhost"
PRODUCT = "exchange-broker"
CLUSTER_NAME = "exchange-broker"
RABBIT_COMPAT_VERSION = "3.13.0"   # the RabbitMQ release whose management API this mirrors
CONFIGURE, WRITE, READ = permissions.CONFIGURE, permissions.WRITE, permissions.READ


class AdminContext:
    """The admin API's state. ``amqp_server`` (optional) tells connection listings the listener."""

    ui_oauth: dict | None = None  # the web UI's single sign-on settings (GET /api/auth)

    def __init__(self, broker: "Broker", amqp_server: Any = None, *,
                 sample_interval: float = DEFAULT_INTERVAL) -> None:
        self.broker = broker
        self.amqp_server = amqp_server
        self.started_at = time.time()
        self.rates = Rates(sample_interval)
        self.cluster: Any = None  # with --cluster: has ``name`` and ``async nodes()`` (every node)
        self.movers: Any = None  # movers.parameters.Parameters: shovels and their runtime parameters

    def sample(self) -> None:
        """Record counters and queue lengths (the admin server calls this every ``sample_interval`` s)."""
        self.rates.sample(self.broker)

    def uptime_ms(self) -> int:
        return int((time.time() - self.started_at) * 1000)


# ---- errors ------------------------------------------------------------------------------------
class ServiceError(Exception):
    """An API failure: HTTP ``status`` and RabbitMQ's ``{"error": ..., "reason": ...}`` body."""

    def __init__(self, status: int, error: str, reason: Any) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason

    def body(self) -> dict:
        return {"error": self.error, "reason": self.reason}


def not_found(reason: str = "Not Found") -> ServiceError:
    return ServiceError(404, "Object Not Found", reason)


def bad_request(reason: Any) -> ServiceError:
    return ServiceError(400, "bad_request", reason)


def not_authorised(reason: str = "Access refused.") -> ServiceError:
    return ServiceError(401, "not_authorised", reason)


def from_amqp(err: AMQPError, *, refused_is_auth: bool = True) -> ServiceError:
    """Map an AMQP reply code to what RabbitMQ's management API answers."""
    if err.code == NOT_FOUND:
        return not_found(err.text)
    if err.code == ACCESS_REFUSED and refused_is_auth:
        return not_authorised(err.text)  # RabbitMQ: 401 not_authorised for reserved names
    if err.code in (PRECONDITION_FAILED, RESOURCE_LOCKED, ACCESS_REFUSED):
        return bad_request(err.text)
    return bad_request(err.reply_text)


# ---- the user ----------------------------------------------------------------------------------
class Principal:
    """An authenticated API user: its tags and the vhosts it has permissions in."""

    def __init__(self, name: str, tags: list[str], vhosts: set[str], authz=None) -> None:
        self.name = name
        self.tags = list(tags)
        self.vhosts = vhosts
        self.authz = authz  # an external backend's grants (OAuth 2.0 scopes, LDAP), else None

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.tags

    @property
    def sees_all(self) -> bool:
        return self.is_admin or "monitoring" in self.tags

    def can_see(self, vhost: str) -> bool:
        return self.sees_all or vhost in self.vhosts

    def can_change(self, vhost: str) -> bool:
        return self.is_admin or vhost in self.vhosts


# ---- lookups -----------------------------------------------------------------------------------
def exchange_name(name: str) -> str:
    """The default exchange is ``amq.default`` in the API's paths and ``""`` inside the broker."""
    return "" if name == "amq.default" else name


def find_vhost(broker: "Broker", name: str) -> "VHost":
    vh = broker.vhosts.get(name)
    if vh is None:
        raise not_found()
    return vh


def visible_vhosts(broker: "Broker", vhost: str | None, who: Principal | None) -> list["VHost"]:
    """The one vhost asked for (404 / 401), or every vhost ``who`` may see."""
    if vhost is not None:
        vh = find_vhost(broker, vhost)
        if who is not None and not who.can_see(vhost):
            raise not_authorised()
        return [vh]
    return [vh for name, vh in broker.vhosts.items() if who is None or who.can_see(name)]


def find_queue(broker: "Broker", vhost: str, name: str):
    q = find_vhost(broker, vhost).queues.get(name)
    if q is None:
        raise not_found()
    return q


def find_exchange(broker: "Broker", vhost: str, name: str):
    ex = find_vhost(broker, vhost).exchanges.get(exchange_name(name))
    if ex is None:
        raise not_found()
    return ex


def is_stream(q) -> bool:
    return getattr(q, "queue_type", "classic") == "stream"


# ---- permission checks -------------------------------------------------------------------------
def check_admin(who: Principal | None) -> None:
    if who is not None and not who.is_admin:
        raise not_authorised()


def check_resource(broker: "Broker", who: Principal | None, vhost: str, perm: int, kind: str,
                   name: str) -> None:
    """A non-administrator needs the vhost's configure, write or read permission on the resource
    (core/permissions.py decides); a refusal is RabbitMQ's 401 with the AMQP refusal text."""
    if who is None or who.is_admin:
        return
    if not permissions.allowed(broker, who.name, vhost, kind, name, perm, who.authz):
        raise not_authorised(permissions.refused(who.name, vhost, kind, name).text)


def check_binding(broker: "Broker", who: Principal | None, vhost: str, source: str, dest_type: str,
                  dest: str) -> None:
    check_resource(broker, who, vhost, WRITE, dest_type, dest)
    check_resource(broker, who, vhost, READ, "exchange", source)
