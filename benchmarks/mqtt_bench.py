#!/usr/bin/env python3
"""MQTT QoS 1 publish -> subscriber: this broker's MQTT listener and the Mosquitto on
127.0.0.1:1883 in the same run, with the same client (a lean asyncio MQTT 3.1.1 client built on
``exchange_broker/mqtt/codec.py``, uvloop when installed).

1. Throughput: one subscriber (QoS 1 subscription, a PUBACK for every delivery) and one
   publisher of QoS 1 100-byte messages keeping ``--window`` PUBLISHes awaiting their PUBACK,
   for ``--seconds``: delivered msg/s.
2. Latency: the publisher sends at ``--rate`` msg/s for ``--seconds``; each payload carries its
   send time; publish -> deliver p50 / p99 / max over the messages after ``--warmup`` s.

Ratios: ours / Mosquitto's msg/s and Mosquitto's latency / ours (>= 1.00: as good or better).
This broker is started here (``--mqtt-port`` on a free port, a fresh SQLite data dir); Mosquitto
is skipped with a message when nothing listens on 1883. A benchmark, never a test.

    python benchmarks/mqtt_bench.py                  # both brokers, 5 s per phase
    python benchmarks/mqtt_bench.py --seconds 3 --rate 2000
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from exchange_broker.mqtt import codec  # noqa: E402
from exchange_broker.mqtt import packets as p  # noqa: E402
from loadgen.brokers import OurBroker, free_port, port_open  # noqa: E402
from loadgen.report import latency_summary  # noqa: E402

_STAMP = struct.Struct(">Q")  # send time, perf_counter_ns


class Client(asyncio.Protocol):
    """One MQTT 3.1.1 connection: CONNECT, SUBSCRIBE, QoS 1 PUBLISH with a window of PUBACKs."""

    def __init__(self, on_publish=None) -> None:
        self.parser = codec.Parser(version=p.V311, server=False)
        self.on_publish = on_publish
        self.waiting: dict[int, asyncio.Future] = {}
        self.window = asyncio.Semaphore(1)
        self.next_id = 0
        self.transport = None
        self.acked = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        acks = []
        for pkt in self.parser.feed(data):
            t = type(pkt)
            if t is p.Publish:
                if self.on_publish is not None:
                    self.on_publish(pkt)
                if pkt.qos:
                    acks.append(codec.encode(p.Ack(p.PUBACK, pkt.packet_id)))
            elif t is p.Ack:
                self.acked += 1
                self.window.release()
            else:
                key = {p.ConnAck: -1, p.SubAck: -2}.get(t)
                fut = self.waiting.pop(key, None)
                if fut is not None and not fut.done():
                    fut.set_result(pkt)
        if acks:
            self.transport.write(b"".join(acks))

    async def request(self, key: int, data: bytes, timeout: float = 10.0):
        fut = self.waiting[key] = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await asyncio.wait_for(fut, timeout)

    @classmethod
    async def open(cls, port: int, user: str | None, on_publish=None, window: int = 1) -> "Client":
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(on_publish), "127.0.0.1", port)
        client.window = asyncio.Semaphore(window)
        connect = p.Connect(p.V311, f"bench-{uuid.uuid4().hex[:8]}", True, 60, user,
                            b"guest" if user else None)
        ack = await client.request(-1, codec.encode(connect))
        if ack.code:
            raise RuntimeError(f"CONNACK {ack.code}")
        return client

    async def subscribe(self, topic: str) -> None:
        ack = await self.request(-2, codec.encode(p.Subscribe(1, [p.Subscription(topic, 1)])))
        if ack.codes != [1]:
            raise RuntimeError(f"SUBACK {ack.codes}")

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.window.acquire()
        self.next_id = self.next_id % 65535 + 1
        self.transport.write(codec.encode(p.Publish(topic, payload, 1, packet_id=self.next_id)))

    def close(self) -> None:
        self.transport.write(codec.encode(p.Disconnect()))
        self.transport.close()


async def throughput(port: int, user, seconds: float, window: int) -> dict:
    topic = f"bench/{uuid.uuid4().hex[:8]}"
    got = [0]
    sub = await Client.open(port, user, lambda pkt: got.__setitem__(0, got[0] + 1))
    await sub.subscribe(topic)
    pub = await Client.open(port, user, window=window)
    body = b"x" * 100
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        await pub.publish(topic, body)
    sent = pub.next_id
    deadline = time.perf_counter() + 10
    while got[0] < pub.acked and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    pub.close()
    sub.close()
    return {"published": sent, "delivered": got[0], "msg_per_s": round(got[0] / elapsed)}


async def latency(port: int, user, seconds: float, rate: int, warmup: float) -> dict:
    topic = f"lat/{uuid.uuid4().hex[:8]}"
    samples: list[int] = []
    start = time.perf_counter_ns()
    skip_before = start + int(warmup * 1e9)

    def arrived(pkt) -> None:
        now = time.perf_counter_ns()
        sent = _STAMP.unpack_from(pkt.payload)[0]
        if sent >= skip_before:
            samples.append(now - sent)
    sub = await Client.open(port, user, arrived)
    await sub.subscribe(topic)
    pub = await Client.open(port, user, window=10_000)
    pad = b"x" * 92
    t0 = time.perf_counter()
    n = 0
    while (elapsed := time.perf_counter() - t0) < seconds:
        due = int(elapsed * rate) - n
        for _ in range(due):
            await pub.publish(topic, _STAMP.pack(time.perf_counter_ns()) + pad)
        n += max(due, 0)
        await asyncio.sleep(0.001)
    await asyncio.sleep(1.0)
    pub.close()
    sub.close()
    return {"sent": n, **latency_summary("deliver", samples)}


async def measure(port: int, user, opts) -> dict:
    out = await throughput(port, user, opts.seconds, opts.window)
    out.update(await latency(port, user, opts.seconds, opts.rate, opts.warmup))
    return out


def run(coro):
    try:
        import uvloop
        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--window", type=int, default=100, help="QoS 1 PUBLISHes awaiting PUBACK (throughput)")
    ap.add_argument("--rate", type=int, default=2000, help="msg/s of the latency phase")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--mosquitto-port", type=int, default=1883)
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args(argv)
    results = {}
    mqtt_port = free_port()
    with OurBroker(["--mqtt-port", str(mqtt_port)]) as ours:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", mqtt_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        results["exchange-broker"] = run(measure(mqtt_port, "guest", opts))
    if port_open("127.0.0.1", opts.mosquitto_port):
        try:
            results["mosquitto"] = run(measure(opts.mosquitto_port, None, opts))
        except Exception as exc:  # noqa: BLE001 - reported, the other figures still print
            results["mosquitto"] = {"error": str(exc)}
    else:
        print(f"Mosquitto is not listening on 127.0.0.1:{opts.mosquitto_port}: skipped", file=sys.stderr)
    if opts.json:
        print(json.dumps(results))
        return 0
    names = list(results)
    keys = ["msg_per_s", "deliver_p50_ms", "deliver_p99_ms", "deliver_max_ms"]
    print(f"{'figure':<18}" + "".join(f"{n:>18}" for n in names) + ("       ratio" if len(names) == 2 else ""))
    for k in keys:
        vals = [results[n].get(k) for n in names]
        line = f"{k:<18}" + "".join(f"{v!s:>18}" for v in vals)
        if len(vals) == 2 and all(isinstance(v, (int, float)) and v for v in vals):
            ratio = vals[0] / vals[1] if k == "msg_per_s" else vals[1] / vals[0]
            line += f"{ratio:>12.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
