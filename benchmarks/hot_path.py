"""CPU per message of the broker's hot path alone, without sockets or an event loop.

A Session (connection/session.py) is fed pre-encoded 256-publish batches on a broker driven by a
ManualClock; output is thrown away. It measures what one message costs in the protocol, channel,
routing and queue code, so that a change to them can be compared A/B on a noisy machine: process
CPU time, best of 5 rounds.

    python benchmarks/hot_path.py [transient|confirms|fanout|stream]
    PYTHONPATH=<other checkout> python benchmarks/hot_path.py transient    # the same on another commit

transient: a no-ack consumer; confirms: confirm mode, a consumer acking each batch with one
multiple ack; fanout: a fanout exchange to 4 queues, one no-ack consumer each; stream: confirm
mode into a stream queue (in memory: the broker has no store here) read by 2 consumers (prefetch
1,000) acking each batch with one multiple ack (per message: a publish and 2 deliveries).
"""

from __future__ import annotations

import argparse
import time

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from exchange_broker.testing import client_handshake
from exchange_broker.assembly import make_broker
from exchange_broker.connection.session import Session
from exchange_broker.core.clock import ManualClock

BATCH = 256
HANDSHAKE = client_handshake(1)


def setup_frames(mode: str) -> bytes:
    if mode == "fanout":
        out = pframe.marshal(commands.Exchange.Declare(exchange="fx", exchange_type="fanout"), 1)
        for i in range(4):
            out += pframe.marshal(commands.Queue.Declare(queue=f"f{i}"), 1)
            out += pframe.marshal(commands.Queue.Bind(queue=f"f{i}", exchange="fx"), 1)
            out += pframe.marshal(commands.Basic.Consume(queue=f"f{i}", consumer_tag=f"c{i}",
                                                         no_ack=True), 1)
        return out
    if mode == "stream":
        return (pframe.marshal(commands.Queue.Declare(queue="q", durable=True,
                                                      arguments={"x-queue-type": "stream"}), 1)
                + pframe.marshal(commands.Confirm.Select(), 1)
                + pframe.marshal(commands.Basic.Qos(prefetch_count=1000), 1)
                + b"".join(pframe.marshal(commands.Basic.Consume(
                    queue="q", consumer_tag=f"c{i}", arguments={"x-stream-offset": "first"}), 1)
                    for i in range(2)))
    out = pframe.marshal(commands.Queue.Declare(queue="q"), 1)
    if mode == "confirms":
        return out + (pframe.marshal(commands.Confirm.Select(), 1)
                      + pframe.marshal(commands.Basic.Consume(queue="q", consumer_tag="c"), 1))
    return out + pframe.marshal(commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True), 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", default="transient", choices=("transient", "confirms", "fanout", "stream"))
    p.add_argument("--size", type=int, default=100, help="body bytes (default 100)")
    p.add_argument("--rounds", type=int, default=200, help="batches per timed round (default 200)")
    opts = p.parse_args()
    clock = ManualClock()
    broker = make_broker(clock=clock)
    out: list[bytes] = []
    sess = Session(broker, out.append, lambda: None, ("127.0.0.1", 1))
    sess.data_received(HANDSHAKE)
    clock.advance()
    sess.data_received(setup_frames(opts.mode))
    clock.advance()
    out.clear()
    body = b"x" * opts.size
    exchange = "fx" if opts.mode == "fanout" else ""
    one = (pframe.marshal(commands.Basic.Publish(exchange=exchange, routing_key="q"), 1)
           + pframe.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), 1)
           + pframe.marshal(pbody.ContentBody(body), 1))
    batch = one * BATCH
    tag = 0

    def run(n: int) -> None:
        nonlocal tag
        for _ in range(n):
            sess.data_received(batch)
            clock.advance()
            if opts.mode in ("confirms", "stream"):
                tag += BATCH if opts.mode == "confirms" else 2 * BATCH
                sess.data_received(pframe.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=True), 1))
                clock.advance()
            out.clear()

    run(max(1, opts.rounds // 4))  # warm-up
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        run(opts.rounds)
        best = min(best, (time.process_time() - t) / (opts.rounds * BATCH) * 1e6)
    print(f"{opts.mode}: {best:.2f} us of CPU per message (best of 5 rounds of "
          f"{opts.rounds * BATCH:,} messages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
