"""CPU per message of the store's writer thread alone: what one commit of the persistent row costs.

Each commit is what the group-commit writer does under ``compare.py --scenario persistent``:
``write_batch`` of --batch appends, the previous batch's messages removed (acked) and the
queue's delivered mark raised. Prints process CPU per message (best of 5 rounds) and the wall
time, so that a change to ``persistence/`` can be compared A/B on a noisy machine:

    python benchmarks/store_path.py                                   # SQLite in a temp dir, FULL
    python benchmarks/store_path.py --sync OFF                         # CPU only, no fsync
    python benchmarks/store_path.py --url postgresql+psycopg://postgres@127.0.0.1/eb_bench
    PYTHONPATH=<other checkout> python benchmarks/store_path.py        # the same on another commit

On PostgreSQL the database must exist; the benchmark's queue (and its rows) is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from persistence.sql_store import SqlStore
from persistence.store import StoredMessage


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="store URL (default: SQLite in a temporary directory)")
    p.add_argument("--sync", default="FULL", help="SQLite synchronous level (default FULL)")
    p.add_argument("--batch", type=int, default=256, help="appends (and removes) per commit (default 256)")
    p.add_argument("--rounds", type=int, default=40, help="commits per timed round (default 40)")
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    opts = p.parse_args()
    tmp = None if opts.url else tempfile.mkdtemp(prefix="eb-store-path-")
    store = SqlStore(opts.url or f"sqlite:///{tmp}/broker.db", sqlite_synchronous=opts.sync)
    name = f"store-path-{os.getpid()}"
    try:
        store.open()
        store.put_vhost("/")
        qid = store.put_queue("/", name, True, False, False, b"")
        body = b"x" * opts.size
        seq, prev, batch = 1, [], opts.batch

        def commit() -> None:
            nonlocal seq, prev
            appends = [StoredMessage(qid, seq + i, "", name, b"\x10\x00\x02", body, 1) for i in range(batch)]
            store.write_batch(appends, prev, {qid: seq + batch - 1})
            prev = [(qid, seq + i) for i in range(batch)]
            seq += batch

        for _ in range(max(1, opts.rounds // 2)):  # warm-up
            commit()
        best_cpu = best_wall = float("inf")
        for _ in range(5):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(opts.rounds):
                commit()
            n = opts.rounds * batch
            best_cpu = min(best_cpu, (time.process_time() - cpu) / n * 1e6)
            best_wall = min(best_wall, (time.perf_counter() - wall) / n * 1e6)
        print(f"store writer: {best_cpu:.2f} us of CPU, {best_wall:.2f} us wall per message "
              f"(best of 5 rounds of {opts.rounds} commits of {batch}; {store._dialect}"
              f"{'' if opts.url else ', synchronous ' + opts.sync.upper()})")
        store.delete_queue("/", name)
    finally:
        store.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
