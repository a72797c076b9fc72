"""The durable-store interface the broker core codes against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol


@dataclass
class StoredMessage:
    queue_id: int
    seq: int  # queue-local order, assigned by the broker, strictly rising per queue
    exchange: str
    routing_key: str
    properties: bytes  # raw AMQP content-header property bytes (opaque to the store)
    body: bytes
    created_ms: int  # publish time, epoch milliseconds
    expires_ms: int | None = None  # absolute expiry (TTL); None = never
    priority: int = 0
    redelivered: bool = False  # filled in by load: seq <= the queue's delivered mark


@dataclass
class Definitions:
    vhosts: list[dict]  # {"name", "metadata": dict, "default_queue_type": str | None}
    users: list[dict]  # {"name", "password_hash", "hashing_algorithm", "tags": list[str]}
    permissions: list[dict]  # {"user", "vhost", "configure", "write", "read"}
    exchanges: list[dict]  # {"vhost","name","type","durable","auto_delete","internal","arguments"}
    queues: list[dict]  # {"id","vhost","name","durable","exclusive","auto_delete","arguments",
    #  "message_count","min_seq","max_seq","delivered_mark"}
    bindings: list[dict]  # {"vhost","source","destination","destination_type","routing_key","arguments"}


class Store(Protocol):
    def open(self) -> None: ...
    def close(self) -> None: ...
    def load_definitions(self) -> Definitions: ...
    def queue_counts(self, queue_id: int) -> dict: ...

    def put_vhost(self, name: str, metadata: dict | None = None, default_queue_type: str | None = None) -> None: ...
    def delete_vhost(self, name: str) -> None: ...
    def put_user(
        self, name: str, password_hash: str, hashing_algorithm: str, tags: list[str]
    ) -> None: ...
    def delete_user(self, name: str) -> None: ...
    def put_permission(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None: ...
    def delete_permission(self, user: str, vhost: str) -> None: ...
    def put_exchange(
        self,
        vhost: str,
        name: str,
        type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: bytes,
    ) -> None: ...
    def delete_exchange(self, vhost: str, name: str) -> None: ...
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
        """Upsert; returns the queue id (stable for an existing queue). With ``queue_id`` the
        caller assigns the id: a stored queue of that name under another id is replaced."""
        ...
    def delete_queue(self, vhost: str, name: str) -> None: ...
    def put_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_type: str,
        routing_key: str,
        arguments: bytes,
    ) -> None: ...
    def delete_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_type: str,
        routing_key: str,
        arguments: bytes,
    ) -> None: ...

    def write_batch(
        self,
        appends: list[StoredMessage],
        removes: list[tuple[int, int]],
        delivered_marks: dict[int, int],
        purges: Iterable[int] = (),
        sync: bool = True,
        logs: dict[int, list] | None = None,
    ) -> None:
        """One transaction: purges, then appends (and ``logs``: stream appends, {queue id:
        consecutive messages}), then removes, then delivered marks.
        ``sync=False``: the commit need not be flushed to stable storage (it must reach the
        OS or database server before returning, so that a crash of this process loses nothing)."""
        ...

    def load_messages(self, queue_id: int, after_seq: int, limit: int) -> list[StoredMessage]: ...
    def queue_stats(self, queue_id: int) -> tuple[int, int, int]: ...

    def store_offset(self, vhost: str, queue: str, name: str, offset: int) -> None: ...
    def query_offset(self, vhost: str, queue: str, name: str) -> int | None: ...
    def load_offsets(self, vhost: str, queue: str) -> dict[str, int]: ...

    # stream logs (append-only queues; chunks of messages removed only from the head)
    def append_log(self, queue_id: int, entries: list) -> None: ...
    def log_last_ms(self, queue_id: int) -> int | None: ...
    def delete_messages_upto(self, queue_id: int, seq: int) -> int: ...
    def read_log(self, queue_id: int, start: int, end: int) -> list[tuple]: ...
    def log_bytes(self, queue_id: int) -> int: ...
    def find_seq_at_time(self, queue_id: int, created_ms: int) -> int | None: ...
    def iter_message_sizes(self, queue_id: int, chunk: int = 10000) -> Iterator[tuple[int, int, int]]: ...

    # delayed-message exchange (rows of table delayed_messages; see delayed_store.py)
    def insert_delayed(self, rows: Iterable[tuple]) -> None: ...
    def delete_delayed(self, ids: Iterable[int]) -> None: ...
    def delete_delayed_exchange(self, vhost: str, exchange: str) -> int: ...
    def load_delayed(self, from_due: int, from_id: int, before_due: int, limit: int) -> list: ...
    def delayed_stats(self) -> tuple[int, int, int | None]: ...
