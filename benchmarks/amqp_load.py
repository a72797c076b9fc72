#!/usr/bin/env python3
"""Lean AMQP 0-9-1 load generator.

Speaks the wire protocol directly on asyncio (uvloop when importable), with the client in
``loadgen/``:

* pamqp encodes/decodes the handshake and the other rare ("cold") methods;
* the hot path never goes through pamqp: a publish (basic.publish method
  frame + content header frame + body frame(s)) is encoded once with struct
  and written in large batches, and incoming frames are split with struct
  straight out of a bytearray.  Deliveries are only counted (and their
  delivery tag extracted when acks are needed); publisher confirms are
  parsed the same way.

Scenarios
---------
transient           1 producer + 1 consumer connection, transient messages
                    (delivery_mode 1), consumer with no_ack=True, on a fresh
                    non-durable auto-delete queue.  Reports consumed msgs/s.
transient-confirms  the same messages and queue, the producer in confirm mode
                    (at most --max-unconfirmed in flight), the consumer with
                    manual acks (multiple every --ack-every) and basic.qos
                    --prefetch.  Reports consumed/s and confirmed/s.
persistent          persistent messages (delivery_mode 2) on a fresh durable
                    queue, confirms and acks as above.  ``confirms`` is its
                    older name and still works.
fanout              1 producer to a fanout exchange bound to --queues (4)
                    non-durable queues, one auto-ack consumer connection per
                    queue.  Reports deliveries/s summed over the queues.

With --verify the producer publishes exactly --count messages (each body
carries its sequence number) and the run checks each consumer received
exactly that many, in order, with the right size and no duplicates.

Examples::

    python benchmarks/amqp_load.py --scenario transient
    python benchmarks/amqp_load.py --scenario persistent --seconds 10 --json
    python benchmarks/amqp_load.py --scenario transient --verify --count 200000
    python benchmarks/amqp_load.py --scenario fanout --verify --count 50000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# re-exported: the other benchmarks import the client from here
from loadgen.client import AMQPError, Connection, run_loop  # noqa: E402,F401
from loadgen.publisher import Publisher  # noqa: E402,F401
from loadgen.scenarios import ALIASES, SCENARIOS, run  # noqa: E402
from loadgen.wire import (DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_END, FRAME_HEADER,  # noqa: E402,F401
                          FRAME_HEARTBEAT, FRAME_METHOD, FRAME_OVERHEAD, _frame, _shortstr,
                          encode_publish)
from loadgen.wire import encode_publish_pamqp as _encode_publish_pamqp  # noqa: E402,F401
from loadgen.wire import server_name as _server_name  # noqa: E402,F401

__all__ = ["AMQPError", "Connection", "Publisher", "SCENARIOS", "run", "encode_publish",
           "DEFAULT_FRAME_MAX", "FRAME_BODY", "FRAME_END", "FRAME_HEADER", "FRAME_HEARTBEAT",
           "FRAME_METHOD", "FRAME_OVERHEAD", "_frame", "_shortstr", "_encode_publish_pamqp",
           "_server_name", "build_parser", "main"]


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Lean AMQP 0-9-1 load generator (raw frames, asyncio/uvloop).")
    p.add_argument("--scenario", choices=sorted([*SCENARIOS, *ALIASES]), default="transient",
                   help="transient, transient-confirms, persistent (alias confirms), fanout")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5672)
    p.add_argument("--user", default="guest")
    p.add_argument("--password", default="guest")
    p.add_argument("--vhost", default="/")
    p.add_argument("--seconds", type=float, default=10.0,
                   help="total run time incl. warm-up (default 10)")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds excluded from the measurement (default 1)")
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--batch", type=int, default=256,
                   help="messages per transport.write (default 256, capped so one write "
                        "stays <= 256 KiB)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="cap the publish rate in msgs/s (default 0 = as fast as "
                        "TCP back-pressure allows)")
    p.add_argument("--max-backlog", type=int, default=0,
                   help="pause publishing while published - consumed >= N, keeping "
                        "the queue short (default 0 = unlimited)")
    p.add_argument("--max-unconfirmed", type=int, default=500,
                   help="with confirms: max publishes awaiting confirm (default 500)")
    p.add_argument("--prefetch", type=int, default=200,
                   help="with manual acks: consumer basic.qos prefetch_count (default 200)")
    p.add_argument("--ack-every", type=int, default=50,
                   help="with manual acks: consumer acks with multiple=True every N deliveries, "
                        "capped at prefetch/2; 1 = one basic.ack per message (default 50)")
    p.add_argument("--heartbeat", type=int, default=0,
                   help="heartbeat seconds to negotiate (default 0 = off)")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--verify", action="store_true",
                   help="publish exactly --count messages and check every one is "
                        "consumed exactly once, in order")
    p.add_argument("--count", type=int, default=100000,
                   help="messages to publish with --verify (default 100000)")
    p.add_argument("--verify-timeout", type=float, default=15.0,
                   help="--verify gives up after this many seconds without progress")
    p.add_argument("--verify-grace", type=float, default=0.5,
                   help="--verify waits this long after completion to catch extras")
    p.add_argument("--queues", type=int, default=4,
                   help="fanout: queues bound to the exchange, one consumer each (default 4)")
    p.add_argument("--queue-type", default=None, choices=("classic", "quorum"),
                   help="x-queue-type of the benchmark queue (quorum queues are always durable)")
    p.add_argument("--consumer-process", action="store_true",
                   help="timed runs: each consumer connection in a process of its own (default: "
                        "one process, one event loop for all connections)")
    p.add_argument("--json", action="store_true", help="print one JSON line with results")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    return p


def _print_human(r: dict) -> None:
    print(f"scenario      : {r['scenario']}  (server {r.get('server', '?')} at "
          f"{r['host']}:{r['port']}, loop {r['event_loop']})")
    print(f"message       : {r['size']} B, delivery_mode {r['delivery_mode']}, "
          f"{'durable' if r['durable_queue'] else 'non-durable'} queue; "
          f"consumer {r['ack_mode']}")
    if r["mode"] == "timed":
        print(f"window        : {r['window_s']} s (after {r['warmup']} s warm-up)")
        print(f"published/s   : {r['published_per_s']:,.0f}")
        print(f"consumed/s    : {r['consumed_per_s']:,.0f}   per second: "
              + ", ".join(f"{x:,.0f}" for x in r["consumed_per_s_by_second"]))
        if "confirmed_per_s" in r:
            print(f"confirmed/s   : {r['confirmed_per_s']:,.0f}  (nacked {r['nacked']})")
        print(f"totals        : published {r['published']:,}, consumed {r['consumed']:,}, "
              f"backlog at end {r['backlog_at_end']:,}")
        print(f"client CPU    : {r['client_cpu']:.0%} of one core")
        if len(r["consumed_per_s_by_second"]) > 2:
            sd = statistics.pstdev(r["consumed_per_s_by_second"])
            print(f"stdev/s       : {sd:,.0f}")
    else:
        status = "OK" if r["verify_ok"] else "FAILED"
        print(f"verify        : {status}: published {r['published']:,}, "
              f"consumed {r['consumed']:,} of {r['count']:,}"
              + (f" x {r['queues']} queues" if r.get("queues", 1) > 1 else "")
              + (f", confirmed {r['confirmed']:,}, nacked {r['nacked']}"
                 if "confirmed" in r else ""))
        print(f"time          : publish {r['publish_seconds']} s, all consumed "
              f"{r['total_seconds']} s -> {r['consumed_per_s']:,.0f} msg/s")
        for p in r["verify_problems"]:
            print(f"  problem: {p}")


def main(argv=None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.verify and opts.size < 8:
        print("--verify needs --size >= 8 (the body carries a sequence number)",
              file=sys.stderr)
        return 2
    if not opts.verify and opts.seconds - opts.warmup < 0.5:
        print("--seconds must exceed --warmup by at least 0.5", file=sys.stderr)
        return 2
    if opts.consumer_process and (opts.verify or opts.max_backlog):
        print("--consumer-process is for timed runs without --max-backlog", file=sys.stderr)
        return 2
    if opts.batch < 1 or opts.max_unconfirmed < 1:
        print("--batch and --max-unconfirmed must be >= 1", file=sys.stderr)
        return 2
    try:
        result = run_loop(run(opts), opts.no_uvloop)
    except (AMQPError, OSError, asyncio.TimeoutError) as exc:
        msg = str(exc) or type(exc).__name__
        if opts.json:
            print(json.dumps({"scenario": opts.scenario, "host": opts.host,
                              "port": opts.port, "error": msg}))
        print(f"error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if opts.json:
        print(json.dumps(result, separators=(",", ":")))
    else:
        _print_human(result)
    if result.get("mode") == "verify" and not result["verify_ok"]:
        return 1
    if result.get("mode") == "timed" and result.get("client_cpu", 0) and \
            result["client_cpu"] > 0.9 and not opts.json:
        print("note: the load generator used >90% of a core; it may be the bottleneck",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
