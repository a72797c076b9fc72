"""`exchange-broker admin vhost ...` and `exchange-broker admin trace ...` through the admin HTTP
API (``PUT /api/vhosts/{name}``, as rabbitmqadmin and rabbitmqctl do it)::

    exchange-broker admin vhost declare orders --default-queue-type quorum
    exchange-broker admin vhost delete orders
    exchange-broker admin trace on --vhost orders     # the firehose: amq.rabbitmq.trace
    exchange-broker admin trace off --vhost orders
"""

from __future__ import annotations

from urllib.parse import quote


def add_commands(cmds, common) -> None:
    p = cmds.add_parser("vhost", parents=[common], help="declare or delete a virtual host")
    sub = p.add_subparsers(dest="vhost_command", required=True)
    d = sub.add_parser("declare", parents=[common], help="declare (or update) a virtual host")
    d.add_argument("name")
    d.add_argument("--default-queue-type", help="x-queue-type of queues declared without one "
                                                "(classic, quorum, stream)")
    x = sub.add_parser("delete", parents=[common], help="delete a virtual host and everything in it")
    x.add_argument("name")
    t = cmds.add_parser("trace", parents=[common],
                        help="message tracing (the firehose, amq.rabbitmq.trace) on or off in --vhost")
    t.add_argument("state", choices=("on", "off"))


def run(args, client) -> int:
    """Run one ``vhost`` or ``trace`` command."""
    if args.admin_command == "trace":
        on = args.state == "on"
        client.request("PUT", f"vhosts/{quote(args.vhost, safe='')}", {"tracing": on})
        print(f"tracing {'on' if on else 'off'} in vhost {args.vhost}")
        return 0
    path = f"vhosts/{quote(args.name, safe='')}"
    if args.vhost_command == "declare":
        body = {"default_queue_type": args.default_queue_type} if args.default_queue_type else {}
        client.request("PUT", path, body)
        print(f"vhost declared: {args.name}")
    else:
        client.request("DELETE", path)
        print(f"vhost deleted: {args.name}")
    return 0
