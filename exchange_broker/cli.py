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
    s.add_argument("--max-connections", type=int, default=int(_env("EXCHANGE_BROKER_MAX_CONNECTIONS", 0)),
                   help="open AMQP connections allowed; more are refused with 530 (0: no limit)")
    s.add_argument("--max-channels-per-connection", type=int,
                   default=int(_env("EXCHANGE_BROKER_MAX_CHANNELS_PER_CONNECTION", 0)),
                   help="channels a connection may open (caps the channel_max offered; 0: --channel-max)")
    s.add_argument("--handshake-timeout", type=float,
                   default=float(_env("EXCHANGE_BROKER_HANDSHAKE_TIMEOUT", 10)),
                   help="seconds a socket may take to finish the TLS and AMQP handshakes (default 10)")
    from exchange_broker.server.tls import add_arguments as add_tls_arguments
    add_tls_arguments(s)
    _store_args(s)
    s.add_argument("--in-memory", action="store_true",
                   default=_env("EXCHANGE_BROKER_IN_MEMORY", "") in ("1", "true", "yes"),
                   help="keep nothing on disk (no SQL store)")
    s.add_argument("--queue-window", type=int, default=int(_env("EXCHANGE_BROKER_QUEUE_WINDOW", 20000)),
                   help="messages a durable queue keeps in memory before paging to the store")
    s.add_argument("--memory-high-watermark",
                   default=_env("EXCHANGE_BROKER_MEMORY_HIGH_WATERMARK", "0.4"),
                   help="block publishers above this resident memory: a fraction of RAM (0.4) or a "
                        "size (512MiB); 0 disables")
    s.add_argument("--disk-free-limit", default=_env("EXCHANGE_BROKER_DISK_FREE_LIMIT", "50MB"),
                   help="block publishers when the data directory's disk has less free space; 0 disables")
    s.add_argument("--consumer-timeout", type=int,
                   default=int(_env("EXCHANGE_BROKER_CONSUMER_TIMEOUT", 1800000)),
                   help="ms a delivery may stay unacknowledged before its channel is closed (406); 0 disables")
    s.add_argument("--log-level", default=_env("EXCHANGE_BROKER_LOG_LEVEL", "INFO"))
    s.add_argument("--port-file", default=None,
                   help="write the bound AMQP port to this file once listening (for tests/scripts)")
    s.add_argument("--admin-port", type=int, default=int(_env("EXCHANGE_BROKER_ADMIN_PORT", 15672)),
                   help="admin HTTP API port (env EXCHANGE_BROKER_ADMIN_PORT, default 15672; 0 turns it off)")
    s.add_argument("--admin-host", default=_env("EXCHANGE_BROKER_ADMIN_HOST", None),
                   help="admin HTTP API listen address (env EXCHANGE_BROKER_ADMIN_HOST, default: --host)")
    db = sub.add_parser("db", help="database schema management (alembic migrations)")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    for name, helptext in (("upgrade", "apply migrations up to a revision (default head)"),
                           ("downgrade", "revert migrations down to a revision"),
                           ("current", "print the schema revision")):
        c = dbsub.add_parser(name, help=helptext)
        _store_args(c)
        if name != "current":
            c.add_argument("revision", nargs="?", default="head" if name == "upgrade" else None)
        c.add_argument("--log-level", default=_env("EXCHANGE_BROKER_LOG_LEVEL", "INFO"))
    from exchange_broker.management.cli import add_parser as add_admin_parser
    add_admin_parser(sub)
    return p


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=_env("EXCHANGE_BROKER_DATA_DIR",
                                              os.path.join("~", ".local", "share", "exchange-broker")),
                   help="directory of the embedded SQLite store (env EXCHANGE_BROKER_DATA_DIR)")
    p.add_argument("--database-url", default=_env("EXCHANGE_BROKER_DATABASE_URL", None),
                   help="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db "
                        "(env EXCHANGE_BROKER_DATABASE_URL); overrides --data-dir")
    p.add_argument("--sqlite-synchronous", choices=("FULL", "NORMAL", "OFF"),
                   default=_env("EXCHANGE_BROKER_SQLITE_SYNCHRONOUS", "FULL"),
                   help="SQLite PRAGMA synchronous (default FULL: every commit is fsynced)")


def db_command(args) -> int:
    from persistence import migrate
    from exchange_broker.app import database_url
    url = database_url(args)
    if args.db_command == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.db_command == "downgrade":
        if not args.revision:
            print("exchange-broker db downgrade: a revision is required (e.g. base)", file=sys.stderr)
            return 2
        migrate.downgrade(url, args.revision)
    print(migrate.current(url) or "base")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    if args.command == "db":
        return db_command(args)
    if args.command == "admin":
        from exchange_broker.management.cli import run as admin_run
        return admin_run(args)
    return 2


def serve(args) -> int:
    from exchange_broker.app import run
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(run(args))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:  # e.g. the port is taken, or the data directory is not writable
        log.error("exchange-broker cannot start: %s", exc.strerror or exc)
        print(f"exchange-broker: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
