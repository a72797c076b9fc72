"""Drain a classic/quorum queue into files with Spark, acking only after each write.

CLI::

    python -m spark_integration.drain --url amqp://guest:guest@host:5672/%2F --queue Q \\
        --output /data/q [--format parquet|orc|json] [--max-messages N] [--chunk-size N]

Python::

    from spark_integration.drain import drain
    df = drain("amqp://...", "Q", "/data/q", format="parquet", spark=spark)

Per chunk (``chunk_size`` messages, default 100,000; driver memory stays bounded):

1. consume with manual acks and prefetch = chunk size, collect, cancel the consumer
   (deliveries are now held unacked by this connection);
2. build an Arrow table, ``spark.createDataFrame(table)``, write it (``append``, one
   output file per chunk) -- the write has committed when this returns;
3. ``basic.ack(last tag, multiple=True)`` then a round trip (passive queue.declare), so the
   broker is known to have processed the ack before the next chunk.

Any exception (a failed write included) aborts the TCP connection without acking: every
message of the chunk in progress goes back to the queue, flagged redelivered.  The same
happens when the process dies (kill -9, OOM, lost node): the broker requeues whatever the
connection held.  Chunks already acked are in the output exactly once.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue as _queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .amqp import AMQPError, ConnectionParams
from .chunk_writers import (ENGINES, FORMATS, arrow_chunk_writer, check_format, pick_engine,
                            spark_chunk_writer)
from .reader import connect, declare_passive, fetch_round
from .rows import to_table

log = logging.getLogger(__name__)

__all__ = ["drain", "run_drain", "drain_queue", "DrainStats", "AckLostError", "FORMATS",
           "ENGINES", "arrow_chunk_writer", "spark_chunk_writer", "check_format"]

DEFAULT_CHUNK = 100_000


class AckLostError(AMQPError):
    """The chunk was written but its ack may not have reached the broker."""


@dataclass
class DrainStats:
    queue: str
    output: str | None = None
    format: str | None = None
    messages: int = 0
    chunks: int = 0
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    consume_seconds: float = 0.0
    write_seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"queue": self.queue, "output": self.output, "format": self.format,
                "messages": self.messages, "chunks": self.chunks, "files": len(self.files),
                "seconds": round(self.seconds, 3), "msgs_per_s": round(self.rate, 1),
                "consume_seconds": round(self.consume_seconds, 3),
                "write_seconds": round(self.write_seconds, 3)}


class _Chunk:
    __slots__ = ("index", "table", "last_tag", "count", "consume_seconds")

    def __init__(self, index, table, last_tag, count, consume_seconds):
        self.index, self.table, self.last_tag = index, table, last_tag
        self.count, self.consume_seconds = count, consume_seconds


class _Source:
    """Owns the connection: fetches chunks (held unacked) and acks them once written."""

    def __init__(self, conn, queue, stats, chunk_size, max_messages, idle_timeout, batch_rows):
        self.conn, self.queue, self.stats = conn, queue, stats
        self.chunk_size, self.max_messages = chunk_size, max_messages
        self.idle_timeout, self.batch_rows = idle_timeout, batch_rows
        self.fetched = 0
        self.index = 0

    def next_chunk(self) -> _Chunk | None:
        want = self.chunk_size
        if self.max_messages is not None:
            want = min(want, self.max_messages - self.fetched)
        if want <= 0:
            return None
        t0 = time.perf_counter()
        ready = self.conn.sync(self.queue)          # ready count, excluding what we hold
        if ready <= 0:
            return None
        got = fetch_round(self.conn, self.queue, want, self.idle_timeout, expect=min(want, ready))
        if not got:
            return None
        table = to_table(got, self.queue, batch_rows=self.batch_rows)
        chunk = _Chunk(self.index, table, max(got.tags), len(got),
                       time.perf_counter() - t0)
        self.fetched += len(got)
        self.index += 1
        return chunk

    def ack(self, chunk: _Chunk) -> None:
        """Ack everything up to the chunk's last delivery tag, then a round trip so the broker
        is known to have processed it.  Later chunks have higher tags: never acked here."""
        try:
            self.conn.basic_ack(chunk.last_tag, multiple=True)
            self.conn.sync(self.queue)
        except AMQPError as exc:
            raise AckLostError(
                f"chunk {chunk.index} ({chunk.count} messages) was written to "
                f"{self.stats.output or 'the output'} but the broker connection failed before "
                f"its ack was confirmed ({exc}); if the ack did not reach the broker these "
                f"messages will be delivered again (flagged redelivered) and a later drain "
                f"writes them a second time", exc.code, exc.text) from exc
        self.stats.messages += chunk.count
        self.stats.chunks += 1
        log.info("drained chunk %d: %d messages (%d total)", chunk.index, chunk.count,
                 self.stats.messages)


_END = object()


def _run_sequential(src: _Source, write_chunk) -> None:
    while True:
        chunk = src.next_chunk()
        if chunk is None:
            return
        src.stats.consume_seconds += chunk.consume_seconds
        t0 = time.perf_counter()
        files = write_chunk(chunk.table, chunk.index)      # has committed when it returns
        src.stats.write_seconds += time.perf_counter() - t0
        src.stats.files.extend(files or [])
        chunk.table = None
        src.ack(chunk)


def _run_pipelined(src: _Source, write_chunk) -> None:
    """Fetch chunk k+1 (background thread, which owns the connection) while chunk k is
    written (this thread).

    * at most two chunks are held unacked (one being written, one fetched);
    * chunk k is acked only after write_chunk(k) returned: this thread hands written chunks
      back through ``written``; the fetcher acks them in order;
    * when this thread stops (done, failed write, KeyboardInterrupt...) it sends None; the
      fetcher still acks every chunk written before that, then exits; the connection is
      then closed (or aborted), which returns whatever is unacked to the queue.
    """
    handoff: _queue.Queue = _queue.Queue(maxsize=1)   # chunk | _END | exception
    written: _queue.Queue = _queue.Queue()            # written chunk | None (writer stopped)
    failed = threading.Event()

    def put(item) -> bool:
        while not failed.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except _queue.Full:
                continue
        return False

    def fetcher() -> None:
        unacked = 0
        try:
            while True:
                while unacked >= 2:
                    item = written.get()
                    if item is None:
                        return
                    src.ack(item)
                    unacked -= 1
                chunk = src.next_chunk()
                if chunk is None or not put(chunk):
                    break
                unacked += 1
            put(_END)
            while True:
                item = written.get()
                if item is None:
                    return
                src.ack(item)
        except BaseException as exc:  # surfaced in the writing thread
            put(exc)

    def fetch_failed(exc: BaseException) -> BaseException:
        behind = written_count - src.stats.chunks
        if behind > 0 and isinstance(exc, AMQPError) and not isinstance(exc, AckLostError):
            err = AckLostError(
                f"{behind} chunk(s) were written to {src.stats.output or 'the output'} but the "
                f"broker connection failed before they were acked ({exc}); their messages will "
                f"be delivered again (flagged redelivered) and a later drain writes them a "
                f"second time", exc.code, exc.text)
            err.__cause__ = exc
            return err
        return exc

    written_count = 0
    thread = threading.Thread(target=fetcher, name="amqp-drain-fetch", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise fetch_failed(item)
            src.stats.consume_seconds += item.consume_seconds
            t0 = time.perf_counter()
            files = write_chunk(item.table, item.index)    # has committed when it returns
            src.stats.write_seconds += time.perf_counter() - t0
            src.stats.files.extend(files or [])
            item.table = None
            written_count += 1
            written.put(item)
    except BaseException:
        failed.set()
        raise
    finally:
        written.put(None)
        thread.join(300)
    if thread.is_alive():
        raise AMQPError("drain: the fetch thread did not finish")
    # an ack failure after the last write is reported here
    while not handoff.empty():
        item = handoff.get_nowait()
        if isinstance(item, BaseException):
            raise fetch_failed(item)


def drain_queue(url: str | ConnectionParams, queue: str,
                write_chunk: Callable[[object, int], list[str] | None], *,
                chunk_size: int = DEFAULT_CHUNK, max_messages: int | None = None,
                idle_timeout: float = 1.0, batch_rows: int = 65536, pipeline: bool = True,
                stats: DrainStats | None = None) -> DrainStats:
    """The drain loop without Spark: ``write_chunk(arrow_table, chunk_index)`` must return
    only once the chunk is durably written (it may return the list of files written).

    pipeline=True fetches the next chunk while the current one is written (at most two
    chunks unacked); pipeline=False alternates fetch / write / ack.  Either way a chunk is
    acked only after its write returned, and any failure acks nothing more.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if max_messages is not None and max_messages < 0:
        raise ValueError(f"max_messages must be >= 0, got {max_messages}")
    params = url if isinstance(url, ConnectionParams) else ConnectionParams.from_url(url)
    stats = stats or DrainStats(queue)
    t0 = time.perf_counter()
    conn = connect(params)
    try:
        declare_passive(conn, queue)
        src = _Source(conn, queue, stats, chunk_size, max_messages, idle_timeout, batch_rows)
        (_run_pipelined if pipeline else _run_sequential)(src, write_chunk)
    except BaseException:
        conn.abort()   # nothing unacked is acked now: the broker requeues all of it
        raise
    else:
        conn.close()
    stats.seconds = time.perf_counter() - t0
    return stats


