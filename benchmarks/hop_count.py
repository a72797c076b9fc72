"""The way one persistent publish with confirms takes through the broker: the project's functions
it calls, in call order, from the publish's bytes arriving to its basic.ack leaving.

A broker (``Application``, SQLite store in a temporary directory) runs in a thread of this process
with a profile hook on its threads (the event loop and the store's writer); pika publishes from
the main thread, unhooked. Between the publish and its confirm the hook records every call into
``exchange_broker/``, ``routing/`` and ``persistence/``. Printed: the calls, the distinct functions
and files, the hops (a call into another file) and the reversals (a call back up the layers:
server -> connection -> protocol/core -> queue_types/routing -> durability/persistence), then the
distinct functions in the order first called.

    python benchmarks/hop_count.py [--list]
    PYTHONPATH=<other checkout> python benchmarks/hop_count.py     # the same on another commit
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = tuple(os.path.join(ROOT, p) + os.sep for p in ("exchange_broker", "routing", "persistence"))
# lower number = higher layer; a call from a lower layer (bigger number) to a higher one is a reversal
LAYERS = {"server": 0, "app.py": 0, "cluster": 0, "management": 0, "connection": 1, "mqtt": 1, "protocol": 2,
          "core": 3, "queue_types": 4, "routing": 4, "durability": 5, "persistence": 6}

calls: list[tuple[int, str, str]] = []
active = False


def hook(frame, event, arg):
    if event == "call" and active:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGES):
            calls.append((threading.get_ident(), os.path.relpath(path, ROOT), frame.f_code.co_name))
    return None


def layer(path: str) -> int:
    parts = path.split(os.sep)
    for part in parts[1:2] + parts[:1]:
        if part in LAYERS:
            return LAYERS[part]
    return 3


def main() -> int:
    global active
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the distinct functions in call order")
    opts = p.parse_args()
    sys.path.insert(0, ROOT)
    from exchange_broker.app import Application
    from exchange_broker.config import Config

    data = tempfile.mkdtemp(prefix="eb-hops-")
    ready = threading.Event()
    holder: dict = {}

    def serve() -> None:
        async def run() -> None:
            extra = {}
            if "scheduler_busy_wait" in Config.__dataclass_fields__:  # the loop polling while it
                extra["scheduler_busy_wait"] = 0  # waits for the commit is not the message's way
            app = Application(Config(port=0, admin_port=0, data_dir=data, host="127.0.0.1", **extra))
            await app.start()
            holder["app"], holder["loop"] = app, asyncio.get_running_loop()
            holder["stop"] = asyncio.Event()
            ready.set()
            await holder["stop"].wait()
            await app.stop()
        asyncio.run(run())

    threading.setprofile(hook)  # the broker's threads (loop and store writer) are hooked
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(60)
    threading.setprofile(None)
    port = holder["app"].server.port
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare("hops", durable=True)
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(20):  # warm: every path taken once before the counted publish
        ch.basic_publish("", "hops", b"warm", props)
    time.sleep(0.5)
    active = True
    ch.basic_publish("", "hops", b"counted", props)  # returns once the broker's basic.ack is in
    active = False
    conn.close()
    holder["loop"].call_soon_threadsafe(holder["stop"].set)
    thread.join(30)
    shutil.rmtree(data, ignore_errors=True)

    by_thread: dict[int, list] = {}
    for ident, path, name in calls:
        by_thread.setdefault(ident, []).append((path, name))
    hops = reversals = 0
    for seq in by_thread.values():
        for (a, _), (b, _) in zip(seq, seq[1:]):
            if a != b:
                hops += 1
                if layer(b) < layer(a):
                    reversals += 1
    functions = list(dict.fromkeys((path, name) for _, path, name in calls))
    files = {path for path, _ in functions}
    print(f"one persistent publish with confirms: {len(calls)} calls, {len(functions)} distinct functions "
          f"in {len(files)} files, {hops} hops between files, {reversals} back up the layers, "
          f"{len(by_thread)} threads")
    if opts.list:
        for path, name in functions:
            print(f"  {path}:{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
