"""`exchange-broker` command line: argv -> Config -> app (``serve``, ``db``, ``admin``, ``cluster``).

The ``serve`` and ``db`` options are generated from :class:`exchange_broker.config.Config`; this
module only parses arguments and hands the Config to the application.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from exchange_broker.core.names import logsafe
from exchange_broker.config import DB, SERVE, Config, add_arguments

log = logging.getLogger("exchange_broker")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (its usage text is for --help, not for a mistyped option)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(serve_defaults: dict | None = None) -> argparse.ArgumentParser:
    p = Parser(prog="exchange-broker",
               description="A RabbitMQ-compatible AMQP 0-9-1 message broker")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the broker",
                       description="Run the broker. Every option also reads the environment variable "
                                   "shown with it (EXCHANGE_BROKER_<OPTION>); the command line wins.")
    add_arguments(s, SERVE)
    if serve_defaults:  # from --config FILE: below the flags and the environment variables
        s.set_defaults(**serve_defaults)
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
    from exchange_broker.cluster.status import add_parser as add_cluster_parser
    add_cluster_parser(sub)
    return p


def db_command(config: Config, args: argparse.Namespace) -> int:
    """upgrade / downgrade (holding the store's lock: not under a running broker) / current."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from exchange_broker.app import StartupError, database_url
    from persistence import migrate
    from persistence.lock import StoreInUse, store_lock
    if args.db_command == "downgrade" and not args.revision:
        print("exchange-broker db downgrade: a revision is required (e.g. base)", file=sys.stderr)
        return 2
    lock = None
    try:
        url = database_url(config)
        if args.db_command != "current":
            lock = store_lock(url)
            if lock is not None:
                lock.acquire()
        if args.db_command == "upgrade":
            migrate.upgrade(url, args.revision or "head")
        elif args.db_command == "downgrade":
            migrate.downgrade(url, args.revision)
        print(migrate.current(url) or "base")
    except (StartupError, StoreInUse, SQLAlchemyError, CommandError, OSError) as exc:
        why = " ".join(str(getattr(exc, "orig", None) or exc).split())
        print(f"exchange-broker db {args.db_command}: error: {why}", file=sys.stderr)
        return 1
    finally:
        if lock is not None:
            lock.release()
    return 0


class SafeFormatter(logging.Formatter):
    """Log lines with control characters in the message escaped: a queue, exchange, user or vhost
    name a client sent cannot forge a line (a traceback, added after, keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = logsafe(record.message)
        return super().formatMessage(record)


def configure_logging(level_name: str, command: str) -> None:
    level = getattr(logging, str(level_name).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if level > logging.DEBUG:
        # alembic's INFO lines (plugin set-up; for serve also "Context impl", "Running upgrade ...")
        # are noise at start-up: the store's line says which schema revision is in use
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
        if command == "serve":
            logging.getLogger("alembic").setLevel(logging.WARNING)
        else:  # db upgrade/downgrade: the "Running upgrade ..." lines are what the operator asked for
            logging.getLogger("alembic.runtime.migration").addFilter(
                lambda record: not record.getMessage().startswith(("Context impl", "Will assume")))


def with_config_file(args: argparse.Namespace, argv: list[str] | None) -> tuple[argparse.Namespace, list]:
    """``serve --config FILE``: the arguments parsed again with the file's settings as defaults
    (those whose EXCHANGE_BROKER_* variable is set keep the variable's value), and the file's keys
    that were ignored. ValueError: the file's one-line error."""
    import os

    from exchange_broker.config import env_of
    from exchange_broker.config_file import load
    values, ignored = load(args.config)
    values = {k: v for k, v in values.items() if env_of(k) not in os.environ}
    return build_parser(values).parse_args(argv), ignored


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ignored: list = []
    if getattr(args, "config", None):
        try:
            args, ignored = with_config_file(args, argv)
        except ValueError as exc:
            print(f"exchange-broker {args.command}: error: {exc}", file=sys.stderr)
            return 1
    configure_logging(args.log_level, args.command)
    for key in ignored:
        log.warning("--config %s: '%s' is not a setting of exchange-broker; ignored", args.config, key)
    if args.command == "admin":
        from exchange_broker.management.cli import run as admin_run
        return admin_run(args)
    if args.command == "cluster":
        from exchange_broker.cluster.status import run as cluster_run
        return cluster_run(args)
    try:
        config = Config.from_namespace(args)
    except ValueError as exc:  # a setting out of range, a database URL we cannot use, ...
        print(f"exchange-broker {args.command}: error: {exc}", file=sys.stderr)
        return 1
    if args.command == "serve":
        return serve(config)
    if args.command == "db":
        return db_command(config, args)
    return 2


def serve(config: Config) -> int:
    """Run the broker until SIGTERM/SIGINT; a start-up failure is one line on stderr, exit 1."""
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
    except StartupError as exc:  # the port is taken, the store is in use or cannot be opened, ...
        # printed once (not logged too: the log is this same stderr)
        print(f"exchange-broker: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
