"""The six RabbitMQ tutorials, written with aio-pika exactly as one writes them for RabbitMQ.

Each program of a tutorial (producer, consumers, RPC server and client) has its own connection and
runs as its own task. Plain test functions: each calls ``asyncio.run(main(...))``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import MutableMapping

import aio_pika
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika.abc import AbstractIncomingMessage

WAIT = 10.0     # upper bound for anything we wait for
SETTLE = 0.3    # after the expected messages arrived: time for an unexpected extra one to show up


async def wait_until(predicate, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def wait_for_counts(received: dict, expected: dict) -> None:
    """Wait until each consumer has at least its expected count, then a moment for extras."""
    await wait_until(lambda: all(len(received[k]) >= len(v) for k, v in expected.items()))
    await asyncio.sleep(SETTLE)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


# -- 1. "Hello World!" ---------------------------------------------------------------------------

def test_hello_world(broker):
    received: list = []

    async def receive(ready: asyncio.Event, stop: asyncio.Event):
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("hello")

            async def on_message(message: AbstractIncomingMessage) -> None:
                received.append(message.body.decode())

            await queue.consume(on_message, no_ack=True)
            ready.set()
            await stop.wait()

    async def send():
        connection = await aio_pika.connect(broker.url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("hello")
            await channel.default_exchange.publish(Message(b"Hello World!"), routing_key=queue.name)

    async def main():
        ready, stop = asyncio.Event(), asyncio.Event()
        receiver = asyncio.create_task(receive(ready, stop))
        await asyncio.wait_for(ready.wait(), WAIT)
        await send()
        await wait_for_counts({"r": received}, {"r": ["Hello World!"]})
        stop.set()
        await receiver

    run(main())
    assert received == ["Hello World!"]


# -- 2. Work queues ------------------------------------------------------------------------------

async def new_task(url: str, tasks: list[str]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("task_queue", durable=True)
        for body in tasks:
            message = Message(body.encode(), delivery_mode=DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, routing_key="task_queue")


async def worker(url: str, name: str, log: list, delay_per_dot: float, ready: asyncio.Event,
                 stop: asyncio.Event, prefetch: int | None = 1) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        if prefetch is not None:
            await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue("task_queue", durable=True)

        async def on_message(message: AbstractIncomingMessage) -> None:
            async with message.process():
                log.append((name, "start", message.body.decode(), message.delivery_mode))
                await asyncio.sleep(message.body.count(b".") * delay_per_dot)
                log.append((name, "done", message.body.decode(), message.delivery_mode))

        await queue.consume(on_message)
        ready.set()
        await stop.wait()


async def run_workers(url: str, tasks: list[str], delay_per_dot: float, prefetch) -> list:
    log: list = []
    stop = asyncio.Event()
    workers = []
    for name in ("worker1", "worker2"):   # worker1's consumer is registered first
        ready = asyncio.Event()
        workers.append(asyncio.create_task(worker(url, name, log, delay_per_dot, ready, stop,
                                                  prefetch)))
        await asyncio.wait_for(ready.wait(), WAIT)
    await new_task(url, tasks)
    await wait_until(lambda: sum(e[1] == "done" for e in log) >= len(tasks))
    await asyncio.sleep(SETTLE)
    stop.set()
    await asyncio.gather(*workers)
    return log


def _done_by(log: list, name: str) -> list:
    return [e[2] for e in log if e[0] == name and e[1] == "done"]


def test_work_queues_fair_dispatch(broker):
    tasks = ["Heavy task.....", "Light 1.", "Light 2.", "Light 3.", "Light 4."]
    log: list = []

    async def main():
        log.extend(await run_workers(broker.url, tasks, 0.25, prefetch=1))

    run(main())
    assert _done_by(log, "worker1") == ["Heavy task....."]
    assert _done_by(log, "worker2") == ["Light 1.", "Light 2.", "Light 3.", "Light 4."]
    assert {e[3] for e in log} == {DeliveryMode.PERSISTENT}
    for name in ("worker1", "worker2"):   # prefetch_count=1: one task at a time per worker
        events = [e[1] for e in log if e[0] == name]
        assert events == ["start", "done"] * (len(events) // 2)


def test_work_queues_round_robin(broker):
    tasks = [f"Task {i}." for i in range(1, 9)]
    log: list = []

    async def main():
        log.extend(await run_workers(broker.url, tasks, 0.02, prefetch=None))

    run(main())
    assert _done_by(log, "worker1") == ["Task 1.", "Task 3.", "Task 5.", "Task 7."]
    assert _done_by(log, "worker2") == ["Task 2.", "Task 4.", "Task 6.", "Task 8."]


# -- 3. Publish/Subscribe ------------------------------------------------------------------------

async def receive_logs(url: str, received: list, ready: asyncio.Event, stop: asyncio.Event,
                       queue_names: list) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        logs_exchange = await channel.declare_exchange("logs", ExchangeType.FANOUT)
        queue = await channel.declare_queue(exclusive=True)
        queue_names.append(queue.name)
        await queue.bind(logs_exchange)

        async def on_message(message: AbstractIncomingMessage) -> None:
            async with message.process():
                received.append(message.body.decode())

        await queue.consume(on_message)
        ready.set()
        await stop.wait()


async def emit_log(url: str, exchange_name: str, exchange_type: ExchangeType,
                   messages: list[tuple[str, str]]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(exchange_name, exchange_type)
        for routing_key, body in messages:
            await exchange.publish(Message(body.encode()), routing_key=routing_key)


def test_publish_subscribe(broker):
    logs = ["info: Hello World!", "warning: disk 80% full", "error: disk full"]
    received = {"receiver1": [], "receiver2": []}
    queue_names: list = []

    async def main():
        # emitted before anyone listens: dropped by the fanout exchange
        await emit_log(broker.url, "logs", ExchangeType.FANOUT, [("", "info: nobody hears this")])
        stop = asyncio.Event()
        tasks = []
        for name in received:
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(receive_logs(broker.url, received[name], ready, stop,
                                                          queue_names)))
            await asyncio.wait_for(ready.wait(), WAIT)
        await emit_log(broker.url, "logs", ExchangeType.FANOUT, [("", m) for m in logs])
        await wait_for_counts(received, {k: logs for k in received})
        stop.set()
        await asyncio.gather(*tasks)
        # the receivers are gone, and so are their exclusive server-named queues
        connection = await aio_pika.connect(broker.url)
        async with connection:
            for name in queue_names:
                channel = await connection.channel()
                try:
                    await channel.declare_queue(name, passive=True)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    continue
                raise AssertionError(f"exclusive queue {name} still exists")

    run(main())
    assert received == {"receiver1": logs, "receiver2": logs}
    assert len(set(queue_names)) == 2 and all(n.startswith("amq.gen-") for n in queue_names)


# -- 4. Routing and 5. Topics --------------------------------------------------------------------

async def receive_logs_bound(url: str, exchange_name: str, exchange_type: ExchangeType,
                             binding_keys: list[str], received: list, ready: asyncio.Event) -> None:
    """receive_logs_direct.py / receive_logs_topic.py: the queue iterator form, which runs until
    the task is cancelled (the tutorial's Ctrl+C)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        exchange = await channel.declare_exchange(exchange_name, exchange_type)
        queue = await channel.declare_queue(exclusive=True)
        for binding_key in binding_keys:
            await queue.bind(exchange, routing_key=binding_key)

        async with queue.iterator() as iterator:   # basic.consume is sent on entering
            ready.set()
            message: AbstractIncomingMessage
            async for message in iterator:
                async with message.process():
                    received.append((message.routing_key, message.body.decode()))


async def run_bound_receivers(url, exchange_name, exchange_type, bindings: dict, messages,
                              expected: dict) -> dict:
    """Start one receiver per binding list, emit the messages, wait for the expected ones."""
    received = {name: [] for name in bindings}
    tasks = []
    try:
        for name, keys in bindings.items():
            ready = asyncio.Event()
            tasks.append(asyncio.create_task(receive_logs_bound(url, exchange_name, exchange_type,
                                                                keys, received[name], ready)))
            await asyncio.wait_for(ready.wait(), WAIT)
        await emit_log(url, exchange_name, exchange_type, messages)
        await wait_for_counts(received, expected)
    finally:
        for task in tasks:
            task.cancel()
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(result, asyncio.CancelledError):
                raise AssertionError(f"receiver failed: {result!r}")
    return received


def test_routing(broker):
    emitted = [("info", "Hello World!"), ("warning", "Run. Run. Or it will explode."),
               ("error", "Run. Run. Or it will explode."), ("debug", "nobody"),
               ("info", "second")]
    expected = {
        "errors_to_disk": [("error", "Run. Run. Or it will explode.")],
        "console": [("info", "Hello World!"), ("warning", "Run. Run. Or it will explode."),
                    ("error", "Run. Run. Or it will explode."), ("info", "second")],
    }
    result: dict = {}

    async def main():
        result.update(await run_bound_receivers(
            broker.url, "direct_logs", ExchangeType.DIRECT,
            {"errors_to_disk": ["error"], "console": ["info", "warning", "error"]}, emitted,
            expected))

    run(main())
    assert result == expected


TOPIC_KEYS = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
              "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.new.rabbit",
              "lazy.orange.new.rabbit", "quick.orange.male.rabbit", "lazy"]
