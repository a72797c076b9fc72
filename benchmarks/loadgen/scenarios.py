"""amqp_load's scenarios: declare the queues, attach the consumers, run timed or --verify.

transient           1 producer, 1 consumer (auto-ack), transient messages, non-durable queue
transient-confirms  the same with publisher confirms, manual acks (multiple every N), prefetch
persistent          persistent messages on a durable queue, confirms and manual acks
                    (``confirms`` is its older name and still works)
fanout              1 producer to a fanout exchange bound to --queues queues (default 4), one
                    auto-ack consumer connection per queue; reports deliveries/s over all queues
"""
from __future__ import annotations

import asyncio
import sys
import time
import uuid

from pamqp import commands

from .client import AMQPError, Connection
from .publisher import Publisher
from .split import ConsumerProcess
from .verify import run_verify
from .wire import body_offset, encode_publish, encode_publish_pamqp, server_name

SCENARIOS = {
    "transient": dict(durable=False, delivery_mode=1, confirms=False, no_ack=True, fanout=False),
    "transient-confirms": dict(durable=False, delivery_mode=1, confirms=True, no_ack=False,
                               fanout=False),
    "persistent": dict(durable=True, delivery_mode=2, confirms=True, no_ack=False, fanout=False),
    "fanout": dict(durable=False, delivery_mode=1, confirms=False, no_ack=True, fanout=True),
}
ALIASES = {"confirms": "persistent"}


def _rate(a: float, b: float, dt: float) -> float:
    return (b - a) / dt if dt > 0 else 0.0


