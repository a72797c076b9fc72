"""amqp_load --verify: publish exactly --count messages, each body stamped with its sequence
number, and check every consumer received each exactly once, in order, with the right size
(and, with confirms, that every publish was confirmed and none nacked)."""
from __future__ import annotations

import asyncio
import time


async def run_verify(opts, sc, prod, consumers, pub, result):
    loop = asyncio.get_running_loop()
    n = opts.count
    t0 = loop.time()
    cpu0 = time.process_time()
    await pub.run()
    t_pub = loop.time()
    # wait until everything arrived (and, with confirms, was confirmed);
    # give up after --verify-timeout seconds without progress
    last = (-1, -1)
    last_change = loop.time()
    while True:
        for c in (prod, *consumers):
            if c.error is not None:
                raise c.error
        done_recv = all(c.v_completed >= n for c in consumers)
        done_conf = not sc["confirms"] or prod.confirmed + prod.nacked >= n
        if done_recv and done_conf:
            break
        cur = (sum(c.v_completed for c in consumers), prod.confirmed + prod.nacked)
        if cur != last:
            last, last_change = cur, loop.time()
        elif loop.time() - last_change > opts.verify_timeout:
            break
        await asyncio.sleep(0.005)
    t_done = loop.time()
    cpu1 = time.process_time()
    for c in consumers:
        if c.ack_every:
            c._flush_acks()  # make sure the trailing partial ack batch reached the broker
    await asyncio.sleep(opts.verify_grace)  # catch duplicates / extras
    problems = []
    for c in consumers:
        where = f"{c.name}: " if len(consumers) > 1 else ""
        problems += [where + e for e in c.v_errors]
        if c.deliveries != n:
            problems.append(f"{where}received {c.deliveries} deliveries, expected exactly {n}")
        if c.v_completed != n:
            problems.append(f"{where}completed {c.v_completed} message bodies, expected {n}")
    if pub.published != n:
        problems.append(f"published {pub.published}, expected {n}")
    if sc["confirms"]:
        if prod.confirmed != n:
            problems.append(f"confirmed {prod.confirmed}, expected {n}")
        if prod.nacked:
            problems.append(f"{prod.nacked} publishes nacked")
    dt = t_done - t0
    consumed = sum(c.deliveries for c in consumers)
    result.update({
        "mode": "verify", "count": n,
        "published": pub.published, "consumed": consumed,
        "publish_seconds": round(t_pub - t0, 3), "total_seconds": round(dt, 3),
        "consumed_per_s": round(consumed / dt, 1) if dt > 0 else None,
        "client_cpu": round((cpu1 - cpu0) / dt, 3) if dt > 0 else None,
        "verify_ok": not problems, "verify_problems": problems,
    })
    if sc["confirms"]:
        result.update({"confirmed": prod.confirmed, "nacked": prod.nacked,
                       "confirmed_per_s": round(prod.confirmed / dt, 1) if dt > 0 else None})
