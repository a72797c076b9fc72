"""Per-vhost resource permissions (configure / write / read), checked as RabbitMQ checks them.

A user's permissions in a vhost are three regular expressions. An operation on a resource (an
exchange or a queue) is allowed when the pattern for the operation's kind *matches somewhere in*
the resource name: RabbitMQ runs ``re:run(Name, Pattern)``, an unanchored search, so ``cfg``
allows ``xcfgy`` and ``^cfg`` is needed for a prefix (checked by hand against RabbitMQ 3.10).
The empty pattern matches nothing (RabbitMQ treats ``""`` as ``^$``). The default exchange is
named ``amq.default`` for the check and in the refusal text.

Which permission each AMQP method needs (RabbitMQ's "Access Control" table, and the order of the
checks in ``rabbit_channel``; every row was compared by hand with RabbitMQ 3.10):

====================================  ===================  ==================  ===============
method                                configure            write               read
====================================  ===================  ==================  ===============
exchange.declare (passive=false)      exchange
exchange.declare (passive=true)       –
exchange.declare, new, with AE        exchange             AE                  exchange
exchange.delete                       exchange
queue.declare (passive=false)         queue (also a
                                      server-named one)
queue.declare (passive=true)          –
queue.declare, new, with DLX          queue                DLX                 queue
queue.delete                          queue
queue.purge                                                                    queue
queue.bind / queue.unbind                                  queue               exchange
exchange.bind / exchange.unbind                            destination         source
basic.publish                                              exchange
basic.get / basic.consume                                                      queue
====================================  ===================  ==================  ===============

A super stream (exchange type ``x-super-stream``, not in RabbitMQ's table) owns its partition
queues ``name-0 ..``: declaring a new one and deleting one also need configure on each of them.

A refusal is a channel error 403 ACCESS_REFUSED, ``access to queue 'q' in vhost '/' refused for
user 'u'``; it comes before the existence check (a missing queue the user may not read is 403,
not 404), as in RabbitMQ.

Topic permissions (RabbitMQ's ``/api/topic-permissions``) narrow what a user may do with routing
keys on a *topic* exchange, per (user, vhost, exchange): a ``write`` pattern the routing key of
every basic.publish to that exchange must match, and a ``read`` pattern the binding key of every
queue.bind / exchange.bind / unbind from it must match; refused with 403 ``access to topic 'key'
in exchange 'x' in vhost 'v' refused for user 'u'``. An exchange without an entry is not
restricted; an exchange of another type is never checked. ``{username}`` and ``{vhost}`` in a
pattern are replaced by the user's and vhost's names (escaped, so a name is matched literally;
RabbitMQ inserts them as they are). The empty pattern matches only the empty key (RabbitMQ's
``^$``). The search is unanchored, as for resource permissions.
"""

from __future__ import annotations

import re
from functools import lru_cache
import routing

from exchange_broker.core.ports import Connection
from exchange_broker.protocol.constants import ACCESS_REFUSED
from exchange_broker.protocol.errors import AMQPError

CONFIGURE, WRITE, READ = 0, 1, 2
PERMISSION_NAMES = ("configure", "write", "read")
_CACHE_MAX = 256  # allowed (permission, kind, name) entries remembered per connection


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern | None:
    if pattern == "":
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None  # an invalid pattern (only possible from a hand-edited store) allows nothing


def validate(pattern: str) -> str | None:
    """An error message when ``pattern`` is not a valid regular expression, else None."""
    try:
        re.compile(pattern)
    except re.error as exc:
        return str(exc)
    return None


def matches(pattern: str, name: str) -> bool:
    rx = _compiled(pattern)
    return rx is not None and rx.search(name) is not None


def resource_name(kind: str, name: str) -> str:
    return "amq.default" if kind == "exchange" and name == "" else name


LINK_USER_PERMISSIONS = (".*", ".*", ".*")  # the internal users (Broker.link_login, movers_login)


def allowed(broker, user: str, vhost: str, kind: str, name: str, perm: int, authz=None) -> bool:
    """Does ``user`` hold permission ``perm`` (CONFIGURE/WRITE/READ) on the resource? ``authz``:
    the grants of an external backend (OAuth 2.0 scopes, LDAP queries) instead of the tables."""
    if authz is not None:
        return authz.resource_access(vhost, kind, resource_name(kind, name), PERMISSION_NAMES[perm])
    triple = broker.permissions.get((user, vhost)) or (LINK_USER_PERMISSIONS if broker.is_internal_user(user) else None)
    return triple is not None and matches(triple[perm], resource_name(kind, name))


