"""The six RabbitMQ tutorials, written with pika exactly as one writes them for RabbitMQ.

Every producer and consumer has its own BlockingConnection in its own thread (as the separate
programs of the tutorials would), against the in-process broker on an ephemeral port.
"""

from __future__ import annotations

import threading
import time
import uuid

import pika
import pytest

WAIT = 10.0       # upper bound for anything we wait for
SETTLE = 0.3      # after the expected messages arrived: time for an unexpected extra one to show up


def params(broker) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=broker.port,
                                     credentials=pika.PlainCredentials("guest", "guest"),
                                     heartbeat=0, blocked_connection_timeout=30)


class Consumer(threading.Thread):
    """A tutorial receive program: `setup(channel)` declares/binds and returns the queue name;
    `on_message(ch, method, properties, body)` is the tutorial's callback. Runs start_consuming()
    until stop() is called."""

    def __init__(self, broker, setup, *, auto_ack=True, prefetch=None, on_message=None, name=None):
        super().__init__(name=name or "consumer", daemon=True)
        self.broker = broker
        self.setup = setup
        self.auto_ack = auto_ack
        self.prefetch = prefetch
        self.user_callback = on_message
        self.received: list = []
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.connection = None
        self.channel = None
        self._cond = threading.Condition()

    def run(self):
        try:
            self.connection = pika.BlockingConnection(params(self.broker))
            self.channel = channel = self.connection.channel()
            queue = self.setup(channel)
            if self.prefetch is not None:
                channel.basic_qos(prefetch_count=self.prefetch)
            channel.basic_consume(queue=queue, on_message_callback=self._callback,
                                  auto_ack=self.auto_ack)
            self.ready.set()
            channel.start_consuming()
            self.connection.close()
        except BaseException as exc:  # surfaced in stop()
            self.error = exc
            self.ready.set()

    def _callback(self, ch, method, properties, body):
        if self.user_callback is not None:
            self.user_callback(ch, method, properties, body)
        with self._cond:
            self.received.append(body.decode())
            self._cond.notify_all()

    def start(self):
        if self.ident is None:   # starting an already running consumer is a no-op
            super().start()
        assert self.ready.wait(WAIT), "consumer did not start"
        if self.error:
            raise self.error
        return self

    def wait_for(self, n: int) -> list:
        with self._cond:
            self._cond.wait_for(lambda: len(self.received) >= n, WAIT)
            return list(self.received)

    def stop(self) -> list:
        if self.connection is not None and self.is_alive():
            self.connection.add_callback_threadsafe(self.channel.stop_consuming)
        self.join(WAIT)
        assert not self.is_alive(), "consumer did not stop"
        if self.error:
            raise self.error
        return list(self.received)


def run_consumers(consumers, produce, expected: dict):
    """Start the consumers, run the producer, wait for each consumer's expected messages, let any
    unexpected extra message arrive, stop them and check exactly what each one received."""
    for c in consumers:
        c.start()
    try:
        produce()
        for c in consumers:
            c.wait_for(len(expected[c.name]))
        time.sleep(SETTLE)
    finally:
        got = {c.name: c.stop() for c in consumers}
    assert got == expected


def publish_all(broker, exchange: str, messages, *, declare=None, **publish_kwargs):
    """A tutorial emit program: one connection, declare, basic_publish each message, close."""
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    if declare is not None:
        declare(channel)
    for routing_key, body in messages:
        channel.basic_publish(exchange=exchange, routing_key=routing_key, body=body, **publish_kwargs)
    connection.close()


# -- 1. "Hello World!" ---------------------------------------------------------------------------

def test_hello_world(broker):
    def receive_setup(channel):
        channel.queue_declare(queue="hello")
        return "hello"

    def send():
        connection = pika.BlockingConnection(params(broker))
        channel = connection.channel()
        channel.queue_declare(queue="hello")
        channel.basic_publish(exchange="", routing_key="hello", body="Hello World!")
        connection.close()

    run_consumers([Consumer(broker, receive_setup, name="receive")], send,
                  {"receive": ["Hello World!"]})


