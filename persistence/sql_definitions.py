"""Definitions in the SQL store: vhosts, users, permissions, exchanges, queues, bindings.

A mixin of :class:`persistence.sql_store.SqlStore` (which provides ``_write``, ``_read``,
``_insert``, ``_upsert`` and ``_dialect``); one transaction per call.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from .models import (bindings, exchanges, messages, permissions, policies, queues, stream_chunks,
                     stream_offsets, users, vhosts)
from .sql_stream_log import log_stats
from .store import Definitions


def _args_sha1(arguments: bytes) -> str:
    return hashlib.sha1(bytes(arguments)).hexdigest()


def _queue_stats(conn: Connection, queue_id: int | None = None) -> dict[int, tuple[int, int, int]]:
    """{queue id: (stored message count, lowest seq, highest seq)} of every queue (or of one);
    stream queues: their logs' chunks."""
    m = messages.c
    query = select(m.queue_id, func.count(), func.min(m.seq), func.max(m.seq))
    if queue_id is not None:
        query = query.where(m.queue_id == queue_id)
    stats = {r[0]: (r[1], r[2], r[3]) for r in conn.execute(query.group_by(m.queue_id))}
    stats.update(log_stats(conn, queue_id))
    return stats


class SqlDefinitions:
    """Definition reads and writes (mixed into :class:`SqlStore`)."""

    # ------------------------------------------------------------- definitions
    def load_definitions(self) -> Definitions:
        with self._read() as conn:
            stats = _queue_stats(conn)
            vh = [
                {"name": r.name, "metadata": json.loads(r.metadata_json),
                 "default_queue_type": r.default_queue_type}
                for r in conn.execute(select(vhosts).order_by(vhosts.c.name))
            ]
            us = [
                {
                    "name": r.name,
                    "password_hash": r.password_hash,
                    "hashing_algorithm": r.hashing_algorithm,
                    "tags": json.loads(r.tags_json),
                }
                for r in conn.execute(select(users).order_by(users.c.name))
            ]
            perms = [dict(r._mapping) for r in conn.execute(select(permissions))]
            exs = [
                {**r._mapping, "arguments": bytes(r.arguments)}
                for r in conn.execute(select(exchanges).order_by(exchanges.c.vhost, exchanges.c.name))
            ]
            qs = []
            for r in conn.execute(select(queues).order_by(queues.c.id)):
                count, min_seq, max_seq = stats.get(r.id, (0, 0, 0))
                qs.append(
                    {
                        **r._mapping,
                        "arguments": bytes(r.arguments),
                        "message_count": count,
                        "min_seq": min_seq,
                        "max_seq": max_seq,
                    }
                )
            bs = [
                {
                    "vhost": r.vhost,
                    "source": r.source,
                    "destination": r.destination,
                    "destination_type": r.destination_type,
                    "routing_key": r.routing_key,
                    "arguments": bytes(r.arguments),
                }
                for r in conn.execute(select(bindings))
            ]
        return Definitions(vh, us, perms, exs, qs, bs)

    def queue_counts(self, queue_id: int) -> dict:
        """One queue's stored messages as ``load_definitions`` gives them in its queue row
        (``message_count``, ``min_seq``, ``max_seq``), read now."""
        with self._read() as conn:
            count, min_seq, max_seq = _queue_stats(conn, queue_id).get(queue_id, (0, 0, 0))
        return {"message_count": count, "min_seq": min_seq, "max_seq": max_seq}

    def put_vhost(self, name: str, metadata: dict | None = None, default_queue_type: str | None = None) -> None:
        with self._write() as conn:
            self._upsert(
                conn, vhosts, ["name"], {"name": name, "metadata_json": json.dumps(metadata or {}),
                                         "default_queue_type": default_queue_type}
            )

    def delete_vhost(self, name: str) -> None:
        with self._write() as conn:
            qids = select(queues.c.id).where(queues.c.vhost == name)
            conn.execute(delete(messages).where(messages.c.queue_id.in_(qids)))
            conn.execute(delete(stream_chunks).where(stream_chunks.c.queue_id.in_(qids)))
            for table in (bindings, queues, exchanges, permissions, stream_offsets, policies):
                conn.execute(delete(table).where(table.c.vhost == name))
            conn.execute(delete(vhosts).where(vhosts.c.name == name))

    def put_user(
        self, name: str, password_hash: str, hashing_algorithm: str, tags: list[str]
    ) -> None:
        values = {
            "name": name,
            "password_hash": password_hash,
            "hashing_algorithm": hashing_algorithm,
            "tags_json": json.dumps(list(tags)),
        }
        with self._write() as conn:
            self._upsert(conn, users, ["name"], values)

    def seed_access(self, vhost_names: list[str], user_rows: list[tuple[str, str, str, list[str]]],
                    permission_rows: list[tuple[str, str, str, str, str]]) -> bool:
        """Write the defaults of a fresh store (vhosts, users as (name, password_hash, algorithm,
        tags), permissions as (user, vhost, configure, write, read)) in one transaction, only if
        the store has no user yet: True if written, False if another process seeded it first
        (PostgreSQL: serialised by a transaction-level advisory lock; SQLite: BEGIN IMMEDIATE)."""
        with self._write() as conn:
            if self._dialect == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('exchange-broker: seed access'))")
            if conn.scalar(select(func.count()).select_from(users)):
                return False
            for name in vhost_names:
                self._upsert(conn, vhosts, ["name"], {"name": name, "metadata_json": "{}"})
            for name, pw, algo, tags in user_rows:
                self._upsert(conn, users, ["name"], {"name": name, "password_hash": pw,
                                                     "hashing_algorithm": algo, "tags_json": json.dumps(list(tags))})
            for user, vhost, configure, write, read in permission_rows:
                self._upsert(conn, permissions, ["user", "vhost"], {"user": user, "vhost": vhost, "configure": configure,
                                                                   "write": write, "read": read})
        return True

    def delete_user(self, name: str) -> None:
        with self._write() as conn:
            conn.execute(delete(permissions).where(permissions.c.user == name))
            conn.execute(delete(users).where(users.c.name == name))

    def put_permission(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        values = {"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read}
        with self._write() as conn:
            self._upsert(conn, permissions, ["user", "vhost"], values)

    def delete_permission(self, user: str, vhost: str) -> None:
        with self._write() as conn:
            conn.execute(
                delete(permissions).where(permissions.c.user == user, permissions.c.vhost == vhost)
            )

    def put_exchange(
        self,
        vhost: str,
        name: str,
        type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: bytes,
    ) -> None:
        values = {
            "vhost": vhost,
            "name": name,
            "type": type,
            "durable": bool(durable),
            "auto_delete": bool(auto_delete),
            "internal": bool(internal),
            "arguments": bytes(arguments),
        }
        with self._write() as conn:
            self._upsert(conn, exchanges, ["vhost", "name"], values)

    def delete_exchange(self, vhost: str, name: str) -> None:
        b = bindings.c
        with self._write() as conn:
            conn.execute(
                delete(bindings).where(
                    b.vhost == vhost,
                    (b.source == name) | ((b.destination == name) & (b.destination_type == "exchange")),
                )
            )
            conn.execute(
                delete(exchanges).where(exchanges.c.vhost == vhost, exchanges.c.name == name)
            )

    def reserve_queue_ids(self, n: int) -> list[int] | None:
        """``n`` queue ids nobody else will use, from the ``queue_ids`` sequence (PostgreSQL: every
        broker process on the store shares it). None on SQLite: a single process allocates them."""
        if self._dialect != "postgresql":
            return None
        with self._read() as conn:
            rows = conn.exec_driver_sql(f"SELECT nextval('queue_ids') FROM generate_series(1, {int(n)})")
            return [int(r[0]) for r in rows]

    def put_queue(
        self,
        vhost: str,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: bytes,
        queue_id: int | None = None,
    ) -> int:
        values: dict[str, Any] = {
            "vhost": vhost,
            "name": name,
            "durable": bool(durable),
            "exclusive": bool(exclusive),
            "auto_delete": bool(auto_delete),
            "arguments": bytes(arguments),
        }
        with self._write() as conn:
            if queue_id is None:
                stmt = self._insert(queues).values(**values)
                stmt = stmt.on_conflict_do_update(
                    index_elements=["vhost", "name"],
                    set_={k: stmt.excluded[k] for k in values if k not in ("vhost", "name")},
                ).returning(queues.c.id)
                return int(conn.execute(stmt).scalar_one())
            self._put_queue_with_id(conn, int(queue_id), values)
            return int(queue_id)

    def _put_queue_with_id(self, conn: Connection, queue_id: int, values: dict[str, Any]) -> None:
        q = queues.c
        old = conn.scalar(select(q.id).where(q.vhost == values["vhost"], q.name == values["name"]))
        if old == queue_id:
            conn.execute(update(queues).where(q.id == queue_id).values(**values))
            return
        if old is not None:  # the caller sees a new queue: drop the stale row and its messages
            conn.execute(delete(messages).where(messages.c.queue_id == old))
            conn.execute(delete(stream_chunks).where(stream_chunks.c.queue_id == old))
            conn.execute(delete(queues).where(q.id == old))
        conn.execute(insert(queues).values(id=queue_id, **values))
        if self._dialect == "postgresql":  # keep the serial ahead of caller-assigned ids
            conn.execute(
                select(
                    func.setval(
                        func.pg_get_serial_sequence("queues", "id"),
                        select(func.max(q.id)).scalar_subquery(),
                    )
                )
            )

    def delete_queue(self, vhost: str, name: str) -> None:
        b = bindings.c
        with self._write() as conn:
            qid = conn.scalar(select(queues.c.id).where(queues.c.vhost == vhost, queues.c.name == name))
            if qid is not None:
                conn.execute(delete(messages).where(messages.c.queue_id == qid))
                conn.execute(delete(stream_chunks).where(stream_chunks.c.queue_id == qid))
            conn.execute(
                delete(bindings).where(
                    b.vhost == vhost, b.destination == name, b.destination_type == "queue"
                )
            )
            conn.execute(
                delete(stream_offsets).where(
                    stream_offsets.c.vhost == vhost, stream_offsets.c.queue == name
                )
            )
            conn.execute(delete(queues).where(queues.c.vhost == vhost, queues.c.name == name))

    def _binding_key(
        self, vhost: str, source: str, destination: str, destination_type: str, routing_key: str,
        arguments: bytes,
    ) -> dict:
        if destination_type not in ("queue", "exchange"):
            raise ValueError(f"destination_type must be 'queue' or 'exchange', not {destination_type!r}")
        return {
            "vhost": vhost,
            "source": source,
            "destination": destination,
            "destination_type": destination_type,
            "routing_key": routing_key,
            "arguments_sha1": _args_sha1(arguments),
        }

    def put_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_type: str,
        routing_key: str,
        arguments: bytes,
    ) -> None:
        key = self._binding_key(vhost, source, destination, destination_type, routing_key, arguments)
        stmt = (
            self._insert(bindings)
            .values(**key, arguments=bytes(arguments))
            .on_conflict_do_nothing(index_elements=list(key))
        )
        with self._write() as conn:
            conn.execute(stmt)

    def delete_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_type: str,
        routing_key: str,
        arguments: bytes,
    ) -> None:
        key = self._binding_key(vhost, source, destination, destination_type, routing_key, arguments)
        with self._write() as conn:
            conn.execute(delete(bindings).where(*(bindings.c[k] == v for k, v in key.items())))