# ---------------------------------------------------------------------------- Spark
def _session(spark=None):
    if spark is not None:
        return spark
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    return active if active is not None else SparkSession.builder.getOrCreate()


def run_drain(url: str, queue: str, output: str, format: str = "parquet", *,
              max_messages: int | None = None, spark=None, chunk_size: int = DEFAULT_CHUNK,
              idle_timeout: float = 1.0, write_options: dict | None = None,
              engine: str = "auto") -> DrainStats:
    """Drain and return statistics (see ``drain`` for the DataFrame).  ``engine``: ``arrow``
    (pyarrow writes each chunk from the driver; parquet/orc), ``spark`` (one Spark job per
    chunk) or ``auto`` (arrow unless the format is json or ``write_options`` are given)."""
    fmt = check_format(format)
    engine = pick_engine(engine, fmt, write_options)
    params = ConnectionParams.from_url(url)
    stats = DrainStats(queue, output, fmt)
    if engine == "arrow":
        writer = arrow_chunk_writer(output, fmt)
    else:
        writer = spark_chunk_writer(_session(spark), output, fmt, write_options)
    drain_queue(params, queue, writer,
                chunk_size=chunk_size, max_messages=max_messages, idle_timeout=idle_timeout,
                stats=stats)
    return stats


def drain(url: str, queue: str, output: str, format: str = "parquet", *,
          max_messages: int | None = None, spark=None, chunk_size: int = DEFAULT_CHUNK,
          idle_timeout: float = 1.0, write_options: dict | None = None,
          engine: str = "auto"):
    """Drain ``queue`` into ``output`` and return a DataFrame of the messages drained
    (read back from the files this call wrote; empty DataFrame when the queue was empty)."""
    from .rows import spark_schema
    spark = _session(spark)
    stats = run_drain(url, queue, output, format, max_messages=max_messages, spark=spark,
                      chunk_size=chunk_size, idle_timeout=idle_timeout,
                      write_options=write_options, engine=engine)
    schema = spark_schema()
    if stats.messages == 0:
        return spark.createDataFrame([], schema)
    reader = spark.read.format(stats.format).schema(schema)
    if stats.files:
        return reader.load(stats.files)
    return reader.load(output)


