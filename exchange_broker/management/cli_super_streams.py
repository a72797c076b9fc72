"""`exchange-broker admin super-stream ...`: super streams and their consumer groups through the
admin HTTP API (``management/super_streams.py``)::

    exchange-broker admin super-stream declare orders --partitions 3 --arguments '{"x-max-age": "7D"}'
    exchange-broker admin super-stream list
    exchange-broker admin super-stream show orders        # partitions: offsets, messages
    exchange-broker admin super-stream grow orders 6      # new partitions start empty
    exchange-broker admin super-stream groups orders      # assignment, committed offset, lag
"""

from __future__ import annotations

import json
from urllib.parse import quote

COLUMNS = {
    "list": ("vhost", "name", "partitions", "messages"),
    "show": ("partition", "queue", "first_offset", "next_offset", "messages", "bytes", "consumers"),
    "groups": ("group", "partition", "queue", "owner", "state", "committed_offset", "next_offset",
               "lag", "unacked"),
}


def add_commands(cmds, common) -> None:
    p = cmds.add_parser("super-stream", parents=[common],
                        help="super streams: declare, list, show partitions, grow, consumer groups")
    sub = p.add_subparsers(dest="ss_command", required=True)
    d = sub.add_parser("declare", parents=[common], help="declare a super stream")
    d.add_argument("name")
    d.add_argument("--partitions", "-n", type=int, required=True)
    d.add_argument("--arguments", help='JSON object of retention arguments, e.g. {"x-max-age": "7D"}')
    sub.add_parser("list", parents=[common], help="list super streams")
    s = sub.add_parser("show", parents=[common], help="a super stream's partitions")
    s.add_argument("name")
    g = sub.add_parser("grow", parents=[common], help="raise the partition count (new ones start empty)")
    g.add_argument("name")
    g.add_argument("partitions", type=int)
    c = sub.add_parser("groups", parents=[common], help="consumer groups: assignment, offsets, lag")
    c.add_argument("name")
    c.add_argument("--group", help="just this group")


def run(args, client, emit) -> int:
    """Run one ``super-stream`` command; ``emit(args, data, columns)`` prints it."""
    vh = quote(args.vhost, safe="")
    cmd = args.ss_command
    if cmd == "list":
        emit(args, client.request("GET", f"super-streams/{vh}"), COLUMNS["list"])
        return 0
    path = f"super-streams/{vh}/{quote(args.name, safe='')}"
    if cmd == "declare":
        try:
            extra = json.loads(args.arguments) if args.arguments else {}
        except ValueError as exc:
            raise SystemExit(f"exchange-broker admin: --arguments is not valid JSON: {exc}")
        client.request("PUT", path, {"partitions": args.partitions, "arguments": extra})
        print(f"super stream declared: {args.name} ({args.partitions} partitions)")
    elif cmd == "grow":
        client.request("PUT", path, {"partitions": args.partitions})
        print(f"super stream {args.name}: {args.partitions} partitions")
    elif cmd == "show":
        info = client.request("GET", path)
        if args.format == "json":
            emit(args, info)
        else:
            emit(args, info["partition_details"], COLUMNS["show"])
    else:
        groups = client.request("GET", f"{path}/groups")
        if args.group is not None:
            groups = [g for g in groups if g["group"] == args.group]
        if args.format == "json":
            emit(args, groups)
        else:
            rows = [{"group": g["group"], **p} for g in groups for p in g["partitions"]]
            emit(args, rows, COLUMNS["groups"])
    return 0
