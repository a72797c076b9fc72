"""RabbitMQ's tutorial patterns and a Celery round trip with quorum queues, written as one writes
them for RabbitMQ (named durable quorum queues: a quorum queue cannot be exclusive or server-named).
"""

from __future__ import annotations

import threading
import time
import uuid

import pika
import pytest

from eb_support import pika_connect, uniq

Q = {"x-queue-type": "quorum"}
WAIT = 10.0


class Worker(threading.Thread):
    """A receive program: its own connection, basic_consume, start_consuming until stopped."""

    def __init__(self, port, queue, *, prefetch=None, auto_ack=False, handle=None, setup=None):
        super().__init__(daemon=True)
        self.port, self.queue, self.prefetch, self.auto_ack = port, queue, prefetch, auto_ack
        self.handle = handle or (lambda ch, method, props, body: None)
        self.setup = setup
        self.got: list[bytes] = []
        self.ready = threading.Event()
        self.conn = None
        self.error = None

    def run(self):
        try:
            self.conn = pika_connect(self.port)
            ch = self.conn.channel()
            if self.setup:
                self.setup(ch)
            if self.prefetch:
                ch.basic_qos(prefetch_count=self.prefetch)

            def cb(ch, method, props, body):
                self.got.append(body)
                self.handle(ch, method, props, body)
                if not self.auto_ack:
                    ch.basic_ack(method.delivery_tag)
            ch.basic_consume(self.queue, cb, auto_ack=self.auto_ack)
            self.ready.set()
            ch.start_consuming()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
            self.ready.set()

    def stop(self):
        if self.conn is not None and self.conn.is_open:
            self.conn.add_callback_threadsafe(self.conn.close)
        self.join(WAIT)
        assert not self.is_alive()
        closed = (pika.exceptions.ConnectionWrongStateError, pika.exceptions.StreamLostError,
                  pika.exceptions.ConnectionClosedByClient)
        if self.error is not None and not isinstance(self.error, closed):
            raise self.error


def wait_for(pred, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_hello_world_and_work_queues(broker):
    conn = pika_connect(broker.port)
    ch = conn.channel()
    ch.queue_declare("task_queue_q", durable=True, arguments=Q)
    workers = [Worker(broker.port, "task_queue_q", prefetch=1) for _ in range(2)]
    for w in workers:
        w.start()
        assert w.ready.wait(WAIT)
    for i in range(20):
        ch.basic_publish("", "task_queue_q", f"task {i}".encode(),
                         pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
    assert wait_for(lambda: sum(len(w.got) for w in workers) == 20)
    assert sorted(b for w in workers for b in w.got) == sorted(f"task {i}".encode() for i in range(20))
    assert all(w.got for w in workers)  # fair dispatch shared the work
    for w in workers:
        w.stop()
    conn.close()


def test_a_worker_that_dies_unacked_has_its_task_redelivered(broker):
    conn = pika_connect(broker.port)
    ch = conn.channel()
    queue = uniq("tasks")
    ch.queue_declare(queue, durable=True, arguments=Q)
    ch.basic_publish("", queue, b"important", pika.BasicProperties(delivery_mode=2))
    dying = pika_connect(broker.port)
    dch = dying.channel()
    dch.basic_qos(prefetch_count=1)
    method, _props, body = None, None, None
    for method, _props, body in dch.consume(queue, inactivity_timeout=WAIT):
        break
    assert body == b"important"
    dying.close()  # no ack: it goes back, redelivered, counted
    worker = Worker(broker.port, queue, prefetch=1)
    seen = []
    worker.handle = lambda ch, m, props, body: seen.append((m.redelivered, (props.headers or {}).get("x-delivery-count")))
    worker.start()
    assert wait_for(lambda: worker.got == [b"important"])
    assert seen == [(True, 1)]
    worker.stop()
    conn.close()


def test_routing_and_topics_with_named_quorum_queues(broker):
    conn = pika_connect(broker.port)
    ch = conn.channel()
    ch.exchange_declare("direct_logs_q", "direct")
    ch.exchange_declare("topic_logs_q", "topic")
    bindings = {"errors_q": ("direct_logs_q", ["error"]), "all_q": ("direct_logs_q", ["info", "error"]),
                "orange_q": ("topic_logs_q", ["*.orange.*"]), "lazy_q": ("topic_logs_q", ["*.*.rabbit", "lazy.#"])}
    for queue, (exchange, keys) in bindings.items():
        ch.queue_declare(queue, durable=True, arguments=Q)
        for key in keys:
            ch.queue_bind(queue, exchange, key)
    for severity in ("info", "error", "warning"):
        ch.basic_publish("direct_logs_q", severity, severity.encode())
    for key in ("quick.orange.rabbit", "lazy.orange.elephant", "quick.brown.fox", "lazy.pink.rabbit"):
        ch.basic_publish("topic_logs_q", key, key.encode())

    def drain(queue):
        out = []
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(body.decode())
    assert wait_for(lambda: ch.queue_declare("lazy_q", passive=True).method.message_count == 3)
    assert drain("errors_q") == ["error"]
    assert drain("all_q") == ["info", "error"]
    assert drain("orange_q") == ["quick.orange.rabbit", "lazy.orange.elephant"]
    assert drain("lazy_q") == ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.pink.rabbit"]
    conn.close()


def test_rpc_server_on_a_quorum_queue(broker):
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def respond(ch, method, props, body):
        ch.basic_publish("", props.reply_to, str(fib(int(body))).encode(),
                         pika.BasicProperties(correlation_id=props.correlation_id))

    server = Worker(broker.port, "rpc_queue_q", prefetch=1, handle=respond,
                    setup=lambda ch: ch.queue_declare("rpc_queue_q", durable=True, arguments=Q))
    server.start()
    assert server.ready.wait(WAIT)
    conn = pika_connect(broker.port)
    ch = conn.channel()
    callback = ch.queue_declare("", exclusive=True).method.queue
    answers = {}
    ch.basic_consume(callback, lambda c, m, p, b: answers.__setitem__(p.correlation_id, b), auto_ack=True)
    for n in (1, 10, 20):
        corr = str(uuid.uuid4())
        ch.basic_publish("", "rpc_queue_q", str(n).encode(),
                         pika.BasicProperties(reply_to=callback, correlation_id=corr))
        deadline = time.monotonic() + WAIT
        while corr not in answers and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        assert answers[corr] == str(fib(n)).encode()
    conn.close()
    server.stop()


def test_celery_round_trip_on_quorum_queues(tmp_path):
    celery = pytest.importorskip("celery")
    from celery.contrib.testing.worker import start_worker
    from kombu import Queue

    from exchange_broker.testing import ThreadedBroker

    with ThreadedBroker() as tb:
        app = celery.Celery("eb_quorum", broker=f"pyamqp://guest:guest@127.0.0.1:{tb.port}//",
                            backend="rpc://")
        queue = f"eb-quorum-{uuid.uuid4().hex[:8]}"
        app.conf.update(broker_heartbeat=0, broker_connection_retry_on_startup=True,
                        worker_hijack_root_logger=False, task_default_queue=queue,
                        task_queues=[Queue(queue, queue_arguments={"x-queue-type": "quorum"})],
                        worker_detect_quorum_queues=True, result_expires=None)

        @app.task(name="eb.mul")
        def mul(x, y):
            return x * y

        with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                          shutdown_timeout=20):
            results = [mul.delay(i, 3) for i in range(5)]
            assert [r.get(timeout=20) for r in results] == [0, 3, 6, 9, 12]
        info = tb.call(lambda: tb.broker.vhosts["/"].queues[queue].queue_type)
        assert info == "quorum"
