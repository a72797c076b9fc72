"""`exchange-broker admin shovel ...`: dynamic shovels through the admin HTTP API
(``/api/parameters/shovel``, ``/api/shovels``)::

    exchange-broker admin shovel declare orders-out --src-uri amqp:// --src-queue orders \\
        --dest-uri amqp://user:secret@other-host --dest-queue orders
    exchange-broker admin shovel list            # state, reason, messages moved
    exchange-broker admin shovel restart orders-out
    exchange-broker admin shovel delete orders-out
"""

from __future__ import annotations

import json
from urllib.parse import quote

COLUMNS = ("vhost", "name", "state", "src_uri", "dest_uri", "forwarded", "pending", "reason")
KEYS = ("src-queue", "src-exchange", "src-exchange-key", "dest-queue", "dest-exchange", "dest-exchange-key",
        "ack-mode")
NUMBERS = ("prefetch-count", "reconnect-delay")


def add_commands(cmds, common) -> None:
    p = cmds.add_parser("shovel", parents=[common], help="dynamic shovels: declare, list, delete, restart")
    sub = p.add_subparsers(dest="shovel_command", required=True)
    d = sub.add_parser("declare", parents=[common], help="declare (or replace) a dynamic shovel")
    d.add_argument("name")
    d.add_argument("--src-uri", action="append", required=True, help="repeat for several, tried in turn")
    d.add_argument("--dest-uri", action="append", required=True, help="repeat for several, tried in turn")
    for key in KEYS:
        d.add_argument("--" + key, choices=("on-confirm", "on-publish", "no-ack") if key == "ack-mode" else None)
    for key in NUMBERS:
        d.add_argument("--" + key, type=float)
    d.add_argument("--src-delete-after", help='"never", "queue-length" or a number of messages')
    d.add_argument("--dest-add-forward-headers", action="store_true")
    d.add_argument("--dest-publish-properties", help='JSON object, e.g. {"delivery_mode": 2}')
    sub.add_parser("list", parents=[common], help="shovels and their state")
    for verb, text in (("delete", "delete a shovel (it stops)"), ("restart", "restart a shovel")):
        sub.add_parser(verb, parents=[common], help=text).add_argument("name")


def shovel_value(args) -> dict:
    """The parameter value the ``declare`` options describe."""
    value: dict = {"src-uri": args.src_uri if len(args.src_uri) > 1 else args.src_uri[0],
                   "dest-uri": args.dest_uri if len(args.dest_uri) > 1 else args.dest_uri[0]}
    for key in KEYS:
        if getattr(args, key.replace("-", "_")) is not None:
            value[key] = getattr(args, key.replace("-", "_"))
    for key in NUMBERS:
        number = getattr(args, key.replace("-", "_"))
        if number is not None:
            value[key] = int(number) if number == int(number) else number
    after = args.src_delete_after
    if after is not None:
        value["src-delete-after"] = int(after) if after.isdigit() else after
    if args.dest_add_forward_headers:
        value["dest-add-forward-headers"] = True
    if args.dest_publish_properties is not None:
        try:
            value["dest-publish-properties"] = json.loads(args.dest_publish_properties)
        except ValueError as exc:
            raise SystemExit(f"exchange-broker admin: --dest-publish-properties is not valid JSON: {exc}")
    return value


def run(args, client, emit) -> int:
    """Run one ``shovel`` command; ``emit(args, data, columns)`` prints it."""
    vh = quote(args.vhost, safe="")
    cmd = args.shovel_command
    if cmd == "list":
        emit(args, client.request("GET", f"shovels/{vh}"), COLUMNS)
    elif cmd == "declare":
        client.request("PUT", f"parameters/shovel/{vh}/{quote(args.name, safe='')}", {"value": shovel_value(args)})
        print(f"shovel declared: {args.name}")
    elif cmd == "delete":
        client.request("DELETE", f"parameters/shovel/{vh}/{quote(args.name, safe='')}")
        print(f"shovel deleted: {args.name}")
    else:
        client.request("DELETE", f"shovels/vhost/{vh}/{quote(args.name, safe='')}/restart")
        print(f"shovel restarted: {args.name}")
    return 0
