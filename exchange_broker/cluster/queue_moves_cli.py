"""``exchange-broker cluster rebalance | drain NODE | revive NODE`` (RabbitMQ's ``rabbitmq-queues
rebalance all``, ``rabbitmq-upgrade drain`` and ``revive``), on the cluster's PostgreSQL store.

The command asks for the moves (``persistence/queue_moves.py``); each queue's leader hands its
queue over itself. The command then waits (``--wait`` seconds, 0: not at all) until every move
asked for is done and says so."""

from __future__ import annotations

import argparse
import sys
import time

from exchange_broker.config import CLUSTER, add_arguments


def add_parsers(csub) -> None:
    r = csub.add_parser("rebalance", help="spread queue leaders evenly over the live nodes (rabbitmq-queues rebalance)")
    d = csub.add_parser("drain", help="move every queue off a node and place nothing new there until revive "
                                      "(rabbitmq-upgrade drain)")
    d.add_argument("node", help="the node's name (--node-name)")
    v = csub.add_parser("revive", help="let queues be placed on a drained node again (rabbitmq-upgrade revive)")
    v.add_argument("node", help="the node's name (--node-name)")
    for p in (r, d, v):
        add_arguments(p, CLUSTER)
    for p in (r, d):
        p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                       help="wait this long for the queues to move (default 60; 0: do not wait)")


def run(args: argparse.Namespace, store) -> int:
    """``store``: a ClusterStore on the cluster's database (closed by the caller)."""
    from persistence.queue_moves import QueueMoves
    moves = QueueMoves(store)
    what = args.cluster_command
    try:
        if what == "revive":
            moves.revive(args.node)
            print(f"node '{args.node}' may lead queues again (run `exchange-broker cluster rebalance` to give it "
                  f"its share)")
            return 0
        asked = moves.rebalance() if what == "rebalance" else moves.drain(args.node)
    except LookupError as exc:
        print(f"exchange-broker cluster {what}: error: {exc.args[0]}", file=sys.stderr)
        return 1
    for vhost, queue, old, new in asked:
        print(f"queue '{queue}' in vhost '{vhost}': {old} -> {new}")
    if not asked:
        print("no queue to move" if what == "rebalance" else f"node '{args.node}' leads no queue; it is drained")
    deadline = time.monotonic() + args.wait
    while args.wait > 0 and asked:
        left = moves.pending()
        if not left:
            print(f"{len(asked)} queue(s) moved")
            break
        if time.monotonic() > deadline:
            print(f"exchange-broker cluster {what}: error: {left} queue move(s) not done after {args.wait:.0f} s "
                  f"(is every node running?)", file=sys.stderr)
            return 1
        time.sleep(0.1)
    return 0