def _ack_every(opts) -> int:
    every = max(1, opts.ack_every)
    if opts.prefetch:
        every = max(1, min(every, opts.prefetch // 2))
    return every


async def _declare(prod: Connection, opts, sc, name: str, queues: list[str]) -> str:
    """Declare the benchmark queue(s) (and the fanout exchange); returns the exchange name."""
    durable = sc["durable"] or opts.queue_type in ("quorum", "stream")
    args = {"x-queue-type": opts.queue_type} if opts.queue_type else {}
    exchange = ""
    if sc["fanout"]:
        exchange = name
        await prod.rpc(commands.Exchange.Declare(exchange=exchange, exchange_type="fanout",
                                                 durable=durable, auto_delete=False),
                       "Exchange.DeclareOk")
    for q in queues:
        await prod.rpc(commands.Queue.Declare(queue=q, durable=durable, auto_delete=not durable,
                                              arguments=args), "Queue.DeclareOk")
        if exchange:
            await prod.rpc(commands.Queue.Bind(queue=q, exchange=exchange, routing_key=""),
                           "Queue.BindOk")
    return exchange


async def _cleanup(prod: Connection, exchange: str, queues: list[str], timeout: float) -> None:
    for q in queues:
        await prod.rpc(commands.Queue.Delete(queue=q), "Queue.DeleteOk", timeout=timeout)
    if exchange:
        await prod.rpc(commands.Exchange.Delete(exchange=exchange), "Exchange.DeleteOk",
                       timeout=timeout)


async def run(opts) -> dict:
    name = ALIASES.get(opts.scenario, opts.scenario)
    sc = SCENARIOS[name]
    loop = asyncio.get_running_loop()
    base = f"amqp-load-{name}-{uuid.uuid4().hex[:10]}"
    n_queues = max(1, opts.queues) if sc["fanout"] else 1
    queues = [base] if n_queues == 1 else [f"{base}-{i}" for i in range(n_queues)]
    conn_args = (opts.host, opts.port, opts.user, opts.password, opts.vhost,
                 opts.heartbeat, opts.connect_timeout)

    prod = Connection("producer")
    split = bool(getattr(opts, "consumer_process", False))
    consumers = [] if split else [Connection("consumer" if n_queues == 1 else f"consumer-{i}")
                                  for i in range(n_queues)]
    conns = [prod, *consumers]
    result: dict = {
        "scenario": opts.scenario, "host": opts.host, "port": opts.port,
        "size": opts.size, "queue": base, "queues": n_queues,
        "delivery_mode": sc["delivery_mode"], "durable_queue": sc["durable"],
        "queue_type": opts.queue_type or "classic", "confirms": sc["confirms"],
        "event_loop": type(loop).__module__.split(".")[0],
        "consumer_process": split,
    }
    declared = False
    exchange = base if sc["fanout"] else ""
    try:
        for c in conns:
            await c.open(*conn_args)
        result["server"] = server_name(prod.server_properties)
        declared = True
        exchange = await _declare(prod, opts, sc, base, queues)
        if sc["confirms"]:
            await prod.rpc(commands.Confirm.Select(), "Confirm.SelectOk")
        if split:
            result["ack_mode"] = "no_ack (auto-ack)" if sc["no_ack"] else (
                f"basic.ack multiple=True every {_ack_every(opts)} deliveries")
            if not sc["no_ack"]:
                result["prefetch"] = opts.prefetch
            for i, q in enumerate(queues):
                cp = ConsumerProcess("consumer" if n_queues == 1 else f"consumer-{i}",
                                     conn_args, q, sc["no_ack"], opts.prefetch, _ack_every(opts),
                                     opts.no_uvloop)
                consumers.append(cp)
                await cp.start(opts.connect_timeout + 20)
        for cons, q in zip([] if split else consumers, queues):
            if sc["no_ack"]:
                cons.ack_every = 0
                result["ack_mode"] = "no_ack (auto-ack)"
            else:
                await cons.rpc(commands.Basic.Qos(prefetch_count=opts.prefetch), "Basic.QosOk")
                every = _ack_every(opts)
                cons.ack_every = every
                result["prefetch"] = opts.prefetch
                result["ack_mode"] = ("basic.ack per message" if every == 1 else
                                      f"basic.ack multiple=True every {every} deliveries "
                                      f"(+ flush after 20 ms idle)")
            await cons.rpc(commands.Basic.Consume(queue=q, consumer_tag="amqp-load",
                                                  no_ack=sc["no_ack"]), "Basic.ConsumeOk")

        body = bytes(opts.size)
        frame_max = prod.frame_max if split else min(c.frame_max for c in conns)
        routing_key = "" if exchange else base
        message = encode_publish(Connection.CHANNEL, exchange, routing_key, body,
                                 sc["delivery_mode"], frame_max)
        if message != encode_publish_pamqp(Connection.CHANNEL, exchange, routing_key, body,
                                           sc["delivery_mode"], frame_max):
            raise AssertionError("hot-path publish encoding differs from pamqp's")
        seq_offset = -1
        if opts.verify:
            seq_offset = body_offset(message, opts.size)
            for cons in consumers:
                cons.verify = True
                cons.v_expected_size = opts.size
        result["frame_max"] = frame_max
        # keep one write <= 256 KiB so big messages don't defeat back-pressure
        batch = max(1, min(opts.batch, (256 * 1024) // len(message)))
        result["batch"] = batch
        result["rate_limit"] = opts.rate or None
        result["max_backlog"] = opts.max_backlog or None
        if sc["confirms"]:
            result["max_unconfirmed"] = opts.max_unconfirmed

        pub = Publisher(prod, message, batch,
                        window=opts.max_unconfirmed if sc["confirms"] else 0,
                        limit=opts.count if opts.verify else 0,
                        seq_offset=seq_offset, rate=opts.rate,
                        consumer=None if split else consumers[0],
                        max_backlog=opts.max_backlog)

        if opts.verify:
            await run_verify(opts, sc, prod, consumers, pub, result)
        else:
            await _run_timed(opts, sc, prod, consumers, pub, result)

        if declared:
            try:
                await _cleanup(prod, exchange, queues, 15)
                declared = False
            except AMQPError as exc:
                print(f"warning: cleanup failed: {exc}", file=sys.stderr)
    finally:
        if declared and prod.error is None and prod.transport is not None:
            try:
                await _cleanup(prod, exchange, queues, 5)
            except Exception:  # noqa: BLE001
                pass
        for c in conns + (consumers if split else []):
            try:
                await c.close()
            except Exception:  # noqa: BLE001
                pass
    return result


async def _run_timed(opts, sc, prod, consumers, pub, result):
    loop = asyncio.get_running_loop()
    samples = []  # (t, published, consumed, confirmed, cpu)

    def snap():
        samples.append((loop.time(), pub.published, sum(c.deliveries for c in consumers),
                        prod.confirmed, time.process_time()))

    t0 = loop.time()
    # sample at the end of the warm-up, then once a second, then at the end
    marks = [opts.warmup]
    while marks[-1] + 1.0 < opts.seconds - 1e-6:
        marks.append(marks[-1] + 1.0)
    marks.append(opts.seconds)
    task = asyncio.ensure_future(pub.run())
    try:
        for mark in marks:
            delay = t0 + mark - loop.time()
            if delay > 0:
                done, _ = await asyncio.wait({task}, timeout=delay)
                if done:
                    task.result()  # propagate publisher errors
                    raise AMQPError("publisher stopped unexpectedly")
            for c in (prod, *consumers):
                if c.error is not None:
                    raise c.error
            snap()
    finally:
        pub.stopped = True
        try:
            await asyncio.wait_for(task, 5)
        except Exception:  # noqa: BLE001
            task.cancel()
    a, b = samples[0], samples[-1]
    dt = b[0] - a[0]
    per_second = [round(_rate(x[2], y[2], y[0] - x[0]), 1) for x, y in zip(samples, samples[1:])]
    consumed = sum(c.deliveries for c in consumers)
    result.update({
        "mode": "timed",
        "seconds": opts.seconds, "warmup": opts.warmup, "window_s": round(dt, 3),
        "published": pub.published, "consumed": consumed,
        "published_per_s": round(_rate(a[1], b[1], dt), 1),
        "consumed_per_s": round(_rate(a[2], b[2], dt), 1),
        "consumed_per_s_by_second": per_second,
        "backlog_at_end": pub.published * len(consumers) - consumed,
        "client_cpu": round((b[4] - a[4]) / dt, 3) if dt > 0 else None,
        "producer_write_pauses": prod.write_pauses,
    })
    if sc["confirms"]:
        result.update({
            "confirmed": prod.confirmed, "nacked": prod.nacked,
            "confirmed_per_s": round(_rate(a[3], b[3], dt), 1),
            "consumer_acks_sent": sum(c.acks_sent for c in consumers),
        })
