"""Assemble a broker from command-line options and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from exchange_broker.core.broker import Broker
from exchange_broker.server.listener import BrokerServer, install_signal_handlers

log = logging.getLogger("exchange_broker")


def limits_from(args) -> dict:
    channel_max = args.channel_max
    per_conn = getattr(args, "max_channels_per_connection", 0)  # caps the channel_max offered
    if per_conn and (not channel_max or per_conn < channel_max):
        channel_max = per_conn
    return {"heartbeat": args.heartbeat, "frame_max": args.frame_max, "channel_max": channel_max,
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
        from exchange_broker.durability.recovery import restore
        from exchange_broker.durability.sql import SqlDurability
        store = await loop.run_in_executor(None, open_store, args)
        durability = SqlDurability(store, loop, window=args.queue_window)
        # recovery may expire and dead-letter messages whose TTL passed while the broker was down:
        # that outcome must be stored, and TTL / x-expires timers armed on this loop
        broker.durability = durability
        broker._call_later = loop.call_later
        restore(broker, durability, args.queue_window)
        durability.start()
        if broker.delayed is not None:  # pending delayed messages: ids, first window, overdue ones
            broker.delayed.attach(durability)
            await broker.delayed.recover()
    return broker, durability


def configure(broker: Broker, server: BrokerServer, args) -> None:
    """Resource alarms and timeouts from the command line."""
    from exchange_broker.server.resources import ResourceMonitor, parse_size, total_memory
    broker.consumer_timeout_ms = args.consumer_timeout
    memory = parse_size(args.memory_high_watermark, relative_to=total_memory())
    disk = parse_size(args.disk_free_limit)
    data_dir = None if getattr(args, "in_memory", False) or getattr(args, "database_url", None) \
        else os.path.abspath(os.path.expanduser(args.data_dir))
    server.monitor = ResourceMonitor(broker, memory, data_dir, disk)


async def start_admin(args, broker: Broker, server: BrokerServer):
    """The admin HTTP API in this loop (``--admin-port 0`` turns it off). A port that cannot be
    bound is logged and the broker runs on without the API."""
    port = getattr(args, "admin_port", 0)
    if not port:
        return None
    from exchange_broker.management.server import AdminServer
    host = getattr(args, "admin_host", None) or args.host
    tls = getattr(server, "tls", None)  # HTTPS with the amqps certificate (tls.py)
    ssl_options = tls.uvicorn_options() if tls is not None and not getattr(args, "no_admin_tls", False) \
        else None
    admin = AdminServer(broker, host, port, amqp_server=server, ssl_options=ssl_options)
    try:
        await admin.start()
    except OSError as exc:
        log.error("admin API not started: cannot listen on %s:%d: %s", host, port, exc)
        return None
    return admin


async def run(args) -> int:
    # The group-commit writer thread needs the GIL back quickly after each database call; with the
    # default 5 ms switch interval a busy event loop delays every commit by up to 5 ms per hand-off.
    sys.setswitchinterval(0.001)
    loop = asyncio.get_running_loop()
    broker, durability = await build(args, loop)
    import gc
    gc.collect()
    gc.freeze()  # start-up objects are never scanned again: full GC pauses drop from ~250 to ~60 ms
    from exchange_broker.server.listener import HANDSHAKE_TIMEOUT
    from exchange_broker.server.tls import from_args as tls_from_args
    server = BrokerServer(broker, args.host, args.port, limits=limits_from(args),
                          handshake_timeout=getattr(args, "handshake_timeout", HANDSHAKE_TIMEOUT),
                          tls=tls_from_args(args))
    broker.max_connections = getattr(args, "max_connections", 0) or 0
    configure(broker, server, args)
    await server.start()
    admin = await start_admin(args, broker, server)
    if args.port_file:
        with open(args.port_file, "w") as fh:
            fh.write(str(server.port))
    stop = asyncio.Event()
    install_signal_handlers(stop)
    log.info("exchange-broker ready on %s:%d", args.host, server.port)
    await stop.wait()
    log.info("shutting down")
    if admin is not None:
        await admin.stop()
    await server.stop()
    if durability is not None:
        if broker.delayed is not None:
            broker.delayed.close()  # its last row deletes go to the writer before it stops
        await loop.run_in_executor(None, durability.stop)
        durability.store.close()
    return 0