def test_hello_world_sent_before_receiver_starts(broker):
    """The message waits in the queue until the receiver program is started."""
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.queue_declare(queue="hello")
    channel.basic_publish(exchange="", routing_key="hello", body="Hello World!")
    assert channel.queue_declare(queue="hello", passive=True).method.message_count == 1
    connection.close()

    def receive_setup(ch):
        ch.queue_declare(queue="hello")
        return "hello"

    run_consumers([Consumer(broker, receive_setup, name="receive")], lambda: None,
                  {"receive": ["Hello World!"]})


# -- 2. Work queues ------------------------------------------------------------------------------

def _worker(broker, name, log, delay_per_dot, prefetch=1):
    def setup(channel):
        channel.queue_declare(queue="task_queue", durable=True)
        return "task_queue"

    def callback(ch, method, properties, body):
        log.append((name, "start", body.decode(), properties.delivery_mode))
        time.sleep(body.count(b".") * delay_per_dot)
        log.append((name, "done", body.decode(), properties.delivery_mode))
        ch.basic_ack(delivery_tag=method.delivery_tag)

    return Consumer(broker, setup, auto_ack=False, prefetch=prefetch, on_message=callback, name=name)


def _new_task(broker, tasks):
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    channel.queue_declare(queue="task_queue", durable=True)
    for message in tasks:
        channel.basic_publish(exchange="", routing_key="task_queue", body=message,
                              properties=pika.BasicProperties(
                                  delivery_mode=pika.DeliveryMode.Persistent))
    connection.close()


