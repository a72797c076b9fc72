"""Vhost limits and user limits, as RabbitMQ keeps and enforces them.

* vhost limits: ``max-connections`` (open AMQP connections to the vhost) and ``max-queues``
  (queues in the vhost, exclusive ones included);
* user limits: ``max-connections`` (the user's open connections, any vhost) and
  ``max-channels`` (the user's open channels, all its connections together).

A negative value means no limit; 0 allows nothing. They are set through the admin API
(``/api/vhost-limits``, ``/api/user-limits``) or definitions, stored through the broker's
durability, and checked with RabbitMQ's refusal texts (compared by hand with RabbitMQ 3.10):

===========================  ===================================================================
where                        refusal
===========================  ===================================================================
connection.open (vhost)      530 ``access to vhost 'v' refused for user 'u': connection limit (N)
                             is reached``
connection.open (user)       530 ``connection refused for user 'u': user connection limit (N) is
                             reached`` (after the vhost's check, before the permission check)
queue.declare of a new one   406 ``cannot declare queue 'q': queue limit in vhost 'v' (N) is
                             reached`` (a redeclaration of an existing queue is not refused)
channel.open                 530 ``number of channels opened for user 'u' has reached the maximum
                             allowed user limit of (N)``
===========================  ===================================================================

The broker keeps them in ``broker.vhost_limits`` and ``broker.user_limits`` (owner -> {name: value}).
"""

from __future__ import annotations

from exchange_broker.protocol.constants import NOT_ALLOWED, PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-connections", "max-channels")
LIMIT_MIN, LIMIT_MAX = -2 ** 63, 2 ** 63 - 1  # what the store's BIGINT holds


def in_force(limits: dict, owner: str, name: str) -> int | None:
    """The limit ``name`` of ``owner``, or None when unset or negative (no limit)."""
    values = limits.get(owner)
    value = values.get(name) if values else None
    return value if value is not None and value >= 0 else None


# -- changes (stored through the durability unless ``store`` is False, as at recovery) ------------

def _remove(table: dict, owner: str, name: str) -> bool:
    """Drop ``table[owner][name]`` (and the owner's entry once empty); False when it was not set."""
    values = table.get(owner)
    if not values or name not in values:
        return False
    del values[name]
    if not values:
        del table[owner]
    return True


def set_vhost_limit(broker, vhost: str, name: str, value: int, store: bool = True) -> None:
    broker.vhost_limits.setdefault(vhost, {})[name] = value
    if store:
        broker.durability.vhost_limit_set(vhost, name, value)


def clear_vhost_limit(broker, vhost: str, name: str, store: bool = True) -> bool:
    if not _remove(broker.vhost_limits, vhost, name):
        return False
    if store:
        broker.durability.vhost_limit_cleared(vhost, name)
    return True


def set_user_limit(broker, user: str, name: str, value: int, store: bool = True) -> None:
    broker.user_limits.setdefault(user, {})[name] = value
    if store:
        broker.durability.user_limit_set(user, name, value)


def clear_user_limit(broker, user: str, name: str, store: bool = True) -> bool:
    if not _remove(broker.user_limits, user, name):
        return False
    if store:
        broker.durability.user_limit_cleared(user, name)
    return True


def forget_vhost(broker, vhost: str, store: bool = True) -> None:
    """The vhost is deleted: its limits go with it (RabbitMQ clears its runtime parameters)."""
    for name in list(broker.vhost_limits.get(vhost, ())):
        clear_vhost_limit(broker, vhost, name, store)


def forget_user(broker, user: str, store: bool = True) -> None:
    for name in list(broker.user_limits.get(user, ())):
        clear_user_limit(broker, user, name, store)


# -- enforcement ------------------------------------------------------------------------------------

def check_connection(broker, user: str, vhost: str) -> None:
    """connection.open: the vhost's, then the user's connection limit (530 when reached)."""
    limit = in_force(broker.vhost_limits, vhost, "max-connections")
    if limit is not None:
        n = sum(1 for s in broker.sessions if s.vhost is not None and s.vhost.name == vhost)
        if n >= limit:
            raise AMQPError(NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}': "
                            f"connection limit ({limit}) is reached", 10, 40, hard=True)
    limit = in_force(broker.user_limits, user, "max-connections")
    if limit is not None:
        n = sum(1 for s in broker.sessions if s.user == user)
        if n >= limit:
            raise AMQPError(NOT_ALLOWED, f"connection refused for user '{user}': user connection "
                            f"limit ({limit}) is reached", 10, 40, hard=True)


def check_queue_count(broker, vh, name: str) -> None:
    """queue.declare of a new queue: 406 when the vhost holds max-queues queues already."""
    limit = in_force(broker.vhost_limits, vh.name, "max-queues")
    if limit is not None and len(vh.queues) >= limit:
        raise AMQPError(PRECONDITION_FAILED, f"cannot declare queue '{name}': queue limit in vhost "
                        f"'{vh.name}' ({limit}) is reached", 50, 10, hard=False)


def check_channel_open(broker, session, open_here: int) -> None:
    """channel.open on ``session``, which has ``open_here`` channels open now: 530 when the user's
    open channels (all its connections) reach its max-channels."""
    user = session.user
    if user is None or not broker.user_limits:
        return
    limit = in_force(broker.user_limits, user, "max-channels")
    if limit is None:
        return
    n = open_here + sum(len(s.channels) for s in broker.sessions if s.user == user and s is not session)
    if n >= limit:
        raise AMQPError(NOT_ALLOWED, f"number of channels opened for user '{user}' has reached the "
                        f"maximum allowed user limit of ({limit})", 20, 10, hard=True)