def refused(user: str, vhost: str, kind: str, name: str, class_id: int = 0,
            method_id: int = 0) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, f"access to {kind} '{resource_name(kind, name)}' in vhost "
                     f"'{vhost}' refused for user '{user}'", class_id, method_id, hard=False)


def check(sess: Connection, perm: int, kind: str, name: str) -> None:
    """Raise 403 unless the session's user holds ``perm`` on the resource in its vhost.

    Answers are cached per connection; the cache is keyed by the permission triple object, so
    any change of the user's permissions (set, cleared, user or vhost deleted) takes effect on
    the very next method, as in RabbitMQ.
    """
    broker = sess.broker
    vhost = sess.vhost.name
    user = sess.user
    authz = sess.__dict__.get("authz")  # an external backend's grants (core/auth_backends.py)
    triple = authz if authz is not None else broker.permissions.get((user, vhost)) or \
        (LINK_USER_PERMISSIONS if broker.is_internal_user(user) else None)
    cache = sess.__dict__.get("_perm_cache")
    if cache is None or cache[0] is not triple:
        cache = sess._perm_cache = (triple, set())
    key = (perm, kind, name)
    if key in cache[1]:
        return
    if triple is None or not (matches(triple[perm], resource_name(kind, name)) if authz is None else
                              authz.resource_access(vhost, kind, resource_name(kind, name),
                                                    PERMISSION_NAMES[perm])):
        raise refused(user, vhost, kind, name)
    if len(cache[1]) >= _CACHE_MAX:
        cache[1].clear()
    cache[1].add(key)


# -- per-method checks, called by the session before the vhost acts ---------------------------------

def _known_type(sess: Connection, type_: str) -> bool:
    return type_ in routing.TYPES


def _str_arg(arguments: dict | None, key: str) -> str | None:
    value = (arguments or {}).get(key)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def exchange_declare(sess: Connection, m) -> None:
    """Non-passive exchange.declare: configure on the exchange; a new exchange with an
    alternate-exchange also needs read on itself and write on the AE."""
    if m.passive or m.exchange == "" or not _known_type(sess, m.exchange_type):
        return  # default exchange 403 / unknown type 503 come first, from the vhost
    check(sess, CONFIGURE, "exchange", m.exchange)
    if m.exchange not in sess.vhost.exchanges:
        ae = _str_arg(m.arguments, "alternate-exchange")
        if ae is not None:
            check(sess, READ, "exchange", m.exchange)
            check(sess, WRITE, "exchange", ae)
        if m.exchange_type == routing.X_SUPER_STREAM:  # it declares its partition queues too
            n = (m.arguments or {}).get("x-partitions")
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= 1024:
                for i in range(n):
                    check(sess, CONFIGURE, "queue", f"{m.exchange}-{i}")


def exchange_delete(sess: Connection, name: str) -> None:
    if name == "" or name.startswith("amq."):
        return  # the vhost refuses these first (default exchange / system exchange)
    check(sess, CONFIGURE, "exchange", name)
    ex = sess.vhost.exchanges.get(name)
    if ex is not None and ex.type == routing.X_SUPER_STREAM:  # its partitions are deleted too
        for kind, queue in sorted(d for ds in ex.index.by_number.values() for d in ds):
            check(sess, CONFIGURE, "queue", queue)


def queue_declare(sess: Connection, name: str, arguments: dict | None) -> None:
    """Non-passive queue.declare (``name`` is the generated one for a server-named queue)."""
    check(sess, CONFIGURE, "queue", name)
    if name not in sess.vhost.queues:
        dlx = _str_arg(arguments, "x-dead-letter-exchange")
        if dlx is not None:
            check(sess, READ, "queue", name)
            check(sess, WRITE, "exchange", dlx)


def binding(sess: Connection, dest_kind: str, dest: str, source: str,
            routing_key: str | None = None) -> None:
    """queue.bind/unbind and exchange.bind/unbind: write on the destination, read on the source.
    Binding from or to the default exchange is refused in between, as RabbitMQ orders it; then,
    when the source is a topic exchange, the topic permission's read pattern on the binding key."""
    check(sess, WRITE, dest_kind, dest)
    if source == "" or (dest_kind == "exchange" and dest == ""):
        raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange", hard=False)
    check(sess, READ, "exchange", source)
    if routing_key is not None:
        check_topic(sess, source, routing_key, READ)


