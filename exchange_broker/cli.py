"""`exchange-broker` command line: argv -> Config -> app (``serve``, ``db``, ``admin``).

The ``serve`` and ``db`` options are generated from :class:`exchange_broker.config.Config`; this
module only parses arguments and hands the Config to the application.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from exchange_broker.config import DB, SERVE, Config, add_arguments

log = logging.getLogger("exchange_broker")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exchange-broker",
                                description="A RabbitMQ-compatible AMQP 0-9-1 message broker")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the broker",
                       description="Run the broker. Every option also reads the environment variable "
                                   "shown with it (EXCHANGE_BROKER_<OPTION>); the command line wins.")
    add_arguments(s, SERVE)
    db = sub.add_parser("db", help="database schema management (alembic migrations)")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    for name, helptext in (("upgrade", "apply migrations up to a revision (default head)"),
                           ("downgrade", "revert migrations down to a revision"),
                           ("current", "print the schema revision")):
        c = dbsub.add_parser(name, help=helptext)
        add_arguments(c, DB)
        if name != "current":
            c.add_argument("revision", nargs="?", default="head" if name == "upgrade" else None)
    from exchange_broker.management.cli import add_parser as add_admin_parser
    add_admin_parser(sub)
    return p


def db_command(config: Config, args: argparse.Namespace) -> int:
    from exchange_broker.app import database_url
    from persistence import migrate
    url = database_url(config)
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
    if args.command == "admin":
        from exchange_broker.management.cli import run as admin_run
        return admin_run(args)
    try:
        config = Config.from_namespace(args)
    except ValueError as exc:
        print(f"exchange-broker {args.command}: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(config)
    if args.command == "db":
        return db_command(config, args)
    return 2


def serve(config: Config) -> int:
    from exchange_broker.app import Application, StartupError
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(Application(config).serve())
    except KeyboardInterrupt:
        return 0
    except OSError as exc:  # e.g. the port is taken, or the data directory is not writable
        log.error("exchange-broker cannot start: %s", exc.strerror or exc)
        print(f"exchange-broker: cannot start: {exc}", file=sys.stderr)
        return 1
    except (StartupError, ValueError) as exc:  # e.g. the store cannot be opened, a TLS file not loaded
        log.error("exchange-broker cannot start: %s", exc)
        print(f"exchange-broker: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
