"""Celery on this broker: an embedded worker (solo pool, in a thread) on pyamqp://, results through
the rpc:// backend, side effects through a file and a queue.Queue.

Needs the `celery` package (test extra)."""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

celery = pytest.importorskip("celery")
from celery.contrib.testing.worker import start_worker  # noqa: E402

from exchange_broker.testing import ThreadedBroker  # noqa: E402

EVENTS: "queue.Queue[tuple]" = queue.Queue()  # (name, payload, monotonic time) from the worker thread


@pytest.fixture(scope="module")
def celery_env(tmp_path_factory):
    with ThreadedBroker() as tb:
        app = celery.Celery("eb_test", broker=f"pyamqp://guest:guest@127.0.0.1:{tb.port}//",
                            backend="rpc://")
        app.conf.update(broker_heartbeat=0, broker_connection_retry_on_startup=True,
                        worker_hijack_root_logger=False, task_default_queue=f"eb-celery-{id(app)}",
                        result_expires=None)
        attempts_file = tmp_path_factory.mktemp("celery") / "attempts"
        attempts_file.write_text("")

        @app.task(name="eb.add")
        def add(x, y):
            EVENTS.put(("add", (x, y), time.monotonic()))
            return x + y

        @app.task(name="eb.flaky", bind=True, autoretry_for=(ConnectionError,),
                  retry_kwargs={"max_retries": 3, "countdown": 0})
        def flaky(self, key):
            with open(attempts_file, "a") as fh:
                fh.write(f"{key}:{self.request.retries}\n")
            if self.request.retries == 0:
                raise ConnectionError("first try fails")
            return f"{key} ok after {self.request.retries} retry"

        @app.task(name="eb.manual_retry", bind=True, max_retries=2)
        def manual_retry(self, key):
            with open(attempts_file, "a") as fh:
                fh.write(f"{key}:{self.request.retries}\n")
            if self.request.retries == 0:
                raise self.retry(countdown=0, exc=RuntimeError("again"))
            return self.request.retries

        @app.task(name="eb.stamp")
        def stamp(tag):
            EVENTS.put(("stamp", tag, time.monotonic()))
            return tag

        with start_worker(app, pool="solo", concurrency=1, perform_ping_check=False,
                          shutdown_timeout=20):
            yield app, {"add": add, "flaky": flaky, "manual_retry": manual_retry, "stamp": stamp}, \
                attempts_file


def _attempts(path: Path, key: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(f"{key}:")]


def _event(name: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = EVENTS.get(timeout=0.1)
        except queue.Empty:
            continue
        if ev[0] == name:
            return ev
    raise AssertionError(f"no {name} event")


def test_task_round_trip(celery_env):
    _app, tasks, _f = celery_env
    result = tasks["add"].delay(2, 3)
    assert result.get(timeout=15) == 5
    assert _event("add")[1] == (2, 3)
    results = [tasks["add"].delay(i, i) for i in range(10)]
    assert [r.get(timeout=15) for r in results] == [2 * i for i in range(10)]


def test_autoretry_succeeds_on_the_second_try(celery_env):
    _app, tasks, attempts = celery_env
    assert tasks["flaky"].delay("auto").get(timeout=20) == "auto ok after 1 retry"
    assert _attempts(attempts, "auto") == ["auto:0", "auto:1"]


def test_self_retry_succeeds_on_the_second_try(celery_env):
    _app, tasks, attempts = celery_env
    assert tasks["manual_retry"].delay("manual").get(timeout=20) == 1
    assert _attempts(attempts, "manual") == ["manual:0", "manual:1"]


def test_apply_async_countdown(celery_env):
    _app, tasks, _f = celery_env
    sent = time.monotonic()
    result = tasks["stamp"].apply_async(("later",), countdown=1)
    assert result.get(timeout=20) == "later"
    _name, tag, ran_at = _event("stamp")
    assert tag == "later"
    assert ran_at - sent >= 0.9  # held by the worker until its ETA, then run
