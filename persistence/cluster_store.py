"""Cluster membership, queue leases and the definitions version, kept in PostgreSQL.

Every time here is the database's clock (``now()``), never a node's: nodes whose clocks disagree
still agree on who is alive and whose lease has run out.

* Nodes: :meth:`ClusterStore.register` (a row per node name; its ``incarnation`` grows on every
  start), :meth:`heartbeat` (also renews the node's leases, in the same transaction),
  :meth:`deregister`, :meth:`nodes` (alive = a heartbeat within the failover timeout).
* Queue leases: :meth:`take_lease` (compare-and-set under ``SELECT ... FOR UPDATE``: a free or
  expired lease is taken with ``epoch + 1``), :meth:`renew_lease`, :meth:`release_lease`, and
  :func:`fence` for writers: in the writer's own transaction, ``SELECT ... WHERE leader = :me AND
  epoch = :epoch FOR SHARE`` locks the lease row (so a take-over waits for the write to commit,
  and a write after a take-over sees the new epoch); no row means fenced (:class:`Fenced`).
  ``STORE_LEASE`` is the lease on the whole store (the active node's).
* Definitions: :meth:`bump_definitions` increments the ``definitions`` counter and sends
  ``NOTIFY eb_definitions, '<version>'`` in the same transaction (delivered at commit);
  :class:`DefinitionsListener` (a thread on its own connection) calls ``changed(version)`` for
  each new version and ``reload(version)`` when it sees a gap (a missed notification, a
  reconnect).

Blocking calls: run them off the event loop (the server layer uses an executor).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from .database_url import parse

log = logging.getLogger("exchange_broker.cluster")

CHANNEL = "eb_definitions"
# a node is alive while its last heartbeat is younger than its own failover timeout
ALIVE = "(heartbeat_at > now() - make_interval(secs => failover_timeout))"
# the lease on the whole store (vhost "" is no vhost's name): the active node of an active/standby
# cluster holds it, and every write of its store is fenced with its epoch
STORE_LEASE = ("", "*store*")  # seconds: an unreachable database fails a call instead of hanging it


# a node's definitions version: the one given, else the store's current one
VERSION_OR_CURRENT = ("COALESCE(CAST(:dv AS BIGINT), (SELECT value FROM cluster_counters "
                      "WHERE name = 'definitions'), 0)")


class NodeNameInUse(Exception):
    """A live node (heartbeat within the failover timeout) already has this name."""


class Fenced(Exception):
    """The lease this write relied on has another leader or epoch now: the write must not happen."""


@dataclass(frozen=True)
class Lease:
    vhost: str
    queue: str
    leader: str
    epoch: int


def session_name(pid: int, host: str) -> str:
    """The ``application_name`` of every database session of a cluster node's process, the name
    the store lock's session has anyway (``persistence/lock.py``; PostgreSQL keeps 63 bytes): another
    node ends them all when that node's store lease runs out (``cluster_nodes`` has pid and host)."""
    return f"exchange-broker {pid}@{host}".encode()[:63].decode(errors="ignore")


def end_sessions(conn: Connection, pid: int, host: str) -> int:
    """In the caller's transaction: end every other database session of the node process ``pid``
    on ``host`` (its open transactions roll back, its locks go). Returns how many."""
    return len(conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a "
                                 "AND pid <> pg_backend_pid()"), {"a": session_name(pid, host)}).all())


def tagged_url(url: str) -> str:
    """``url`` naming this process's sessions (``session_name``), so that they can be found and ended."""
    return parse(url).with_params(application_name=session_name(os.getpid(), socket.gethostname())).url


def _interval(seconds: float) -> str:
    return f"make_interval(secs => {float(seconds)!r})"


