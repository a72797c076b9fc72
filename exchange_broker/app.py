"""Assemble a broker from command-line options and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os

from .broker import Broker
from .server import BrokerServer, install_signal_handlers

log = logging.getLogger("exchange_broker")


def limits_from(args) -> dict:
    return {"heartbeat": args.heartbeat, "frame_max": args.frame_max, "channel_max": args.channel_max,
            "max_message_size": args.max_message_size}


def database_url(args) -> str:
    if getattr(args, "database_url", None):
        return args.database_url
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir))
    os.makedirs(data_dir, exist_ok=True)
    return f"sqlite:///{os.path.join(data_dir, 'broker.db')}"


def open_store(args):
    from persistence.sql_store import SqlStore
    url = database_url(args)
    store = SqlStore(url, sqlite_synchronous=args.sqlite_synchronous)
    store.open()  # applies alembic migrations
    log.info("store: %s", store.engine.url.render_as_string(hide_password=True))
    return store


async def build(args, loop) -> tuple[Broker, object]:
    broker = Broker()
    durability = None
    if not getattr(args, "in_memory", False):
        from .recovery import restore
        from .sql_durability import SqlDurability
        store = await loop.run_in_executor(None, open_store, args)
        durability = SqlDurability(store, loop, window=args.queue_window)
        restore(broker, durability, args.queue_window)
        broker.durability = durability
        durability.start()
        if broker.delayed is not None:  # pending delayed messages: ids, first window, overdue ones
            broker.delayed.attach(durability)
            await broker.delayed.recover()
    return broker, durability


def configure(broker: Broker, server: BrokerServer, args) -> None:
    """Resource alarms and timeouts from the command line."""
    from .resources import ResourceMonitor, parse_size, total_memory
    broker.consumer_timeout_ms = args.consumer_timeout
    memory = parse_size(args.memory_high_watermark, relative_to=total_memory())
    disk = parse_size(args.disk_free_limit)
    data_dir = None if getattr(args, "in_memory", False) or getattr(args, "database_url", None) \
        else os.path.abspath(os.path.expanduser(args.data_dir))
    server.monitor = ResourceMonitor(broker, memory, data_dir, disk)


async def run(args) -> int:
    loop = asyncio.get_running_loop()
    broker, durability = await build(args, loop)
    server = BrokerServer(broker, args.host, args.port, limits=limits_from(args))
    configure(broker, server, args)
    await server.start()
    if args.port_file:
        with open(args.port_file, "w") as fh:
            fh.write(str(server.port))
    stop = asyncio.Event()
    install_signal_handlers(stop)
    log.info("exchange-broker ready on %s:%d", args.host, server.port)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
    if durability is not None:
        await loop.run_in_executor(None, durability.stop)
        durability.store.close()
    return 0