KERN_KEYS = ["kern.critical", "kern.info", "cron.critical", "kern.critical.extra", "kern"]


def test_topics(broker):
    expected_keys = {
        "Q1": ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"],
        "Q2": ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox",
               "lazy.pink.rabbit",           # matches both of Q2's bindings, delivered once
               "lazy.orange.new.rabbit", "lazy"],
        "all": TOPIC_KEYS + KERN_KEYS,
        "kern_and_critical": ["kern.critical", "kern.info", "cron.critical"],
    }
    expected = {k: [(key, f"msg {key}") for key in v] for k, v in expected_keys.items()}
    result: dict = {}

    async def main():
        result.update(await run_bound_receivers(
            broker.url, "topic_logs", ExchangeType.TOPIC,
            {"Q1": ["*.orange.*"], "Q2": ["*.*.rabbit", "lazy.#"], "all": ["#"],
             "kern_and_critical": ["kern.*", "*.critical"]},
            [(k, f"msg {k}") for k in TOPIC_KEYS + KERN_KEYS], expected))

    run(main())
    assert result == expected


# -- 6. RPC --------------------------------------------------------------------------------------

def fibonacci(n: int) -> int:
    if n == 0:
        return 0
    elif n == 1:
        return 1
    else:
        return fibonacci(n - 1) + fibonacci(n - 2)