def test_work_queues_fair_dispatch(broker):
    """prefetch_count=1: a busy worker gets no new task; the idle one takes all the short ones."""
    log: list = []
    w1 = _worker(broker, "worker1", log, 0.25)   # consumer registered first: gets the first task
    w2 = _worker(broker, "worker2", log, 0.25)
    tasks = ["Heavy task.....", "Light 1.", "Light 2.", "Light 3.", "Light 4."]
    w1.start()
    w2.start()   # started (consume-ok) only after w1's consumer exists: dispatch order is fixed
    run_consumers([w1, w2], lambda: _new_task(broker, tasks),
                  {"worker1": ["Heavy task....."],
                   "worker2": ["Light 1.", "Light 2.", "Light 3.", "Light 4."]})
    # persistent messages arrive as persistent (delivery_mode 2)
    assert {entry[3] for entry in log} == {2}
    # with prefetch_count=1 a worker never starts a task before it acked the previous one
    for name in ("worker1", "worker2"):
        events = [e[1] for e in log if e[0] == name]
        assert events == ["start", "done"] * (len(events) // 2)


def test_work_queues_round_robin(broker):
    """The tutorial's first worker (no basic_qos yet): tasks go to the two workers in turn."""
    log: list = []
    w1 = _worker(broker, "worker1", log, 0.02, prefetch=None)
    w2 = _worker(broker, "worker2", log, 0.02, prefetch=None)
    tasks = [f"Task {i}." for i in range(1, 9)]
    w1.start()
    w2.start()
    run_consumers([w1, w2], lambda: _new_task(broker, tasks), {
        "worker1": ["Task 1.", "Task 3.", "Task 5.", "Task 7."],
        "worker2": ["Task 2.", "Task 4.", "Task 6.", "Task 8."],
    })


def test_work_queue_is_durable_and_unacked_tasks_are_redelivered(broker):
    """A worker that dies before acking: its task goes to another worker, marked redelivered."""
    _new_task(broker, ["Lost task..."])
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    declared = channel.queue_declare(queue="task_queue", durable=True, passive=True)
    assert declared.method.message_count == 1
    channel.basic_qos(prefetch_count=1)
    method, properties, body = next(channel.consume("task_queue", auto_ack=False,
                                                    inactivity_timeout=WAIT))
    assert body == b"Lost task..." and not method.redelivered
    connection.close()   # "dies" without acking

    redelivered: list = []
    w2 = _worker(broker, "worker2", [], 0.0)
    ack = w2.user_callback

    def record(ch, method, properties, body):
        redelivered.append(method.redelivered)
        ack(ch, method, properties, body)

    w2.user_callback = record
    run_consumers([w2], lambda: None, {"worker2": ["Lost task..."]})
    assert redelivered == [True]


# -- 3. Publish/Subscribe ----------------------------------------------------------------------

def _receive_logs(broker, name):
    def setup(channel):
        channel.exchange_declare(exchange="logs", exchange_type="fanout")
        result = channel.queue_declare(queue="", exclusive=True)
        queue_name = result.method.queue
        assert queue_name.startswith("amq.gen-")
        channel.queue_bind(exchange="logs", queue=queue_name)
        return queue_name

    return Consumer(broker, setup, name=name)


def test_publish_subscribe(broker):
    def declare(channel):
        channel.exchange_declare(exchange="logs", exchange_type="fanout")

    # emitted before anyone listens: the fanout exchange has no queue, the message is dropped
    publish_all(broker, "logs", [("", "info: nobody hears this")], declare=declare)

    logs = ["info: Hello World!", "warning: disk 80% full", "error: disk full"]
    run_consumers([_receive_logs(broker, "receiver1"), _receive_logs(broker, "receiver2")],
                  lambda: publish_all(broker, "logs", [("", m) for m in logs], declare=declare),
                  {"receiver1": logs, "receiver2": logs})


def test_publish_subscribe_exclusive_queues_go_away(broker):
    queues: list = []

    def setup(channel):
        channel.exchange_declare(exchange="logs", exchange_type="fanout")
        queue_name = channel.queue_declare(queue="", exclusive=True).method.queue
        queues.append(queue_name)
        channel.queue_bind(exchange="logs", queue=queue_name)
        return queue_name

    run_consumers([Consumer(broker, setup, name="r")],
                  lambda: publish_all(broker, "logs", [("", "x")]), {"r": ["x"]})
    # the receiver's connection is closed: its exclusive queue is deleted
    connection = pika.BlockingConnection(params(broker))
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare(queue=queues[0], passive=True)
    assert info.value.reply_code == 404
    connection.close()


# -- 4. Routing ----------------------------------------------------------------------------------

def _receive_logs_direct(broker, name, severities):
    def setup(channel):
        channel.exchange_declare(exchange="direct_logs", exchange_type="direct")
        queue_name = channel.queue_declare(queue="", exclusive=True).method.queue
        for severity in severities:
            channel.queue_bind(exchange="direct_logs", queue=queue_name, routing_key=severity)
        return queue_name

    return Consumer(broker, setup, name=name)


def test_routing(broker):
    def declare(channel):
        channel.exchange_declare(exchange="direct_logs", exchange_type="direct")

    emitted = [("info", "info: Hello World!"), ("warning", "warning: Run. Run. Or it will explode."),
               ("error", "error: Run. Run. Or it will explode."), ("debug", "debug: nobody"),
               ("info", "info: second")]
    run_consumers(
        [_receive_logs_direct(broker, "errors_to_disk", ["error"]),
         _receive_logs_direct(broker, "console", ["info", "warning", "error"])],
        lambda: publish_all(broker, "direct_logs", emitted, declare=declare),
        {"errors_to_disk": ["error: Run. Run. Or it will explode."],
         "console": ["info: Hello World!", "warning: Run. Run. Or it will explode.",
                     "error: Run. Run. Or it will explode.", "info: second"]})


# -- 5. Topics -----------------------------------------------------------------------------------

def _receive_logs_topic(broker, name, binding_keys):
    def setup(channel):
        channel.exchange_declare(exchange="topic_logs", exchange_type="topic")
        queue_name = channel.queue_declare("", exclusive=True).method.queue
        for binding_key in binding_keys:
            channel.queue_bind(exchange="topic_logs", queue=queue_name, routing_key=binding_key)
        return queue_name

    return Consumer(broker, setup, name=name)


# The tutorial's routing keys and who gets them: Q1 is bound with "*.orange.*",
# Q2 with "*.*.rabbit" and "lazy.#".
TOPIC_KEYS = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
              "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.new.rabbit",
              "lazy.orange.new.rabbit", "quick.orange.male.rabbit", "lazy"]
TOPIC_Q1 = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"]
TOPIC_Q2 = ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox",
            "lazy.pink.rabbit",            # matches both of Q2's bindings, delivered once
            "lazy.orange.new.rabbit", "lazy"]


