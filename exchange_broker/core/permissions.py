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

A refusal is a channel error 403 ACCESS_REFUSED, ``access to queue 'q' in vhost '/' refused for
user 'u'``; it comes before the existence check (a missing queue the user may not read is 403,
not 404), as in RabbitMQ.
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


def allowed(broker, user: str, vhost: str, kind: str, name: str, perm: int) -> bool:
    """Does ``user`` hold permission ``perm`` (CONFIGURE/WRITE/READ) on the resource?"""
    triple = broker.permissions.get((user, vhost))
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
    triple = broker.permissions.get((user, vhost))
    cache = sess.__dict__.get("_perm_cache")
    if cache is None or cache[0] is not triple:
        cache = sess._perm_cache = (triple, set())
    key = (perm, kind, name)
    if key in cache[1]:
        return
    if triple is None or not matches(triple[perm], resource_name(kind, name)):
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


def exchange_delete(sess: Connection, name: str) -> None:
    if name == "" or name.startswith("amq."):
        return  # the vhost refuses these first (default exchange / system exchange)
    check(sess, CONFIGURE, "exchange", name)


def queue_declare(sess: Connection, name: str, arguments: dict | None) -> None:
    """Non-passive queue.declare (``name`` is the generated one for a server-named queue)."""
    check(sess, CONFIGURE, "queue", name)
    if name not in sess.vhost.queues:
        dlx = _str_arg(arguments, "x-dead-letter-exchange")
        if dlx is not None:
            check(sess, READ, "queue", name)
            check(sess, WRITE, "exchange", dlx)


def binding(sess: Connection, dest_kind: str, dest: str, source: str) -> None:
    """queue.bind/unbind and exchange.bind/unbind: write on the destination, read on the source.
    Binding from or to the default exchange is refused in between, as RabbitMQ orders it."""
    check(sess, WRITE, dest_kind, dest)
    if source == "" or (dest_kind == "exchange" and dest == ""):
        raise AMQPError(ACCESS_REFUSED, "operation not permitted on the default exchange", hard=False)
    check(sess, READ, "exchange", source)