async def rpc_server(url: str, requests: list, ready: asyncio.Event, stop: asyncio.Event) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        exchange = channel.default_exchange
        queue = await channel.declare_queue("rpc_queue")

        async def on_request(message: AbstractIncomingMessage) -> None:
            async with message.process(requeue=False):
                assert message.reply_to is not None
                n = int(message.body.decode())
                requests.append((n, message.reply_to, message.correlation_id))
                response = str(fibonacci(n)).encode()
                await exchange.publish(Message(body=response, correlation_id=message.correlation_id),
                                       routing_key=message.reply_to)

        await queue.consume(on_request)
        ready.set()
        await stop.wait()


class FibonacciRpcClient:
    def __init__(self, url: str) -> None:
        self.url = url
        self.futures: MutableMapping[str, asyncio.Future] = {}
        self.unexpected: list = []

    async def connect(self) -> "FibonacciRpcClient":
        self.connection = await aio_pika.connect(self.url)
        self.channel = await self.connection.channel()
        self.callback_queue = await self.channel.declare_queue(exclusive=True)
        await self.callback_queue.consume(self.on_response, no_ack=True)
        return self

    async def on_response(self, message: AbstractIncomingMessage) -> None:
        if message.correlation_id not in self.futures:
            self.unexpected.append(message.correlation_id)
            return
        future: asyncio.Future = self.futures.pop(message.correlation_id)
        future.set_result(message.body)

    async def call(self, n: int) -> int:
        correlation_id = str(uuid.uuid4())
        future = asyncio.get_running_loop().create_future()
        self.futures[correlation_id] = future
        await self.channel.default_exchange.publish(
            Message(str(n).encode(), content_type="text/plain", correlation_id=correlation_id,
                    reply_to=self.callback_queue.name),
            routing_key="rpc_queue")
        return int(await asyncio.wait_for(future, WAIT))

    async def close(self) -> None:
        await self.connection.close()


def test_rpc(broker):
    requests: list = []
    out: dict = {}

    async def main():
        ready, stop = asyncio.Event(), asyncio.Event()
        server = asyncio.create_task(rpc_server(broker.url, requests, ready, stop))
        await asyncio.wait_for(ready.wait(), WAIT)
        client = await FibonacciRpcClient(broker.url).connect()
        out["queue"] = client.callback_queue.name
        out["sequential"] = [await client.call(n) for n in (0, 1, 2, 10, 20, 25)]
        # several calls in flight at once: answers are matched by correlation_id
        out["concurrent"] = await asyncio.gather(*(client.call(n) for n in range(3, 13)))
        out["unexpected"] = client.unexpected
        await client.close()
        stop.set()
        await server

    run(main())
    assert out["queue"].startswith("amq.gen-")
    assert out["sequential"] == [0, 1, 1, 55, 6765, 75025]
    assert out["concurrent"] == [2, 3, 5, 8, 13, 21, 34, 55, 89, 144]
    assert out["unexpected"] == []
    assert sorted(r[0] for r in requests) == sorted([0, 1, 2, 10, 20, 25] + list(range(3, 13)))
    assert {r[1] for r in requests} == {out["queue"]}
    assert len({r[2] for r in requests}) == 16