class ClusterStore:
    """The cluster tables of the PostgreSQL store at ``url`` (created by migration 0005)."""

    def __init__(self, url: str, failover_timeout: float = 10.0) -> None:
        database = self.database = parse(url)
        if not database.is_postgres:
            raise ValueError("a cluster needs a PostgreSQL store")
        if database.param("application_name") is None:
            database = self.database = database.with_params(application_name=f"exchange-broker cluster {os.getpid()}")
        self.url = url
        self.failover_timeout = failover_timeout
        self.engine: Engine = database.engine(pool_pre_ping=True, pool_size=2, max_overflow=4)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    # -- nodes --------------------------------------------------------------------------------------
    def register(self, name: str, *, role: str, amqp_address: str = "", admin_address: str = "",
                 at_least: int = 1) -> int:
        """Add (or restart) node ``name``; returns its new incarnation, at least ``at_least`` (a
        process that was evicted, its row deleted, joins again above its old incarnation: what the
        old one still writes stays fenced). Raises NodeNameInUse when a live node of another
        process already has the name."""
        pid, host = os.getpid(), socket.gethostname()
        with self.transaction() as conn:
            row = conn.execute(text(
                f"SELECT pid, host, incarnation, {ALIVE} AS alive FROM cluster_nodes WHERE name = :n FOR UPDATE"),
                {"n": name}).first()
            if row is not None and row.alive and (row.pid, row.host) != (pid, host) and \
                    not (row.host == host and not _running(row.pid)):  # a killed node may restart at once
                raise NodeNameInUse(f"the node name {name!r} is in use by a live node (pid {row.pid} on "
                                    f"host {row.host}); give this node another --node-name")
            incarnation = max((row.incarnation + 1) if row is not None else 1, at_least)
            conn.execute(text(
                "INSERT INTO cluster_nodes (name, amqp_address, admin_address, pid, host, role, incarnation, "
                "failover_timeout, started_at, heartbeat_at) "
                "VALUES (:n, :amqp, :admin, :pid, :host, :role, :inc, :ft, now(), now()) "
                "ON CONFLICT (name) DO UPDATE SET amqp_address = excluded.amqp_address, "
                "admin_address = excluded.admin_address, pid = excluded.pid, host = excluded.host, "
                "role = excluded.role, incarnation = excluded.incarnation, "
                "failover_timeout = excluded.failover_timeout, started_at = now(), "
                "heartbeat_at = now()"),
                {"n": name, "amqp": amqp_address, "admin": admin_address, "pid": pid, "host": host,
                 "role": role, "inc": incarnation, "ft": self.failover_timeout})
            # whatever an earlier incarnation led is free now: that process is gone
            conn.execute(text("UPDATE queue_leases SET expires_at = now() WHERE leader = :n AND expires_at > now()"),
                         {"n": name})
        return incarnation

    def update_node(self, name: str, incarnation: int, **values: str) -> bool:
        """Set ``role``, ``amqp_address`` and/or ``admin_address``; False if the row is not ours."""
        allowed = {"role", "amqp_address", "admin_address"}
        sets = ", ".join(f"{k} = :{k}" for k in values if k in allowed)
        with self.transaction() as conn:
            done = conn.execute(text(f"UPDATE cluster_nodes SET {sets} WHERE name = :n AND incarnation = :i"),
                                {**values, "n": name, "i": incarnation})
        return done.rowcount == 1

    def heartbeat(self, name: str, incarnation: int, definitions_version: int | None = None) -> bool:
        """Beat and renew this node's leases for another failover timeout; record the definitions
        version the node has loaded (None: the store's current one, for the node that writes
        them). False: the row belongs to another incarnation now (this process must stop acting as
        the node)."""
        with self.transaction() as conn:
            beat = conn.execute(text(f"UPDATE cluster_nodes SET heartbeat_at = now(), "
                                     f"definitions_version = {VERSION_OR_CURRENT} "
                                     f"WHERE name = :n AND incarnation = :i"),
                                {"n": name, "i": incarnation, "dv": definitions_version})
            if beat.rowcount != 1:
                return False
            conn.execute(text(f"UPDATE queue_leases SET expires_at = now() + {_interval(self.failover_timeout)} "
                              f"WHERE leader = :n AND expires_at > now()"), {"n": name})
        return True

    def set_definitions_version(self, name: str, incarnation: int, version: int) -> None:
        """The node has loaded definitions ``version`` (shown by ``cluster status``)."""
        with self.transaction() as conn:
            conn.execute(text("UPDATE cluster_nodes SET definitions_version = :dv WHERE name = :n AND incarnation = :i"),
                         {"n": name, "i": incarnation, "dv": version})

    def deregister(self, name: str, incarnation: int) -> None:
        """A clean stop: the node's row goes and its leases end now (others may take them at once)."""
        with self.transaction() as conn:
            gone = conn.execute(text("DELETE FROM cluster_nodes WHERE name = :n AND incarnation = :i"),
                                {"n": name, "i": incarnation})
            if gone.rowcount:
                conn.execute(text("UPDATE queue_leases SET expires_at = now() "
                                  "WHERE leader = :n AND expires_at > now()"), {"n": name})

    def nodes(self) -> list[dict]:
        """Every node: name, addresses, role, pid, host, incarnation, started_at and heartbeat_at
        (ISO 8601), ``seconds_since_heartbeat``, ``alive`` and ``queues`` (vhost, name and epoch of
        each queue it holds an unexpired lease on), by name."""
        with self.transaction() as conn:
            rows = conn.execute(text(
                f"SELECT name, amqp_address, admin_address, role, pid, host, incarnation, started_at, "
                f"heartbeat_at, failover_timeout, definitions_version, EXTRACT(EPOCH FROM now() - heartbeat_at) AS since, "
                f"{ALIVE} AS alive "
                f"FROM cluster_nodes ORDER BY name")).mappings().all()
            leases = conn.execute(text("SELECT leader, vhost, queue, epoch FROM queue_leases "
                                       "WHERE expires_at > now() AND vhost <> :store ORDER BY vhost, queue"),
                                  {"store": STORE_LEASE[0]}).all()
        led: dict[str, list[dict]] = {}
        for leader, vhost, queue, epoch in leases:
            led.setdefault(leader, []).append({"vhost": vhost, "name": queue, "epoch": epoch})
        out = []
        for r in rows:
            out.append({"name": r["name"], "alive": bool(r["alive"]), "role": r["role"],
                        "amqp_address": r["amqp_address"], "admin_address": r["admin_address"],
                        "pid": r["pid"], "host": r["host"], "incarnation": r["incarnation"],
                        "failover_timeout": r["failover_timeout"], "started_at": r["started_at"].isoformat(),
                        "heartbeat_at": r["heartbeat_at"].isoformat(),
                        "seconds_since_heartbeat": round(float(r["since"]), 3),
                        "definitions_version": int(r["definitions_version"]),
                        "queues": led.get(r["name"], [])})
        return out

    def active_addresses(self) -> tuple[str, str] | None:
        """(AMQP, admin) addresses of the live active node that serves, None when there is none."""
        with self.transaction() as conn:
            row = conn.execute(text(
                f"SELECT amqp_address, admin_address FROM cluster_nodes WHERE role = 'active' AND {ALIVE} "
                f"AND amqp_address <> '' ORDER BY heartbeat_at DESC LIMIT 1")).first()
        return (row[0], row[1]) if row is not None else None

    def live_nodes(self, role: str | None = None, *, other_than: str | None = None) -> list[str]:
        """Names of the nodes alive now (optionally of one role, leaving one name out)."""
        return [n["name"] for n in self.nodes()
                if n["alive"] and (role is None or n["role"] == role) and n["name"] != other_than]

    # -- queue leases -------------------------------------------------------------------------------
    def take_lease(self, vhost: str, queue: str, node: str) -> Lease | None:
        """Lead ``queue`` for a failover timeout: a new lease (epoch 1), ours renewed (same epoch),
        or an expired one taken over (epoch + 1). None while another node's lease runs."""
        ttl = _interval(self.failover_timeout)
        key = {"v": vhost, "q": queue, "me": node}
        with self.transaction() as conn:
            conn.execute(text(f"INSERT INTO queue_leases (vhost, queue, leader, epoch, expires_at) "
                              f"VALUES (:v, :q, :me, 0, now() - {_interval(1)}) ON CONFLICT DO NOTHING"), key)
            row = conn.execute(text("SELECT leader, epoch, expires_at > now() AS running FROM queue_leases "
                                    "WHERE vhost = :v AND queue = :q FOR UPDATE"), key).one()
            if row.running and row.leader != node:
                return None
            epoch = row.epoch if (row.leader == node and row.epoch > 0) else row.epoch + 1
            conn.execute(text(f"UPDATE queue_leases SET leader = :me, epoch = :e, expires_at = now() + {ttl} "
                              f"WHERE vhost = :v AND queue = :q"), {**key, "e": epoch})
        return Lease(vhost, queue, node, epoch)

    def renew_lease(self, lease: Lease) -> bool:
        """Extend ``lease`` for a failover timeout, even one that ran out while nobody took it;
        False when it is no longer ours (fenced)."""
        with self.transaction() as conn:
            done = conn.execute(text(
                f"UPDATE queue_leases SET expires_at = now() + {_interval(self.failover_timeout)} "
                f"WHERE vhost = :v AND queue = :q AND leader = :me AND epoch = :e"), _key(lease))
        return done.rowcount == 1

    def release_lease(self, lease: Lease) -> bool:
        """End ``lease`` now (the queue was deleted, or the node hands it over)."""
        with self.transaction() as conn:
            done = conn.execute(text("UPDATE queue_leases SET expires_at = now() WHERE vhost = :v AND queue = :q "
                                     "AND leader = :me AND epoch = :e"), _key(lease))
        return done.rowcount == 1

    def forget_lease(self, vhost: str, queue: str) -> None:
        """The queue is gone for good: drop its lease row."""
        with self.transaction() as conn:
            conn.execute(text("DELETE FROM queue_leases WHERE vhost = :v AND queue = :q"), {"v": vhost, "q": queue})

    def expired_store_holder(self) -> tuple[str, int, str] | None:
        """(name, pid, host) of the node whose store lease ran out while it is still registered
        (paused, hung, or cut off), None otherwise."""
        with self.transaction() as conn:
            row = conn.execute(text(
                "SELECT n.name, n.pid, n.host FROM queue_leases l JOIN cluster_nodes n ON n.name = l.leader "
                "WHERE l.vhost = :v AND l.queue = :q AND l.expires_at <= now()"),
                {"v": STORE_LEASE[0], "q": STORE_LEASE[1]}).first()
        return (row[0], row[1], row[2]) if row is not None else None

    def end_sessions_of(self, pid: int, host: str) -> int:
        """End every database session of the node process ``pid`` on ``host``: its store lock goes,
        its open transactions roll back, and its next database call fails. Returns how many."""
        with self.transaction() as conn:
            return end_sessions(conn, pid, host)

    def lease_of(self, vhost: str, queue: str) -> Lease | None:
        """The running lease of a queue (None: nobody leads it now)."""
        with self.transaction() as conn:
            row = conn.execute(text("SELECT leader, epoch FROM queue_leases WHERE vhost = :v AND queue = :q "
                                    "AND expires_at > now()"), {"v": vhost, "q": queue}).first()
        return Lease(vhost, queue, row.leader, row.epoch) if row is not None else None

    def write_fenced(self, lease: Lease, fn: Callable[[Connection], object]) -> object:
        """``fn(conn)`` in one transaction with the fencing check: Fenced (and nothing written)
        when ``lease`` is stale."""
        with self.transaction() as conn:
            fence(conn, lease)
            return fn(conn)

    # -- definitions version ------------------------------------------------------------------------
    def definitions_version(self) -> int:
        with self.transaction() as conn:
            value = conn.execute(text("SELECT value FROM cluster_counters WHERE name = 'definitions'")).scalar()
        return int(value or 0)

    def bump_definitions(self, conn: Connection | None = None) -> int:
        """The definitions changed: the next version, announced on CHANNEL at commit. Pass the
        transaction that wrote the change to announce it only if it commits."""
        if conn is None:
            with self.transaction() as own:
                return self.bump_definitions(own)
        version = conn.execute(text(
            "INSERT INTO cluster_counters (name, value) VALUES ('definitions', 1) ON CONFLICT (name) "
            "DO UPDATE SET value = cluster_counters.value + 1 RETURNING value")).scalar_one()
        conn.execute(text("SELECT pg_notify(:ch, :v)"), {"ch": CHANNEL, "v": str(version)})
        return int(version)


