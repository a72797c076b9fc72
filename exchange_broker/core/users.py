"""Users, vhosts and permissions as definitions: change them at run time, store them, restore them.

The Broker delegates here (``Broker.delete_user`` ...) so the admin API, definitions import and
the command line all change users the same way. Every change is written through the broker's
durability (``SqlDurability``: ordered definition writes); the in-memory ``NullDurability``
stores nothing.

RabbitMQ behaviours kept (checked by hand against RabbitMQ 3.10):

* deleting a user closes its connections: 320 CONNECTION_FORCED ``user 'u' is deleted``;
* deleting a vhost closes its connections: 320 ``vhost 'v' is deleted``, and drops its queues,
  exchanges and permissions;
* clearing a user's permissions leaves its connections open; the next method that needs a
  permission is refused (403), and a new connection to that vhost is refused (530).
"""

from __future__ import annotations

import logging

from exchange_broker.core.auth import HASHING_SHA256, User
from exchange_broker.protocol.constants import CONNECTION_FORCED

log = logging.getLogger("exchange_broker.users")

KNOWN_TAGS = ("administrator", "management", "monitoring", "policymaker", "impersonator")



def stored_user(broker, user: User) -> None:
    broker.durability.user_added(user)


def stored_permission(broker, user: str, vhost: str) -> None:
    triple = broker.permissions.get((user, vhost))
    if triple is not None:
        broker.durability.permission_set(user, vhost, *triple)


def set_user_tags(broker, name: str, tags: list[str]) -> bool:
    user = broker.users.get(name)
    if user is None:
        return False
    user.tags = list(tags)
    stored_user(broker, user)
    broker.event("user.tags.set", {"name": name, "tags": list(tags)})
    return True


def _close_sessions(broker, pick, text: str) -> int:
    n = 0
    for sess in list(broker.sessions):
        if pick(sess) and not sess.closed:
            sess.server_close(CONNECTION_FORCED, text)
            n += 1
    return n


def delete_user(broker, name: str, store: bool = True) -> bool:
    """Remove a user and its permissions; its open connections get 320 (False: no such user).
    ``store`` False here and below: the change was written elsewhere (a cluster's node following
    the store's definitions: ``cluster/definitions.py``)."""
    if broker.users.pop(name, None) is None:
        return False
    for key in [k for k in broker.permissions if k[0] == name]:
        del broker.permissions[key]
    if store:
        broker.durability.user_deleted(name)
    n = _close_sessions(broker, lambda s: s.user == name, f"user '{name}' is deleted")
    log.info("user '%s' deleted (%d connections closed)", name, n)
    return True


def clear_permissions(broker, user: str, vhost: str, store: bool = True) -> bool:
    if broker.permissions.pop((user, vhost), None) is None:
        return False
    if store:
        broker.durability.permission_cleared(user, vhost)
    broker.event("permission.deleted", {"user": user, "vhost": vhost})
    return True


def delete_vhost(broker, name: str, store: bool = True) -> bool:
    """Close the vhost's connections (320), drop its queues, exchanges and permissions."""
    vh = broker.vhosts.get(name)
    if vh is None:
        return False
    n = _close_sessions(broker, lambda s: s.vhost is vh, f"vhost '{name}' is deleted")
    for q in list(vh.queues.values()):
        vh.remove_queue(q, store)
    for ex in list(vh.exchanges.values()):
        if ex.name and not ex.name.startswith("amq.") and ex.name in vh.exchanges:
            vh._remove_exchange(ex, store)
    del broker.vhosts[name]
    for key in [k for k in broker.permissions if k[1] == name]:
        del broker.permissions[key]
    if store:  # the store drops the vhost's rows: queues, messages, bindings, permissions
        broker.durability.vhost_deleted(name)
    log.info("vhost '%s' deleted (%d connections closed)", name, n)
    return True


def restore_access(broker, durability, defs) -> dict:
    """At start-up: users and permissions from the store, or seed a fresh store.

    A store without any user is new (or from a version that did not store users): the broker's
    defaults (vhost ``/``, the default user with full permissions on it) are written to it, as
    RabbitMQ initialises a fresh database. Otherwise the stored users and permissions replace
    the defaults: a deleted guest user stays deleted, and so does a deleted ``/`` vhost.
    """
    if not defs.users:
        for v in broker.vhosts:
            durability.vhost_added(v)
        for user in broker.users.values():
            durability.user_added(user)
        for (user, vhost), triple in broker.permissions.items():
            durability.permission_set(user, vhost, *triple)
        return {"users": 0, "permissions": 0, "seeded": True}
    broker.users.clear()
    broker.permissions.clear()
    for u in defs.users:
        broker.users[u["name"]] = User(u["name"], u["password_hash"] or "",
                                       u["hashing_algorithm"] or HASHING_SHA256, list(u["tags"] or []))
    stored_vhosts = {v["name"] for v in defs.vhosts}
    if "/" not in stored_vhosts and "/" in broker.vhosts and not broker.vhosts["/"].queues:
        del broker.vhosts["/"]  # deleted before the restart
    for p in defs.permissions:
        broker.permissions[(p["user"], p["vhost"])] = (p["configure"], p["write"], p["read"])
    return {"users": len(defs.users), "permissions": len(defs.permissions), "seeded": False}