def test_topics(broker):
    def declare(channel):
        channel.exchange_declare(exchange="topic_logs", exchange_type="topic")

    kern = ["kern.critical", "kern.info", "cron.critical", "kern.critical.extra", "kern"]
    run_consumers(
        [_receive_logs_topic(broker, "Q1", ["*.orange.*"]),
         _receive_logs_topic(broker, "Q2", ["*.*.rabbit", "lazy.#"]),
         _receive_logs_topic(broker, "all", ["#"]),
         _receive_logs_topic(broker, "kern_and_critical", ["kern.*", "*.critical"])],
        lambda: publish_all(broker, "topic_logs", [(k, k) for k in TOPIC_KEYS + kern],
                            declare=declare),
        {"Q1": TOPIC_Q1, "Q2": TOPIC_Q2, "all": TOPIC_KEYS + kern,
         "kern_and_critical": ["kern.critical", "kern.info", "cron.critical"]})


# -- 6. RPC --------------------------------------------------------------------------------------

def fib(n):
    if n == 0:
        return 0
    elif n == 1:
        return 1
    else:
        return fib(n - 1) + fib(n - 2)


class FibonacciRpcClient:
    def __init__(self, broker):
        self.connection = pika.BlockingConnection(params(broker))
        self.channel = self.connection.channel()
        result = self.channel.queue_declare(queue="", exclusive=True)
        self.callback_queue = result.method.queue
        self.channel.basic_consume(queue=self.callback_queue, on_message_callback=self.on_response,
                                   auto_ack=True)
        self.response = None
        self.corr_id = None
        self.ignored: list = []

    def on_response(self, ch, method, props, body):
        if self.corr_id == props.correlation_id:
            self.response = body
        else:
            self.ignored.append(props.correlation_id)

    def call(self, n):
        self.response = None
        self.corr_id = str(uuid.uuid4())
        self.channel.basic_publish(exchange="", routing_key="rpc_queue",
                                   properties=pika.BasicProperties(reply_to=self.callback_queue,
                                                                   correlation_id=self.corr_id),
                                   body=str(n))
        deadline = time.monotonic() + WAIT
        while self.response is None:
            assert time.monotonic() < deadline, "no RPC response"
            self.connection.process_data_events(time_limit=0.5)
        return int(self.response)

    def close(self):
        self.connection.close()


def _rpc_server(broker, requests):
    def setup(channel):
        channel.queue_declare(queue="rpc_queue")
        return "rpc_queue"

    def on_request(ch, method, props, body):
        n = int(body)
        requests.append((n, props.reply_to, props.correlation_id))
        response = fib(n)
        ch.basic_publish(exchange="", routing_key=props.reply_to,
                         properties=pika.BasicProperties(correlation_id=props.correlation_id),
                         body=str(response))
        ch.basic_ack(delivery_tag=method.delivery_tag)

    return Consumer(broker, setup, auto_ack=False, prefetch=1, on_message=on_request,
                    name="rpc_server")


def test_rpc(broker):
    requests: list = []
    server = _rpc_server(broker, requests).start()
    try:
        client = FibonacciRpcClient(broker)
        assert client.callback_queue.startswith("amq.gen-")
        results = {n: client.call(n) for n in (0, 1, 2, 10, 20, 25)}
        client.close()
    finally:
        server.stop()
    assert results == {0: 0, 1: 1, 2: 1, 10: 55, 20: 6765, 25: 75025}
    assert [r[0] for r in requests] == [0, 1, 2, 10, 20, 25]
    assert {r[1] for r in requests} == {client.callback_queue}
    assert len({r[2] for r in requests}) == 6
    assert client.ignored == []


def test_rpc_two_clients_share_one_server(broker):
    requests: list = []
    server = _rpc_server(broker, requests).start()
    results: dict = {}
    errors: list = []

    def run_client(name, ns):
        try:
            client = FibonacciRpcClient(broker)
            results[name] = (client.callback_queue, [client.call(n) for n in ns], client.ignored)
            client.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run_client, args=("a", [3, 5, 7, 9])),
               threading.Thread(target=run_client, args=("b", [4, 6, 8, 10]))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 2)
    finally:
        server.stop()
    assert not errors, errors
    assert results["a"][1:] == ([2, 5, 13, 34], [])
    assert results["b"][1:] == ([3, 8, 21, 55], [])
    assert results["a"][0] != results["b"][0]
    by_queue = {}
    for n, reply_to, _ in requests:
        by_queue.setdefault(reply_to, []).append(n)
    assert by_queue == {results["a"][0]: [3, 5, 7, 9], results["b"][0]: [4, 6, 8, 10]}
