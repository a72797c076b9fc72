"""``exchange-broker cluster status``: the nodes of the cluster on a PostgreSQL store, read from
the store itself (works whether or not any node is running)."""

from __future__ import annotations

import argparse
import json
import sys

from exchange_broker.config import CLUSTER, Config, add_arguments

COLUMNS = ("node", "state", "role", "amqp", "admin", "last heartbeat", "definitions", "queues led")


def add_parser(sub) -> None:
    c = sub.add_parser("cluster", help="the cluster of nodes on one PostgreSQL store")
    csub = c.add_subparsers(dest="cluster_command", required=True)
    s = csub.add_parser("status", help="list the nodes, which are alive, and the queues each leads")
    add_arguments(s, CLUSTER)
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from exchange_broker.cluster.queue_moves_cli import add_parsers
    add_parsers(csub)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import ProgrammingError, SQLAlchemyError

    from persistence.cluster_store import ClusterStore
    try:
        config = Config.from_namespace(args)
        if not (config.database_url or "").startswith("postgresql"):
            raise ValueError("needs the cluster's PostgreSQL --database-url")
        store = ClusterStore(config.database_url)
    except ValueError as exc:
        print(f"exchange-broker cluster {args.cluster_command}: error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.cluster_command != "status":
            from exchange_broker.cluster.queue_moves_cli import run as run_moves
            return run_moves(args, store)
        nodes = store.nodes()
    except SQLAlchemyError as exc:
        if isinstance(exc, ProgrammingError) and args.cluster_command == "status":
            nodes = []  # no cluster tables yet: no node ever ran on this store (or it is not migrated)
        else:
            return _failed(args.cluster_command, exc)
    finally:
        store.close()
    if args.json:
        print(json.dumps(nodes, indent=2))
    else:
        print(format_table(nodes))
    return 0


def _failed(command: str, exc: Exception) -> int:
    why = " ".join(str(getattr(exc, "orig", None) or exc).split())
    print(f"exchange-broker cluster {command}: error: {why}", file=sys.stderr)
    return 1


def queue_label(q: dict) -> str:
    """``name`` in the default vhost, else ``name (vhost v)``."""
    return q["name"] if q["vhost"] == "/" else f"{q['name']} (vhost {q['vhost']})"


def format_table(nodes: list[dict]) -> str:
    """One line per node, columns aligned."""
    if not nodes:
        return "no nodes"
    rows = [COLUMNS]
    for n in nodes:
        queues = ", ".join(queue_label(q) for q in n["queues"]) or "-"
        rows.append((n["name"], "alive" if n["alive"] else "dead", n["role"], n["amqp_address"] or "-",
                     n["admin_address"] or "-", f"{n['seconds_since_heartbeat']:.1f} s ago",
                     f"v{n.get('definitions_version', 0)}", queues))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) + "  " + str(r[-1])
                     for r in rows)
