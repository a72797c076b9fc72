"""Exactly-once state for streaming from classic/quorum queues (``dedupe=messageId``).

A queue has no offsets, so Spark cannot replay a micro-batch from the broker: after a crash
the messages of an unfinished batch come back *redelivered*, possibly mixed with new ones,
and a batch that the sink had already committed comes back too.  Two things make the output
exactly-once, both kept under ``stateLocation`` (any pyarrow filesystem: a local path,
``s3://``, ``hdfs://``...):

* **a write-ahead copy of every planned batch** (``batches/<end>-<start>.arrow``), written
  before ``latestOffset`` hands the batch's end offset to Spark.  When Spark replays that
  batch after a restart, the source returns exactly the same rows, so a sink that is
  idempotent per batch (the file sink, Delta, ``foreachBatch`` keyed on the batch id) writes
  it once.  The copy is deleted once the batch is committed.
* **the message ids of every planned batch** (``ids/<end>-<start>-<ms>.arrow``), kept for
  ``dedupeWindowSeconds``.  A delivery whose ``message_id`` is among them is a redelivery of
  a message that already belongs to a batch: it is dropped (and acked with the batch that
  dropped it).  Repeats of a message id published again within the window are dropped too.

Cost: every batch is written once more, on the driver (its bodies and properties); the
window's ids stay in driver memory (about 100 bytes plus the id per message) and on disk.
Messages without a ``message_id`` cannot be recognised and stay at-least-once.
"""

from __future__ import annotations

import logging
import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from .rows import PROPERTY_FIELDS, arrow_schema

log = logging.getLogger(__name__)

__all__ = ["DedupeLog"]

_IDS_SCHEMA = pa.schema([("message_id", pa.string())])
_MESSAGE_ID = PROPERTY_FIELDS.index("message_id")


def _filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    import os
    return pafs.LocalFileSystem(), os.path.abspath(location)


def _name(end: int, start: int) -> str:
    return f"{end:020d}-{start:020d}"


class DedupeLog:
    """The message-id window and the write-ahead batch copies of one streaming query."""

    def __init__(self, location: str, window_seconds: float, clock=time.time) -> None:
        self.fs, self.root = _filesystem(location)
        self.window = window_seconds
        self.clock = clock
        self.seen: dict[str, int] = {}            # message_id -> end offset of its batch
        self.batches: dict[int, list] = {}        # end -> [start, created (s), ids file, ids]
        self.fs.create_dir(f"{self.root}/batches", recursive=True)
        self.fs.create_dir(f"{self.root}/ids", recursive=True)
        self._load()

    # ------------------------------------------------------------------ files
    def _write(self, path: str, table: pa.Table) -> None:
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as out, ipc.new_stream(out, table.schema) as w:
            w.write_table(table)
        self.fs.move(tmp, path)                   # atomic on local filesystems and object stores

    def _read(self, path: str) -> pa.Table:
        with self.fs.open_input_stream(path) as src:
            return ipc.open_stream(src).read_all()

    def _list(self, sub: str) -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(f"{self.root}/{sub}", allow_not_found=True))
        return sorted(i.path for i in infos if i.is_file and i.path.endswith(".arrow"))

    def _load(self) -> None:
        now = self.clock()
        for path in self._list("ids"):
            end, start, ms = (int(x) for x in path.rsplit("/", 1)[-1][:-6].split("-"))
            if now - ms / 1000.0 > self.window:
                self.fs.delete_file(path)
                continue
            ids = self._read(path).column(0).to_pylist()
            self.batches[end] = [start, ms / 1000.0, path, ids]
            for mid in ids:
                self.seen[mid] = end
        log.info("dedupe state %s: %d message ids in %d batches", self.root, len(self.seen),
                 len(self.batches))

    # ------------------------------------------------------------------ the batch cycle
    def filter(self, deliveries) -> tuple[list, int]:
        """The deliveries to emit (first sight of their message_id) and how many were dropped."""
        keep = []
        fresh: set[str] = set()
        seen = self.seen
        for d in deliveries:
            mid = d.properties.message_id
            if mid is not None:
                if mid in seen or mid in fresh:
                    continue
                fresh.add(mid)
            keep.append(d)
        return keep, len(deliveries) - len(keep)

    def record(self, start: int, end: int, table: pa.Table) -> None:
        """Write the batch's copy and ids (durably) before Spark learns about ``end``."""
        self._write(f"{self.root}/batches/{_name(end, start)}.arrow", table)
        ids = table.column("properties").combine_chunks().field(_MESSAGE_ID)
        ids = pa.table([ids.filter(ids.is_valid())], schema=_IDS_SCHEMA)
        now = self.clock()
        path = f"{self.root}/ids/{_name(end, start)}-{int(now * 1000)}.arrow"
        self._write(path, ids)
        id_list = ids.column(0).to_pylist()
        self.batches[end] = [start, now, path, id_list]
        for mid in id_list:
            self.seen[mid] = end

    def replay(self, start: int, end: int) -> pa.Table | None:
        """The rows of batch [start, end) as first planned, or None if it was never recorded."""
        path = f"{self.root}/batches/{_name(end, start)}.arrow"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        table = self._read(path)
        return table.cast(arrow_schema()) if table.schema != arrow_schema() else table

    def committed(self, through: int, planning: bool = False) -> None:
        """Batches ending at or before ``through`` are committed: drop their copies and forget
        ids older than the window.  ``planning`` (called from ``latestOffset(through)``, when no
        batch after ``through`` can be live): also forget batches recorded after ``through``,
        which Spark never logged (a crash between our write and its offset log), so their
        messages, which come back redelivered, are emitted again instead of being dropped."""
        now = self.clock()
        for path in self._list("batches"):
            end = int(path.rsplit("/", 1)[-1].split("-")[0])
            if end <= through or planning:
                self.fs.delete_file(path)
        for end, (start, created, ids_path, ids) in sorted(self.batches.items()):
            stale = planning and end > through
            if not stale and now - created <= self.window:
                continue
            if stale:
                log.warning("dedupe: batch [%d, %d) was planned but never run; its messages "
                            "will be emitted again", start, end)
            self.fs.delete_file(ids_path)
            del self.batches[end]
            for mid in ids:
                if self.seen.get(mid) == end:
                    del self.seen[mid]