def _key(lease: Lease) -> dict:
    return {"v": lease.vhost, "q": lease.queue, "me": lease.leader, "e": lease.epoch}


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fence(conn: Connection, lease: Lease) -> None:
    """In the caller's transaction: share-lock the lease row if it is still ``lease``'s (a take-over
    waits for this transaction; a write after a take-over sees the new epoch), else Fenced."""
    held = conn.execute(text("SELECT 1 FROM queue_leases WHERE vhost = :v AND queue = :q "
                             "AND leader = :me AND epoch = :e FOR SHARE"), _key(lease)).first()
    if held is None:
        raise Fenced(f"queue '{lease.queue}' in vhost '{lease.vhost}': node '{lease.leader}' no longer "
                     f"leads it with epoch {lease.epoch}")


class DefinitionsListener:
    """LISTEN on CHANNEL in a thread: ``changed(v)`` for the next version, ``reload(v)`` when
    versions were skipped (or at a reconnect that finds a newer version). ``known`` is the
    version the caller has loaded."""

    def __init__(self, store: ClusterStore, known: int, changed: Callable[[int], None],
                 reload: Callable[[int], None], poll: float = 1.0) -> None:
        self.store = store
        self.known = known
        self.changed = changed
        self.reload = reload
        self.poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cluster-definitions", daemon=True)
        self.listening = threading.Event()

    def start(self) -> "DefinitionsListener":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _saw(self, version: int) -> None:
        if version <= self.known:
            return
        gap = version > self.known + 1
        self.known = version
        (self.reload if gap else self.changed)(version)

    def _run(self) -> None:
        import psycopg
        while not self._stop.is_set():
            try:
                with self.store.database.connect(autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._saw(self.store.definitions_version())  # whatever was missed while not listening
                    self.listening.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=self.poll, stop_after=1):
                            self._saw(int(note.payload))
            except (psycopg.Error, SQLAlchemyError, OSError) as exc:
                # one line per outage (the node logs its own), not one per attempt
                (log.warning if self.listening.is_set() else log.debug)(
                    "definitions listener: %s; listening again shortly", " ".join(str(exc).split()))
                self.listening.clear()
                self._stop.wait(self.poll)
