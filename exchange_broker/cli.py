"""`exchange-broker` command line: serve, and later db/admin subcommands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

log = logging.getLogger("exchange_broker")


def _env(name: str, default):
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exchange-broker",
                                description="A RabbitMQ-compatible AMQP 0-9-1 message broker")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the broker")
    s.add_argument("--host", default=_env("EXCHANGE_BROKER_HOST", "0.0.0.0"),
                   help="listen address (env EXCHANGE_BROKER_HOST, default 0.0.0.0)")
    s.add_argument("--port", type=int, default=int(_env("EXCHANGE_BROKER_PORT", 5672)),
                   help="AMQP port (env EXCHANGE_BROKER_PORT, default 5672; 0 picks a free port)")
    s.add_argument("--heartbeat", type=int, default=int(_env("EXCHANGE_BROKER_HEARTBEAT", 60)),
                   help="heartbeat interval offered to clients in seconds (0 disables)")
    s.add_argument("--frame-max", type=int, default=int(_env("EXCHANGE_BROKER_FRAME_MAX", 131072)))
    s.add_argument("--channel-max", type=int, default=int(_env("EXCHANGE_BROKER_CHANNEL_MAX", 2047)))
    s.add_argument("--max-message-size", type=int,
                   default=int(_env("EXCHANGE_BROKER_MAX_MESSAGE_SIZE", 128 * 1024 * 1024)))
    s.add_argument("--log-level", default=_env("EXCHANGE_BROKER_LOG_LEVEL", "INFO"))
    s.add_argument("--port-file", default=None,
                   help="write the bound AMQP port to this file once listening (for tests/scripts)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    return 2


def serve(args) -> int:
    from .app import run
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(run(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