# ---------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_integration.drain",
        description="Drain an AMQP 0-9-1 queue into Parquet/ORC/JSON with Spark. Messages are "
                    "acked only after the chunk holding them has been written.")
    p.add_argument("--url", required=True, help="amqp://user:pass@host:port/vhost")
    p.add_argument("--queue", required=True, help="queue to drain (classic or quorum)")
    p.add_argument("--output", required=True, help="output directory (appended to)")
    p.add_argument("--format", default="parquet", type=str.lower, choices=FORMATS)
    p.add_argument("--max-messages", type=int, default=None, help="stop after N messages")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK,
                   help=f"messages per chunk / output file (default {DEFAULT_CHUNK})")
    p.add_argument("--idle-timeout", type=float, default=1.0,
                   help="seconds without a delivery after which the queue counts as drained")
    p.add_argument("--engine", default="auto", type=str.lower, choices=ENGINES,
                   help="arrow: pyarrow writes each chunk (parquet/orc, no Spark job per "
                        "chunk); spark: one Spark job per chunk; auto (default): arrow unless "
                        "--format json")
    p.add_argument("--master", default=None,
                   help="Spark master (default: spark-submit's, else local[*])")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_messages is not None and args.max_messages < 0:
        print("error: --max-messages must be >= 0", file=sys.stderr)
        return 2
    if args.chunk_size < 1:
        print("error: --chunk-size must be >= 1", file=sys.stderr)
        return 2
    try:
        ConnectionParams.from_url(args.url)
    except ValueError as exc:
        print(f"error: --url: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("spark_integration").setLevel(logging.INFO)
    try:  # unreachable broker / bad credentials / missing queue: fail before starting Spark
        with connect(ConnectionParams.from_url(args.url)) as conn:
            declare_passive(conn, args.queue)
    except (AMQPError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    spark = None
    if pick_engine(args.engine, args.format, None) == "spark":   # arrow needs no Spark
        from pyspark.sql import SparkSession
        builder = SparkSession.builder.appName(f"amqp-drain-{args.queue}")
        if args.master:
            builder = builder.master(args.master)
        spark = builder.getOrCreate()
    try:
        stats = run_drain(args.url, args.queue, args.output, args.format,
                          max_messages=args.max_messages, spark=spark,
                          chunk_size=args.chunk_size, idle_timeout=args.idle_timeout,
                          engine=args.engine)
    except (AMQPError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(stats.as_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