# -- topic permissions -----------------------------------------------------------------------------

TOPIC_NAMES = ("write", "read")  # the two patterns of a topic permission, in this order


def _expand(pattern: str, user: str, vhost: str) -> str:
    if "{" not in pattern:
        return pattern
    return pattern.replace("{username}", re.escape(user)).replace("{vhost}", re.escape(vhost))


def topic_matches(pattern: str, key: str, user: str, vhost: str) -> bool:
    """Does ``key`` satisfy a topic permission pattern (variables expanded; ``""`` is ``^$``)?"""
    if pattern == "":
        return key == ""
    rx = _compiled(_expand(pattern, user, vhost))
    return rx is not None and rx.search(key) is not None


def topic_allowed(broker, user: str, vhost: str, exchange, routing_key: str, perm: int,
                  authz=None) -> bool:
    """``perm`` is WRITE (publish) or READ (bind); ``exchange`` is the Exchange object. With an
    external backend's ``authz``, it decides (RabbitMQ's oauth2 backend allows a topic only by a
    scope with a routing-key part)."""
    if exchange.type != "topic":
        return True
    if authz is not None:
        return authz.topic_access(vhost, resource_name("exchange", exchange.name), routing_key,
                                  PERMISSION_NAMES[perm])
    entries = broker.topic_permissions.get((user, vhost))
    entry = entries.get(exchange.name) if entries else None
    if entry is None:
        return True
    return topic_matches(entry[0 if perm == WRITE else 1], routing_key, user, vhost)


def topic_refused(user: str, vhost: str, exchange: str, routing_key: str) -> AMQPError:
    return AMQPError(ACCESS_REFUSED, f"access to topic '{routing_key}' in exchange "
                     f"'{resource_name('exchange', exchange)}' in vhost '{vhost}' refused for user "
                     f"'{user}'", hard=False)


def check_topic(sess: Connection, exchange: str, routing_key: str, perm: int) -> None:
    """403 unless the session's user may publish (WRITE) or bind (READ) ``routing_key`` on the
    named exchange. Free when no topic permission is set anywhere (the publish hot path)."""
    broker = sess.broker
    authz = sess.__dict__.get("authz")
    if not broker.topic_permissions and authz is None:
        return
    vh = sess.vhost
    ex = vh.exchanges.get(exchange)
    if ex is None or (perm == WRITE and ex.internal):
        return  # the caller answers 404 / the internal-exchange 403 next, as RabbitMQ orders it
    if not topic_allowed(broker, sess.user, vh.name, ex, routing_key, perm, authz):
        raise topic_refused(sess.user, vh.name, exchange, routing_key)


def set_topic_permission(broker, user: str, vhost: str, exchange: str, write: str, read: str,
                         store: bool = True) -> bool:
    """Set the (user, vhost, exchange) entry; True when the user had none in the vhost."""
    key = (user, vhost)
    entries = broker.topic_permissions.get(key)
    was_new = not entries
    if entries is None:
        entries = broker.topic_permissions[key] = {}
    entries[exchange] = (write, read)
    if store:
        broker.durability.topic_permission_set(user, vhost, exchange, write, read)
        broker.event("topic.permission.created", {"user": user, "vhost": vhost, "exchange": exchange,
                                                  "write": write, "read": read})
    return was_new


def clear_topic_permissions(broker, user: str, vhost: str, exchange: str | None = None,
                            store: bool = True) -> bool:
    """Remove one exchange's entry, or all of the user's in the vhost (False: there was none)."""
    key = (user, vhost)
    entries = broker.topic_permissions.get(key)
    if not entries:
        return False
    names = list(entries) if exchange is None else [exchange] if exchange in entries else []
    for name in names:
        del entries[name]
        if store:
            broker.durability.topic_permission_cleared(user, vhost, name)
        broker.event("topic.permission.deleted", {"user": user, "vhost": vhost, "exchange": name})
    if not entries:
        del broker.topic_permissions[key]
    return bool(names) or exchange is not None


def forget_topic_permissions(broker, *, user: str | None = None, vhost: str | None = None,
                             store: bool = True) -> None:
    """A user or vhost is deleted: its topic permissions go with it (and from the store)."""
    for u, v in [k for k in broker.topic_permissions if k[0] == user or k[1] == vhost]:
        clear_topic_permissions(broker, u, v, store=store)
