"""BrokerService: the one facade over a Broker that the admin HTTP API, metrics and CLI use.

Everything here is synchronous and must run on the broker's event loop (the HTTP
server runs in that same loop, so request handlers call straight in). Declarations,
deletions and bindings go through the VHost methods, which carry RabbitMQ's rules
and tell the durability layer what to store; publishing goes through
``Broker.publish`` like an AMQP basic.publish does.

Results are plain JSON-ready dicts with RabbitMQ's management field names. Failures
raise :class:`ServiceError` carrying the HTTP status and RabbitMQ's error body.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import json
import math
import re
import time
from collections import deque
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from exchange_broker import __version__
from exchange_broker.core.auth import HASHING_SHA256, User
from exchange_broker.core.message import Message
from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import (ACCESS_REFUSED, CONNECTION_FORCED, NOT_FOUND, PRECONDITION_FAILED,
                                 RESOURCE_LOCKED)
from exchange_broker.protocol.errors import AMQPError

if TYPE_CHECKING:
    from exchange_broker.core.broker import Broker
    from exchange_broker.queue_types.classic import Queue
    from exchange_broker.core.vhost import VHost

NODE = "exchange-broker@localhost"
PRODUCT = "exchange-broker"
RABBIT_COMPAT_VERSION = "3.13.0"   # the RabbitMQ release whose management API this mirrors
MANAGEMENT_TAGS = ("administrator", "monitoring", "policymaker", "management")
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
MAX_GET_COUNT = 100_000
AMQP_INT_MIN, AMQP_INT_MAX = -2 ** 63, 2 ** 64 - 1
MAX_NESTING = 32
CONFIGURE, WRITE, READ = 0, 1, 2   # positions in Broker.permissions values

# AMQP basic properties as RabbitMQ's JSON names them -> pamqp's names
_PROPS = {"content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
          "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
          "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id",
          "timestamp": "timestamp", "type": "message_type", "user_id": "user_id", "app_id": "app_id"}
_PROPS_BACK = {v: k for k, v in _PROPS.items()}
_SHORTSTR_PROPS = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                   "message_id", "type", "user_id", "app_id")


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


# ---- JSON <-> AMQP values -----------------------------------------------------------------------
def to_json(value: Any, _depth: int = 0) -> Any:
    """An AMQP field value (bytes, Decimal, datetime, nested tables ...) as a JSON-safe value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if _depth > MAX_NESTING:
        return str(value)
    if isinstance(value, dict):
        return {_key(k): to_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v, _depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        if not value.is_finite():
            return str(value)
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return int(value.timestamp())
    if isinstance(value, _dt.date):
        return value.isoformat()
    return str(value)


def _key(k: Any) -> str:
    if isinstance(k, (bytes, bytearray)):
        return bytes(k).decode("utf-8", "replace")
    return str(k)


def check_field_value(value: Any, where: str, _depth: int = 0) -> Any:
    """A JSON value that can be an AMQP field value; raises 400 for what cannot."""
    if _depth > MAX_NESTING:
        raise bad_request(f"{where}: nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not AMQP_INT_MIN <= value <= AMQP_INT_MAX:
            raise bad_request(f"{where}: integer {value} out of range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise bad_request(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, dict):
        return {str(k): check_field_value(v, where, _depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [check_field_value(v, where, _depth + 1) for v in value]
    raise bad_request(f"{where}: unsupported value {value!r}")


def arguments_from(value: Any, where: str = "arguments") -> dict:
    """RabbitMQ accepts an object, an empty list (Erlang's empty proplist) or nothing."""
    if value is None or value == [] or value == "":
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON object")
    return check_field_value(value, where)


def bool_from(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(["not_boolean", to_json(value)])


def str_from(body: dict, key: str, default: str | None = None, *, required: bool = False) -> str:
    value = body.get(key, default)
    if value is None:
        if required:
            raise bad_request(f"[{{key_missing,{key}}}]")
        return default if default is not None else ""
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def int_from(body: dict, key: str, default: int, lo: int, hi: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_request(f"{key} must be an integer between {lo} and {hi}")
    return value


def props_key(routing_key: str, arguments: dict) -> str:
    """RabbitMQ's binding ``properties_key``: the quoted routing key, ``~`` and an arguments hash."""
    if not arguments:
        return "~" if routing_key == "" else quote(routing_key, safe="")
    canonical = json.dumps(to_json(arguments), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()[:4]
    return f"{quote(routing_key, safe='')}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def exchange_name(name: str) -> str:
    """The default exchange is ``amq.default`` in the API's paths and ``""`` inside the broker."""
    return "" if name == "amq.default" else name


class Principal:
    """An authenticated API user: its tags and the vhosts it has permissions in."""

    def __init__(self, name: str, tags: list[str], vhosts: set[str]) -> None:
        self.name = name
        self.tags = list(tags)
        self.vhosts = vhosts

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


class BrokerService:
    """The admin facade. ``amqp_server`` (optional) tells connection listings the AMQP listener."""

    def __init__(self, broker: "Broker", amqp_server: Any = None) -> None:
        self.broker = broker
        self.amqp_server = amqp_server
        self.started_at = time.time()
        self._samples: deque = deque(maxlen=4)   # (monotonic time, global counters, per-queue counters)

    # ---- authentication ------------------------------------------------------------------------
    def authenticate(self, username: str, password: str, peer_is_loopback: bool = True) -> Principal:
        user = self.broker.users.get(username)
        if user is None or not user.check(password):
            raise ServiceError(401, "not_authorized", "Login failed")
        if username in self.broker.loopback_users and not peer_is_loopback:
            raise ServiceError(401, "not_authorized", "User can only log in via localhost")
        if not any(t in MANAGEMENT_TAGS for t in user.tags):
            raise ServiceError(401, "not_authorized", "Not management user")
        vhosts = {vh for (u, vh) in self.broker.permissions if u == username}
        return Principal(username, user.tags, vhosts)

    # ---- lookups -------------------------------------------------------------------------------
    def _vhost(self, name: str) -> "VHost":
        vh = self.broker.vhosts.get(name)
        if vh is None:
            raise not_found()
        return vh

    def _vhosts(self, vhost: str | None, who: Principal | None) -> list["VHost"]:
        if vhost is not None:
            vh = self._vhost(vhost)
            if who is not None and not who.can_see(vhost):
                raise not_authorised()
            return [vh]
        return [vh for name, vh in self.broker.vhosts.items() if who is None or who.can_see(name)]

    def _queue(self, vhost: str, name: str) -> "Queue":
        q = self._vhost(vhost).queues.get(name)
        if q is None:
            raise not_found()
        return q

    def _exchange(self, vhost: str, name: str):
        ex = self._vhost(vhost).exchanges.get(exchange_name(name))
        if ex is None:
            raise not_found()
        return ex

    def check_resource(self, who: Principal | None, vhost: str, perm: int, kind: str, name: str) -> None:
        """RabbitMQ's resource permissions for a non-administrator: the vhost's configure, write or
        read pattern must match somewhere in the name (an empty pattern matches nothing)."""
        if who is None or who.is_admin:
            return
        if kind == "exchange" and name == "":
            name = "amq.default"
        pattern = self.broker.permissions.get((who.name, vhost), ("", "", ""))[perm]
        try:
            allowed = bool(pattern) and re.search(pattern, name) is not None
        except re.error:
            allowed = False
        if not allowed:
            raise not_authorised(f"access to {kind} '{name}' in vhost '{vhost}' refused for user "
                                 f"'{who.name}'")

    def check_binding(self, who: Principal | None, vhost: str, source: str, dest_type: str,
                      dest: str) -> None:
        self.check_resource(who, vhost, WRITE, dest_type, dest)
        self.check_resource(who, vhost, READ, "exchange", source)

    def check_admin(self, who: Principal | None) -> None:
        if who is not None and not who.is_admin:
            raise not_authorised()

    # ---- statistics ----------------------------------------------------------------------------
    def _global_counters(self) -> dict:
        s = self.broker.stats
        return {k: int(s.get(k, 0)) for k in ("publish", "deliver", "ack", "confirm", "return_unroutable",
                                               "get", "get_no_ack", "deliver_no_ack", "redeliver")}

    def sample(self) -> None:
        """Record counters for rates (the admin server calls this every few seconds)."""
        per_queue = {}
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                per_queue[(vh.name, q.name)] = (q.stats_published, q.stats_delivered)
        self._samples.append((time.monotonic(), self._global_counters(), per_queue))

    def _rate(self, current: float, pick) -> float:
        if not self._samples:
            return 0.0
        t0, g0, q0 = self._samples[0]
        dt = time.monotonic() - t0
        if dt < 0.5:
            return 0.0
        old = pick(g0, q0)
        if old is None:
            return 0.0
        return round(max(0.0, (current - old) / dt), 1)

    def _message_stats(self) -> dict:
        cur = self._global_counters()
        out: dict = {}
        cur["deliver_get"] = cur["deliver"] + cur["get"] + cur["deliver_no_ack"] + cur["get_no_ack"]
        for key, value in cur.items():
            out[key] = value
            if key == "deliver_get":
                def pick(g, _q):
                    return g["deliver"] + g["get"] + g["deliver_no_ack"] + g["get_no_ack"]
            else:
                def pick(g, _q, key=key):
                    return g.get(key)
            out[f"{key}_details"] = {"rate": self._rate(value, pick)}
        return out

    def _unacked(self) -> dict:
        """Per queue: (unacknowledged messages, their bytes), from the channels that hold them."""
        out: dict = {}
        for sess in list(self.broker.sessions):
            for ch in list(sess.channels.values()):
                for entry in list(ch.unacked.values()):
                    msg = entry[0]
                    q = getattr(msg, "queue", None)
                    if q is None:
                        continue
                    n, b = out.get(id(q), (0, 0))
                    out[id(q)] = (n + 1, b + len(msg.body))
        return out

    # ---- overview ------------------------------------------------------------------------------
    def overview(self, who: Principal | None = None) -> dict:
        vhosts = self._vhosts(None, who)
        unacked = self._unacked()
        ready = unack = queues = exchanges = consumers = 0
        for vh in vhosts:
            exchanges += len(vh.exchanges)
            for q in vh.queues.values():
                queues += 1
                ready += q.message_count
                unack += unacked.get(id(q), (0, 0))[0]
                consumers += len(q.consumers)
        sessions = self._sessions(who)
        channels = sum(len(s.channels) for s in sessions)
        zero = {"rate": 0.0}
        listeners = []
        if self.amqp_server is not None:
            listeners.append({"node": NODE, "protocol": "amqp", "ip_address": self.amqp_server.host,
                              "port": self.amqp_server.port})
        return {
            "management_version": RABBIT_COMPAT_VERSION,
            "rates_mode": "basic",
            "exchange_types": [{"name": t, "description": f"AMQP {t} exchange", "enabled": True}
                               for t in ("direct", "fanout", "headers", "topic",
                                         *sorted(self.broker.extra_exchange_types))],
            "product_version": __version__,
            "product_name": PRODUCT,
            "rabbitmq_version": RABBIT_COMPAT_VERSION,
            "cluster_name": "exchange-broker",
            "node": NODE,
            "disable_stats": False,
            "enable_queue_totals": True,
            "message_stats": self._message_stats(),
            "churn_rates": {},
            "queue_totals": {"messages": ready + unack, "messages_details": dict(zero),
                             "messages_ready": ready, "messages_ready_details": dict(zero),
                             "messages_unacknowledged": unack,
                             "messages_unacknowledged_details": dict(zero)},
            "object_totals": {"channels": channels, "connections": len(sessions), "consumers": consumers,
                              "exchanges": exchanges, "queues": queues},
            "statistics_db_event_queue": 0,
            "listeners": listeners,
            "contexts": [],
            "uptime": int((time.time() - self.started_at) * 1000),
        }

    def nodes(self) -> list[dict]:
        return [{"name": NODE, "type": "disc", "running": True, "uptime":
                 int((time.time() - self.started_at) * 1000), "being_drained": False}]

    # ---- vhosts --------------------------------------------------------------------------------
    def vhosts(self, who: Principal | None = None) -> list[dict]:
        unacked = self._unacked()
        return [self._vhost_info(vh, unacked) for vh in self._vhosts(None, who)]

    def vhost(self, name: str, who: Principal | None = None) -> dict:
        return self._vhost_info(self._vhosts(name, who)[0], self._unacked())

    def _vhost_info(self, vh: "VHost", unacked: dict) -> dict:
        ready = sum(q.message_count for q in vh.queues.values())
        unack = sum(unacked.get(id(q), (0, 0))[0] for q in vh.queues.values())
        return {"name": vh.name, "description": "Default virtual host" if vh.name == "/" else "",
                "tags": [], "metadata": {"description": "", "tags": []}, "tracing": False,
                "default_queue_type": "classic", "cluster_state": {NODE: "running"},
                "messages": ready + unack, "messages_ready": ready, "messages_unacknowledged": unack}

    def add_vhost(self, name: str, who: Principal | None = None) -> bool:
        self.check_admin(who)
        if not name or len(name.encode("utf-8")) > 255:
            raise bad_request("invalid vhost name")
        created = name not in self.broker.vhosts
        self.broker.add_vhost(name)
        return created

    def delete_vhost(self, name: str, who: Principal | None = None) -> None:
        self.check_admin(who)
        self._vhost(name)
        self.broker.delete_vhost(name)  # users.py: 320 to its connections, stored

    # ---- users and permissions -----------------------------------------------------------------
    def _user_info(self, u: User) -> dict:
        return {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.hashing_algorithm,
                "tags": list(u.tags), "limits": {}}

    def users(self, who: Principal | None = None) -> list[dict]:
        self.check_admin(who)
        return [self._user_info(u) for u in self.broker.users.values()]

    def user(self, name: str, who: Principal | None = None) -> dict:
        self.check_admin(who)
        u = self.broker.users.get(name)
        if u is None:
            raise not_found()
        return self._user_info(u)

    def put_user(self, name: str, body: dict, who: Principal | None = None) -> bool:
        self.check_admin(who)
        if not name:
            raise bad_request("user name must not be empty")
        tags = _tags(body.get("tags", []))
        created = name not in self.broker.users
        if body.get("password") is not None:
            self.broker.add_user(name, str_from(body, "password"), tags)
        elif body.get("password_hash") is not None:
            algo = str_from(body, "hashing_algorithm", HASHING_SHA256)
            self.broker.add_user(name, None, tags, password_hash=str_from(body, "password_hash"),
                                 hashing_algorithm=algo)
        elif not created:
            self.broker.set_user_tags(name, tags)
        else:
            raise bad_request("password or password_hash is required")
        return created

    def delete_user(self, name: str, who: Principal | None = None) -> None:
        self.check_admin(who)
        if not self.broker.delete_user(name):  # users.py: its connections get 320, stored
            raise not_found()

    def permissions(self, who: Principal | None = None, *, user: str | None = None,
                    vhost: str | None = None) -> list[dict]:
        self.check_admin(who)
        return [{"user": u, "vhost": v, "configure": c, "write": w, "read": r}
                for (u, v), (c, w, r) in self.broker.permissions.items()
                if (user is None or u == user) and (vhost is None or v == vhost)]

    def set_permission(self, vhost: str, user: str, body: dict, who: Principal | None = None) -> bool:
        self.check_admin(who)
        self._vhost(vhost)
        if user not in self.broker.users:
            raise bad_request(["no_such_user", user])
        perms = []
        for key in ("configure", "write", "read"):
            value = str_from(body, key, required=True)
            try:
                re.compile(value)
            except re.error as exc:
                raise bad_request(f"invalid regular expression for {key}: {exc}") from None
            perms.append(value)
        created = (user, vhost) not in self.broker.permissions
        self.broker.set_permissions(user, vhost, *perms)
        return created

    def clear_permission(self, vhost: str, user: str, who: Principal | None = None) -> None:
        self.check_admin(who)
        if not self.broker.clear_permissions(user, vhost):
            raise not_found()

    # ---- exchanges -----------------------------------------------------------------------------
    def _exchange_info(self, ex) -> dict:
        info = {"name": ex.name, "vhost": ex.vhost, "type": ex.type, "durable": ex.durable,
                "auto_delete": ex.auto_delete, "internal": ex.internal,
                "arguments": to_json(ex.arguments), "user_who_performed_action": "",
                "policy": None}
        stats_in, stats_out = getattr(ex, "stats_in", 0), getattr(ex, "stats_out", 0)
        if stats_in or stats_out:
            info["message_stats"] = {"publish_in": stats_in, "publish_in_details": {"rate": 0.0},
                                     "publish_out": stats_out, "publish_out_details": {"rate": 0.0}}
        return info

    def exchanges(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        return [self._exchange_info(ex) for vh in self._vhosts(vhost, who) for ex in vh.exchanges.values()]

    def exchange(self, vhost: str, name: str, who: Principal | None = None) -> dict:
        self._vhosts(vhost, who)
        return self._exchange_info(self._exchange(vhost, name))

    def declare_exchange(self, vhost: str, name: str, body: dict, who: Principal | None = None) -> bool:
        """PUT: declare (created -> True, already there and equivalent -> False)."""
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, CONFIGURE, "exchange", name)
        xtype = str_from(body, "type", "direct") or "direct"
        durable = bool_from(body, "durable", False)
        auto_delete = bool_from(body, "auto_delete", False)
        internal = bool_from(body, "internal", False)
        args = arguments_from(body.get("arguments"))
        name = exchange_name(name)
        existed = name in vh.exchanges
        try:
            vh.declare_exchange(name, xtype, False, durable, auto_delete, internal, args)
        except AMQPError as err:
            if "unknown exchange type" in err.text:
                raise bad_request(f"invalid exchange type '{xtype}'") from None
            raise from_amqp(err) from None
        return not existed

    def delete_exchange(self, vhost: str, name: str, if_unused: bool = False,
                        who: Principal | None = None) -> None:
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, CONFIGURE, "exchange", name)
        name = exchange_name(name)
        if name not in vh.exchanges:
            raise not_found()
        try:
            vh.delete_exchange(name, if_unused)
        except AMQPError as err:
            raise from_amqp(err) from None

    # ---- queues --------------------------------------------------------------------------------
    def _queue_info(self, q: "Queue", unacked: dict) -> dict:
        n_unacked, b_unacked = unacked.get(id(q), (0, 0))
        ready = q.message_count
        try:
            if getattr(q, "is_stream", False):
                b_ready = int(getattr(q, "total_bytes", 0))
            else:
                b_ready = q.bytes  # every ready message: in memory, paged to the store or held
        except Exception:
            b_ready = 0
        zero = {"rate": 0.0}
        consumers = list(q.consumers)
        key = (q.vhost, q.name)
        qtype = q.arguments.get("x-queue-type") or "classic"
        info = {
            "name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
            "exclusive": q.exclusive, "arguments": to_json(q.arguments), "node": NODE,
            "type": to_json(qtype), "state": "running", "policy": None,
            "messages": ready + n_unacked, "messages_details": dict(zero),
            "messages_ready": ready, "messages_ready_details": dict(zero),
            "messages_unacknowledged": n_unacked, "messages_unacknowledged_details": dict(zero),
            "message_bytes": b_ready + b_unacked, "message_bytes_ready": b_ready,
            "message_bytes_unacknowledged": b_unacked,
            "consumers": len(consumers),
            "consumer_capacity": 1.0 if consumers else 0, "consumer_utilisation": 1.0 if consumers else 0,
            "exclusive_consumer_tag": next((c.tag for c in consumers if c.exclusive), None),
            "message_stats": {
                "publish": q.stats_published,
                "publish_details": {"rate": self._rate(q.stats_published,
                                                       lambda g, qs: (qs.get(key) or (None, None))[0])},
                "deliver_get": q.stats_delivered,
                "deliver_get_details": {"rate": self._rate(q.stats_delivered,
                                                           lambda g, qs: (qs.get(key) or (None, None))[1])},
            },
        }
        owner = q.exclusive_owner
        if owner is not None:
            info["owner_pid_details"] = {"name": self._conn_name(owner)}
        return info

    def queues(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        unacked = self._unacked()
        return [self._queue_info(q, unacked) for vh in self._vhosts(vhost, who) for q in vh.queues.values()]

    def queue(self, vhost: str, name: str, who: Principal | None = None) -> dict:
        self._vhosts(vhost, who)
        q = self._queue(vhost, name)
        info = self._queue_info(q, self._unacked())
        info["consumer_details"] = [self._consumer_info(c) for c in q.consumers]
        return info

    def declare_queue(self, vhost: str, name: str, body: dict, who: Principal | None = None) -> bool:
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, CONFIGURE, "queue", name)
        durable = bool_from(body, "durable", False)
        auto_delete = bool_from(body, "auto_delete", False)
        args = arguments_from(body.get("arguments"))
        if not name:
            raise bad_request("queue name must not be empty")
        existing = vh.queues.get(name)
        try:
            vh.declare_queue(name, False, durable, False, auto_delete, args, owner=None)
        except AMQPError as err:
            raise from_amqp(err) from None
        return existing is None

    def delete_queue(self, vhost: str, name: str, if_empty: bool = False, if_unused: bool = False,
                     who: Principal | None = None) -> None:
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, CONFIGURE, "queue", name)
        q = vh.queues.get(name)
        if q is None:
            raise not_found()
        try:
            vh.delete_queue(name, if_unused, if_empty, owner=q.exclusive_owner)
        except AMQPError as err:
            raise from_amqp(err) from None

    # -- stream queues: log info and named consumers' stored offsets ------------------------------
    def _stream_call(self, fn, vhost: str, name: str, *args):
        self._vhost(vhost)
        try:
            return fn(vhost, name, *args)
        except KeyError:
            raise not_found() from None
        except ValueError as exc:
            raise bad_request(f"queue '{name}' in vhost '{vhost}' is not a stream queue: {exc}") from None

    def stream_info(self, vhost: str, name: str, who: Principal | None = None) -> dict:
        self.check_resource(who, vhost, READ, "queue", name)
        return self._stream_call(self.broker.stream_info, vhost, name)

    def stream_offset(self, vhost: str, name: str, consumer: str, who: Principal | None = None) -> dict:
        self.check_resource(who, vhost, READ, "queue", name)
        offset = self._stream_call(self.broker.stream_offset, vhost, name, consumer)
        if offset is None:
            raise not_found(f"no stored offset for consumer '{consumer}'")
        return {"vhost": vhost, "queue": name, "name": consumer, "offset": offset}

    def set_stream_offset(self, vhost: str, name: str, consumer: str, body: dict,
                          who: Principal | None = None) -> None:
        self.check_resource(who, vhost, READ, "queue", name)
        offset = body.get("offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise bad_request("'offset' must be a non-negative integer")
        self._stream_call(self.broker.set_stream_offset, vhost, name, consumer, offset)

    def purge_queue(self, vhost: str, name: str, who: Principal | None = None) -> int:
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, READ, "queue", name)
        q = vh.queues.get(name)
        if q is None:
            raise not_found()
        try:
            return vh.purge_queue(name, owner=q.exclusive_owner)
        except AMQPError as err:
            raise from_amqp(err, refused_is_auth=False) from None

    # ---- publish and get -----------------------------------------------------------------------
    def publish(self, vhost: str, exchange: str, body: dict, who: Principal | None = None):
        """POST .../publish: returns (routed, durability waiter or None)."""
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, WRITE, "exchange", exchange)
        ex = vh.exchanges.get(exchange_name(exchange))
        if ex is None:
            raise not_found(f"no {vh.describe('exchange', exchange_name(exchange))}")
        if ex.internal:
            raise bad_request(f"403 ACCESS_REFUSED - cannot publish to internal "
                              f"{vh.describe('exchange', ex.name)}")
        routing_key = str_from(body, "routing_key", required=True)
        if len(routing_key.encode("utf-8")) > 255:
            raise bad_request("routing_key is longer than 255 bytes")
        payload = body.get("payload")
        if not isinstance(payload, str):
            raise bad_request("[{key_missing,payload}]" if payload is None else "payload must be a string")
        encoding = str_from(body, "payload_encoding", "string")
        if encoding == "string":
            data = payload.encode("utf-8")
        elif encoding == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise bad_request("payload is not valid base64") from None
        else:
            raise bad_request(f"payload_encoding must be 'string' or 'base64', not '{encoding}'")
        raw_props, props = self._encode_properties(body.get("properties"))
        dm, prio, has_headers = codec.quick_properties(raw_props)
        msg = Message(ex.name, routing_key, raw_props, data, dm == 2, prio)
        msg._props = props
        result = self.broker.publish(vh, ex, msg, has_headers, None)
        return bool(result[0]), result[1]

    def _encode_properties(self, value: Any) -> tuple[bytes, dict]:
        if value is None or value == []:
            value = {}
        if not isinstance(value, dict):
            raise bad_request("properties must be a JSON object")
        props: dict = {}
        for key, v in value.items():
            if v is None:
                continue
            name = _PROPS.get(key)
            if name is None:
                raise bad_request(f"unknown message property '{key}'")
            if key == "headers":
                props[name] = arguments_from(v, "properties.headers")
            elif key in ("delivery_mode", "priority"):
                if isinstance(v, str) and v.isdigit():
                    v = int(v)
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
                    raise bad_request(f"properties.{key} must be an integer 0..255")
                if key == "delivery_mode" and v not in (1, 2):
                    raise bad_request("properties.delivery_mode must be 1 or 2")
                props[name] = v
            elif key == "timestamp":
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 63 // 1000:
                    raise bad_request("properties.timestamp must be an integer (seconds since the epoch)")
                props[name] = _dt.datetime.fromtimestamp(v, _dt.timezone.utc)
            else:
                if isinstance(v, (int, float)) and not isinstance(v, bool) and key == "expiration":
                    v = str(v)
                if not isinstance(v, str):
                    raise bad_request(f"properties.{key} must be a string")
                if len(v.encode("utf-8")) > 255:
                    raise bad_request(f"properties.{key} is longer than 255 bytes")
                props[name] = v
        try:
            raw = codec.encode_properties(props)
        except Exception as exc:  # pamqp: ValueError, TypeError, struct.error ...
            raise bad_request(f"invalid message properties: {exc}") from None
        return raw, props

    def get_messages(self, vhost: str, name: str, body: dict, who: Principal | None = None) -> list[dict]:
        """POST .../get: take up to ``count`` messages with RabbitMQ's ackmodes."""
        vh = self._vhost(vhost)
        self.check_resource(who, vhost, READ, "queue", name)
        q = vh.queues.get(name)
        if q is None:
            raise not_found()
        count = int_from(body, "count", 1, 0, MAX_GET_COUNT)
        if "ackmode" not in body and "requeue" in body:  # RabbitMQ < 3.7 clients
            ackmode = "ack_requeue_true" if bool_from(body, "requeue", True) else "ack_requeue_false"
        else:
            ackmode = str_from(body, "ackmode", required=True)
        if ackmode not in ACKMODES:
            raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
        encoding = str_from(body, "encoding", "auto")
        if encoding not in ("auto", "base64"):
            raise bad_request("encoding must be 'auto' or 'base64'")
        truncate = body.get("truncate")
        if truncate is not None:
            truncate = int_from(body, "truncate", 0, 0, 2 ** 62)
        if q.exclusive_owner is not None:
            raise bad_request(f"405 RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                              f"{vh.describe('queue', name)}")
        requeue = ackmode.endswith("requeue_true")
        taken: list = []
        out: list[dict] = []
        broker = self.broker
        try:
            for _ in range(count):
                msg = q.get()
                if msg is None:
                    break
                q.stats_delivered += 1
                taken.append(msg)
                out.append(self._message_info(msg, q.message_count, encoding, truncate))
        except BaseException as exc:
            if taken and not q.deleted:  # give back everything taken; nothing is lost
                q.requeue(taken)
            if isinstance(exc, AMQPError):  # e.g. a stream queue refuses basic.get
                raise from_amqp(exc, refused_is_auth=False) from None
            raise
        stats = broker.stats
        stats["get"] = stats.get("get", 0) + len(taken)
        if requeue:
            for msg in taken:
                broker.delivered(msg)
            if taken and not q.deleted:
                q.requeue(taken)
        else:
            for msg in taken:
                if ackmode.startswith("ack"):
                    broker.settle(msg)
                else:
                    broker.rejected(msg)
        return out

    def _message_info(self, msg: Message, remaining: int, encoding: str, truncate: int | None) -> dict:
        data = msg.body
        size = len(data)
        if truncate is not None and size > truncate:
            data = data[:truncate]
        payload, enc = None, "base64"
        if encoding == "auto":
            try:
                payload, enc = data.decode("utf-8"), "string"
            except UnicodeDecodeError:
                pass
        if payload is None:
            payload = base64.b64encode(data).decode("ascii")
        try:
            props = msg.props
        except AMQPError:
            props = {}
        return {"payload_bytes": size, "redelivered": bool(msg.redelivered), "exchange": msg.exchange,
                "routing_key": msg.routing_key, "message_count": remaining,
                "properties": _props_json(props), "payload": payload, "payload_encoding": enc}

    # ---- bindings ------------------------------------------------------------------------------
    def _bindings_of(self, vh: "VHost") -> list[dict]:
        out = []
        for q in vh.queues.values():  # the default exchange's implicit bindings
            out.append({"source": "", "vhost": vh.name, "destination": q.name, "destination_type": "queue",
                        "routing_key": q.name, "arguments": {}, "properties_key": props_key(q.name, {})})
        for source, dtype, dest, rk, args in vh.bindings():
            out.append({"source": source, "vhost": vh.name, "destination": dest, "destination_type": dtype,
                        "routing_key": rk, "arguments": to_json(args), "properties_key": props_key(rk, args)})
        return out

    def bindings(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        return [b for vh in self._vhosts(vhost, who) for b in self._bindings_of(vh)]

    def bindings_for(self, vhost: str, *, source: str | None = None, dest_type: str | None = None,
                     dest: str | None = None, who: Principal | None = None) -> list[dict]:
        vh = self._vhosts(vhost, who)[0]
        if source is not None:
            self._exchange(vhost, source)
            source = exchange_name(source)
        if dest is not None:
            if dest_type == "queue":
                self._queue(vhost, dest)
            else:
                self._exchange(vhost, dest)
                dest = exchange_name(dest)
        return [b for b in self._bindings_of(vh)
                if (source is None or b["source"] == source)
                and (dest is None or (b["destination"] == dest and b["destination_type"] == dest_type))]

    def binding(self, vhost: str, source: str, dest_type: str, dest: str, key: str,
                who: Principal | None = None) -> dict:
        for b in self.bindings_for(vhost, source=source, dest_type=dest_type, dest=dest, who=who):
            if b["properties_key"] == key:
                return b
        raise not_found()

    def bind(self, vhost: str, source: str, dest_type: str, dest: str, body: dict,
             who: Principal | None = None) -> str:
        """POST /api/bindings/...: returns the new binding's properties_key."""
        vh = self._vhost(vhost)
        self.check_binding(who, vhost, source, dest_type, dest)
        source = exchange_name(source)
        if source not in vh.exchanges:
            raise not_found(f"no {vh.describe('exchange', source)}")
        owner = None
        if dest_type == "queue":
            q = vh.queues.get(dest)
            if q is None:
                raise not_found(f"no {vh.describe('queue', dest)}")
            owner = q.exclusive_owner
        else:
            dest = exchange_name(dest)
            if dest not in vh.exchanges:
                raise not_found(f"no {vh.describe('exchange', dest)}")
        rk = str_from(body, "routing_key", "")
        args = arguments_from(body.get("arguments"))
        try:
            vh.bind(source, dest_type, dest, rk, args, 0, 0, owner)
        except AMQPError as err:
            raise from_amqp(err) from None
        return props_key(rk, args)

    def unbind(self, vhost: str, source: str, dest_type: str, dest: str, key: str,
               who: Principal | None = None, raw_key: str | None = None) -> None:
        vh = self._vhost(vhost)
        self.check_binding(who, vhost, source, dest_type, dest)
        matches = self.bindings_for(vhost, source=source, dest_type=dest_type, dest=dest)
        found = next((b for b in matches if b["properties_key"] == key), None)
        if found is None:  # a client that sent the routing key itself, unquoted (pyrabbit2 does)
            found = next((b for b in matches if b["properties_key"] == raw_key
                          or (not b["arguments"] and b["routing_key"] == key)), None)
        if found is None:
            raise not_found()
        src = exchange_name(source)
        dst = dest if dest_type == "queue" else exchange_name(dest)
        # find the stored arguments (not their JSON form) to remove exactly that binding
        for s, dt, d, rk, args in vh.bindings():
            if s == src and dt == dest_type and d == dst and props_key(rk, args) == found["properties_key"]:
                owner = None
                if dest_type == "queue":
                    q = vh.queues.get(dst)
                    owner = q.exclusive_owner if q is not None else None
                try:
                    vh.unbind(src, dest_type, dst, rk, args, 0, 0, owner)
                except AMQPError as err:
                    raise from_amqp(err) from None
                return
        raise not_authorised("operation not permitted on the default exchange")

    # ---- connections, channels, consumers ------------------------------------------------------
    def _sessions(self, who: Principal | None) -> list:
        out = [s for s in list(self.broker.sessions) if s.vhost is not None]
        if who is not None and not who.sees_all:
            out = [s for s in out if s.user == who.name]
        return out

    def _conn_name(self, sess) -> str:
        peer = sess.peer or ("", 0)
        if self.amqp_server is not None:
            return f"{peer[0]}:{peer[1]} -> {self.amqp_server.host}:{self.amqp_server.port}"
        return sess.name

    def _conn_info(self, sess) -> dict:
        conn = sess.conn
        peer = sess.peer or ("", 0)
        cp = to_json(getattr(sess, "client_properties", None) or {})
        if not isinstance(cp, dict):
            cp = {}
        state = conn.state
        info = {
            "name": self._conn_name(sess), "node": NODE, "type": "network", "protocol": "AMQP 0-9-1",
            "vhost": sess.vhost.name if sess.vhost is not None else None, "user": sess.user,
            "user_who_performed_action": sess.user,
            "host": self.amqp_server.host if self.amqp_server is not None else None,
            "port": self.amqp_server.port if self.amqp_server is not None else None,
            "peer_host": peer[0], "peer_port": peer[1],
            "state": "running" if state == "opened" and getattr(sess, "reading", True)
            else ("flow" if state == "opened" else state),
            "channels": len(sess.channels), "channel_max": conn.channel_max, "frame_max": conn.frame_max,
            "timeout": conn.heartbeat, "client_properties": cp,
            "user_provided_name": cp.get("connection_name"), "auth_mechanism": "PLAIN", "ssl": False,
        }
        connected_at = getattr(sess, "connected_at", None)
        if connected_at is not None:
            info["connected_at"] = connected_at
        return info

    def connections(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        if vhost is not None:
            self._vhosts(vhost, who)
        return [self._conn_info(s) for s in self._sessions(who)
                if vhost is None or s.vhost.name == vhost]

    def _find_session(self, name: str, who: Principal | None):
        for s in self._sessions(who):
            if self._conn_name(s) == name or s.name == name:
                return s
        raise not_found()

    def connection(self, name: str, who: Principal | None = None) -> dict:
        return self._conn_info(self._find_session(name, who))

    def close_connection(self, name: str, reason: str | None = None, who: Principal | None = None) -> None:
        sess = self._find_session(name, who)
        if who is not None and not who.is_admin and sess.user != who.name:
            raise not_authorised()
        sess.server_close(CONNECTION_FORCED, reason or "Closed via management plugin")

    def _channel_info(self, sess, ch) -> dict:
        cname = self._conn_name(sess)
        peer = sess.peer or ("", 0)
        return {
            "name": f"{cname} ({ch.number})", "number": ch.number, "node": NODE,
            "vhost": sess.vhost.name if sess.vhost is not None else None, "user": sess.user,
            "user_who_performed_action": sess.user,
            "connection_details": {"name": cname, "peer_host": peer[0], "peer_port": peer[1]},
            "state": "running" if ch.flow_active else "flow", "consumer_count": len(ch.consumers),
            "messages_unacknowledged": len(ch.unacked), "messages_unconfirmed": len(ch.unconfirmed),
            "messages_uncommitted": len(ch.tx_publishes), "acks_uncommitted": len(ch.tx_acks),
            "prefetch_count": ch.prefetch, "global_prefetch_count": ch.global_prefetch,
            "confirm": ch.confirm, "transactional": ch.tx,
            "message_stats": {"publish": ch.stats_published, "publish_details": {"rate": 0.0},
                              "deliver": ch.stats_delivered, "deliver_details": {"rate": 0.0},
                              "ack": ch.stats_acked, "ack_details": {"rate": 0.0}},
        }

    def channels(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        if vhost is not None:
            self._vhosts(vhost, who)
        return [self._channel_info(s, ch) for s in self._sessions(who)
                if vhost is None or s.vhost.name == vhost for ch in list(s.channels.values())]

    def connection_channels(self, name: str, who: Principal | None = None) -> list[dict]:
        sess = self._find_session(name, who)
        return [self._channel_info(sess, ch) for ch in list(sess.channels.values())]

    def channel(self, name: str, who: Principal | None = None) -> dict:
        for s in self._sessions(who):
            for ch in list(s.channels.values()):
                if f"{self._conn_name(s)} ({ch.number})" == name:
                    return self._channel_info(s, ch)
        raise not_found()

    def _consumer_info(self, c) -> dict:
        ch = c.channel
        sess = ch.session
        cname = self._conn_name(sess)
        peer = sess.peer or ("", 0)
        return {
            "consumer_tag": c.tag, "exclusive": c.exclusive, "ack_required": not c.no_ack,
            "prefetch_count": c.prefetch, "arguments": to_json(c.arguments), "active": bool(c.active),
            "activity_status": "up" if c.active else "waiting",
            "queue": {"name": c.queue.name, "vhost": c.queue.vhost},
            "channel_details": {"name": f"{cname} ({ch.number})", "number": ch.number,
                                "connection_name": cname, "node": NODE, "peer_host": peer[0],
                                "peer_port": peer[1], "user": sess.user},
        }

    def consumers(self, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
        return [self._consumer_info(c) for vh in self._vhosts(vhost, who)
                for q in vh.queues.values() for c in list(q.consumers)]

    # ---- aliveness -----------------------------------------------------------------------------
    def aliveness(self, vhost: str, who: Principal | None = None) -> dict:
        """Declare ``aliveness-test``, publish a message to it and read it back (RabbitMQ's check)."""
        vh = self._vhosts(vhost, who)[0]
        try:
            q = vh.declare_queue("aliveness-test", durable=False)
        except AMQPError as err:
            return {"status": "failed", "reason": err.text}
        raw = codec.encode_properties({})
        self.broker.publish(vh, vh.exchanges[""], Message("", q.name, raw, b"test_message"), False, None)
        got = None
        while True:
            msg = q.get()
            if msg is None:
                break
            self.broker.settle(msg)
            got = got or (msg.body == b"test_message")
        return {"status": "ok"} if got else {"status": "failed", "reason": "message not received"}

    # ---- definitions ---------------------------------------------------------------------------
    def export_definitions(self, vhost: str | None = None, who: Principal | None = None) -> dict:
        self.check_admin(who)
        vhosts = self._vhosts(vhost, None)
        queues, exchanges, bindings = [], [], []
        for vh in vhosts:
            for q in vh.queues.values():
                if q.exclusive:
                    continue  # they die with their connection: RabbitMQ does not export them
                queues.append({"name": q.name, "vhost": vh.name, "durable": q.durable,
                               "auto_delete": q.auto_delete, "arguments": to_json(q.arguments)})
            for ex in vh.exchanges.values():
                if ex.name == "" or ex.name.startswith("amq."):
                    continue
                exchanges.append({"name": ex.name, "vhost": vh.name, "type": ex.type, "durable": ex.durable,
                                  "auto_delete": ex.auto_delete, "internal": ex.internal,
                                  "arguments": to_json(ex.arguments)})
            for source, dtype, dest, rk, args in vh.bindings():
                if dtype == "queue":
                    q = vh.queues.get(dest)
                    if q is None or q.exclusive:
                        continue
                bindings.append({"source": source, "vhost": vh.name, "destination": dest,
                                 "destination_type": dtype, "routing_key": rk, "arguments": to_json(args)})
        if vhost is not None:  # RabbitMQ's per-vhost export leaves the vhost out of each item
            for item in (*queues, *exchanges, *bindings):
                item.pop("vhost", None)
            return {"rabbit_version": RABBIT_COMPAT_VERSION, "rabbitmq_version": RABBIT_COMPAT_VERSION,
                    "product_name": PRODUCT, "product_version": __version__, "parameters": [],
                    "policies": [], "queues": queues, "exchanges": exchanges, "bindings": bindings}
        return {
            "rabbit_version": RABBIT_COMPAT_VERSION, "rabbitmq_version": RABBIT_COMPAT_VERSION,
            "product_name": PRODUCT, "product_version": __version__,
            "users": [self._user_info(u) for u in self.broker.users.values()],
            "vhosts": [{"name": vh.name, "limits": [], "metadata": {"description": "", "tags": []}}
                       for vh in vhosts],
            "permissions": [{"user": u, "vhost": v, "configure": c, "write": w, "read": r}
                            for (u, v), (c, w, r) in self.broker.permissions.items()],
            "topic_permissions": [], "parameters": [], "global_parameters": [], "policies": [],
            "queues": queues, "exchanges": exchanges, "bindings": bindings,
        }

    def import_definitions(self, doc: Any, vhost: str | None = None, who: Principal | None = None) -> dict:
        """Merge a definitions document (RabbitMQ's format). Validates the whole document first."""
        self.check_admin(who)
        if not isinstance(doc, dict):
            raise bad_request("definitions must be a JSON object")
        if vhost is not None:
            self._vhost(vhost)
        plan = _DefinitionsPlan(doc, vhost)
        known_vhosts = set(self.broker.vhosts) | {v["name"] for v in plan.vhosts}
        known_users = set(self.broker.users) | {u["name"] for u in plan.users}
        for kind, items in (("queue", plan.queues), ("exchange", plan.exchanges), ("binding", plan.bindings),
                            ("permission", plan.permissions)):
            for item in items:
                if item["vhost"] not in known_vhosts:
                    raise bad_request(["no_such_vhost", item["vhost"]])
        for p in plan.permissions:
            if p["user"] not in known_users:
                raise bad_request(["no_such_user", p["user"]])
        broker = self.broker
        for u in plan.users:
            broker.add_user(u["name"], u.get("password"), u["tags"], password_hash=u.get("password_hash"),
                            hashing_algorithm=u.get("hashing_algorithm"))
        for v in plan.vhosts:
            broker.add_vhost(v["name"])
        for p in plan.permissions:
            broker.set_permissions(p["user"], p["vhost"], p["configure"], p["write"], p["read"])
        counts = {"users": len(plan.users), "vhosts": len(plan.vhosts), "permissions": len(plan.permissions),
                  "exchanges": 0, "queues": 0, "bindings": 0}
        errors: list[str] = []
        for x in plan.exchanges:
            vh = broker.vhosts[x["vhost"]]
            if x["name"] == "" or x["name"].startswith("amq."):
                continue  # built in
            try:
                vh.declare_exchange(x["name"], x["type"], False, x["durable"], x["auto_delete"],
                                    x["internal"], x["arguments"])
                counts["exchanges"] += 1
            except AMQPError as err:
                errors.append(f"exchange '{x['name']}' in vhost '{x['vhost']}': {err.text}")
        for qd in plan.queues:
            vh = broker.vhosts[qd["vhost"]]
            try:
                vh.declare_queue(qd["name"], False, qd["durable"], False, qd["auto_delete"], qd["arguments"])
                counts["queues"] += 1
            except AMQPError as err:
                errors.append(f"queue '{qd['name']}' in vhost '{qd['vhost']}': {err.text}")
        for b in plan.bindings:
            vh = broker.vhosts[b["vhost"]]
            if b["source"] == "":
                continue  # the default exchange's bindings are implicit
            try:
                vh.bind(b["source"], b["destination_type"], b["destination"], b["routing_key"],
                        b["arguments"], 0, 0)
                counts["bindings"] += 1
            except AMQPError as err:
                errors.append(f"binding '{b['source']}' -> {b['destination_type']} '{b['destination']}' "
                              f"in vhost '{b['vhost']}': {err.text}")
        if errors:
            raise bad_request("; ".join(errors[:20]) + (f" (and {len(errors) - 20} more)"
                                                         if len(errors) > 20 else ""))
        return counts

    # ---- metrics -------------------------------------------------------------------------------
    def metrics_snapshot(self) -> dict:
        unacked = self._unacked()
        queues = []
        for vh in self.broker.vhosts.values():
            for q in vh.queues.values():
                queues.append({"vhost": vh.name, "queue": q.name, "ready": q.message_count,
                               "unacked": unacked.get(id(q), (0, 0))[0], "consumers": len(q.consumers),
                               "published": q.stats_published, "delivered": q.stats_delivered})
        sessions = self._sessions(None)
        return {
            "queues": queues,
            "connections": len(sessions),
            "channels": sum(len(s.channels) for s in sessions),
            "consumers": sum(q["consumers"] for q in queues),
            "exchanges": sum(len(vh.exchanges) for vh in self.broker.vhosts.values()),
            "vhosts": len(self.broker.vhosts),
            "counters": self._global_counters(),
        }


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a list of strings or a comma-separated string")


def _props_json(props: dict) -> dict:
    out = {}
    for name, value in props.items():
        key = _PROPS_BACK.get(name, name)
        if name == "cluster_id" and not value:
            continue
        out[key] = to_json(value)
    return out


class _DefinitionsPlan:
    """A definitions document checked item by item before anything is applied."""

    def __init__(self, doc: dict, vhost: str | None) -> None:
        self.vhost = vhost
        self.users = [self._user(u) for u in self._list(doc, "users")] if vhost is None else []
        self.vhosts = [self._vhost(v) for v in self._list(doc, "vhosts")] if vhost is None else []
        self.permissions = [self._permission(p) for p in self._list(doc, "permissions")] \
            if vhost is None else []
        self.exchanges = [self._exchange(x) for x in self._list(doc, "exchanges")]
        self.queues = [self._queue(q) for q in self._list(doc, "queues")]
        self.bindings = [self._binding(b) for b in self._list(doc, "bindings")]
        for key in ("parameters", "global_parameters", "policies", "topic_permissions"):
            self._list(doc, key)  # accepted (RabbitMQ exports carry them); not applied

    @staticmethod
    def _list(doc: dict, key: str) -> list:
        value = doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise bad_request(f"definitions: '{key}' must be a list")
        for item in value:
            if not isinstance(item, dict):
                raise bad_request(f"definitions: every item of '{key}' must be an object")
        return value

    def _item_vhost(self, item: dict, what: str) -> str:
        if self.vhost is not None:
            return self.vhost
        v = item.get("vhost")
        if not isinstance(v, str) or not v:
            raise bad_request(f"definitions: {what} needs a 'vhost'")
        return v

    @staticmethod
    def _name(item: dict, what: str, key: str = "name", allow_empty: bool = False) -> str:
        v = item.get(key)
        if not isinstance(v, str) or (not v and not allow_empty):
            raise bad_request(f"definitions: {what} needs a string '{key}'")
        if len(v.encode("utf-8")) > 255:
            raise bad_request(f"definitions: {what} '{key}' is longer than 255 bytes")
        return v

    def _user(self, u: dict) -> dict:
        name = self._name(u, "a user")
        out = {"name": name, "tags": _tags(u.get("tags"))}
        if isinstance(u.get("password"), str):
            out["password"] = u["password"]
        else:
            h = u.get("password_hash", "")
            algo = u.get("hashing_algorithm") or HASHING_SHA256
            if not isinstance(h, str) or not isinstance(algo, str):
                raise bad_request(f"definitions: user '{name}': password_hash must be a string")
            out["password_hash"], out["hashing_algorithm"] = h, algo
        return out

    def _vhost(self, v: dict) -> dict:
        return {"name": self._name(v, "a vhost")}

    def _permission(self, p: dict) -> dict:
        out = {"user": self._name(p, "a permission", "user"), "vhost": self._item_vhost(p, "a permission")}
        for key in ("configure", "write", "read"):
            value = p.get(key, "")
            if not isinstance(value, str):
                raise bad_request(f"definitions: permission '{key}' must be a string")
            try:
                re.compile(value)
            except re.error:
                raise bad_request(f"definitions: permission '{key}' is not a valid regex") from None
            out[key] = value
        return out

    def _exchange(self, x: dict) -> dict:
        name = self._name(x, "an exchange", allow_empty=True)
        return {"name": name, "vhost": self._item_vhost(x, f"exchange '{name}'"),
                "type": self._name(x, f"exchange '{name}'", "type"),
                "durable": bool_from(x, "durable", True), "auto_delete": bool_from(x, "auto_delete", False),
                "internal": bool_from(x, "internal", False),
                "arguments": arguments_from(x.get("arguments"), f"exchange '{name}' arguments")}

    def _queue(self, q: dict) -> dict:
        name = self._name(q, "a queue")
        return {"name": name, "vhost": self._item_vhost(q, f"queue '{name}'"),
                "durable": bool_from(q, "durable", True), "auto_delete": bool_from(q, "auto_delete", False),
                "arguments": arguments_from(q.get("arguments"), f"queue '{name}' arguments")}

    def _binding(self, b: dict) -> dict:
        dtype = b.get("destination_type")
        if dtype not in ("queue", "exchange"):
            raise bad_request("definitions: binding destination_type must be 'queue' or 'exchange'")
        rk = b.get("routing_key", "")
        if not isinstance(rk, str):
            raise bad_request("definitions: binding routing_key must be a string")
        return {"source": self._name(b, "a binding", "source", allow_empty=True),
                "vhost": self._item_vhost(b, "a binding"),
                "destination": self._name(b, "a binding", "destination"), "destination_type": dtype,
                "routing_key": rk, "arguments": arguments_from(b.get("arguments"), "binding arguments")}
