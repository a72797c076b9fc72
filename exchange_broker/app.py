"""Assemble a broker from command-line options and run it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging

from .broker import Broker
from .server import BrokerServer, install_signal_handlers

log = logging.getLogger("exchange_broker")


def limits_from(args) -> dict:
    return {"heartbeat": args.heartbeat, "frame_max": args.frame_max, "channel_max": args.channel_max,
            "max_message_size": args.max_message_size}


async def run(args) -> int:
    broker = Broker()
    server = BrokerServer(broker, args.host, args.port, limits=limits_from(args))
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
    return 0
