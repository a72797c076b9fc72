"""`exchange-broker admin ...`: a command-line client of the admin HTTP API (like rabbitmqadmin).

It speaks only HTTP (urllib, no broker imports), so it works against this broker or
RabbitMQ alike. Examples::

    exchange-broker admin list queues
    exchange-broker admin declare queue orders --durable
    exchange-broker admin declare binding --source amq.topic --destination orders --routing-key 'o.*'
    exchange-broker admin publish --exchange amq.default --routing-key orders --payload hello
    exchange-broker admin get orders --count 5 --ackmode ack_requeue_false
    exchange-broker admin export defs.json && exchange-broker admin import defs.json
    exchange-broker admin set policy ttl '^orders' '{"message-ttl": 60000}' --apply-to queues --priority 1
    exchange-broker admin list policies && exchange-broker admin delete policy ttl
    exchange-broker admin super-stream show orders   # also: declare, list, grow, groups
    exchange-broker admin shovel list                # also: declare, delete, restart
    exchange-broker admin vhost declare orders --default-queue-type quorum
    exchange-broker admin trace on --vhost orders    # the firehose (amq.rabbitmq.trace)

Connection options (also after the command): --url (env EXCHANGE_BROKER_ADMIN_URL, default
http://127.0.0.1:15672), --user/--password (env EXCHANGE_BROKER_ADMIN_USER/_PASSWORD, default
guest/guest), --vhost (default /), --format table|json.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

from exchange_broker.management import cli_shovels, cli_super_streams, cli_vhosts

LIST_COLUMNS = {
    "queues": ("vhost", "name", "durable", "auto_delete", "exclusive", "messages", "messages_ready",
               "messages_unacknowledged", "consumers"),
    "exchanges": ("vhost", "name", "type", "durable", "auto_delete", "internal"),
    "bindings": ("vhost", "source", "destination", "destination_type", "routing_key", "properties_key"),
    "connections": ("name", "user", "vhost", "channels", "state", "user_provided_name"),
    "channels": ("name", "user", "vhost", "consumer_count", "messages_unacknowledged", "prefetch_count"),
    "consumers": ("queue.vhost", "queue.name", "consumer_tag", "ack_required", "prefetch_count",
                  "channel_details.name"),
    "vhosts": ("name", "default_queue_type", "messages", "messages_ready", "messages_unacknowledged"),
    "users": ("name", "tags"),
    "policies": ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
    "operator-policies": ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
}
VHOST_SCOPED = ("queues", "exchanges", "bindings", "consumers", "policies", "operator-policies")
POLICY_KINDS = {"policy": "policies", "operator-policy": "operator-policies"}  # command word -> API path
APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        if isinstance(body, dict) and "error" in body:
            reason = body.get("reason")
            if isinstance(reason, str):  # one line (policy errors are several, HTML-escaped)
                reason = "; ".join(ln.strip() for ln in html.unescape(reason).splitlines() if ln.strip())
            text = f"{body.get('error')}: {reason}"
        else:
            text = str(body)
        super().__init__(f"HTTP {status} - {text}")


class AdminClient:
    """A tiny management-API client over urllib."""

    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.base = url.rstrip("/")
        token = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
        self.auth = f"Basic {token}"
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None, params: dict | None = None,
                headers: dict | None = None) -> Any:
        url = f"{self.base}/api/{path}"
        if params:
            url += "?" + urlencode(params)
        data = None
        hdrs = {"Authorization": self.auth, "Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode("utf-8", "replace")
            raise ApiError(exc.code, parsed) from None
        if not raw:
            return None
        return json.loads(raw)


def q(name: str) -> str:
    return quote(name, safe="")


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"exchange-broker admin: {what} is not valid JSON: {exc}")


def _get_path(item: dict, path: str) -> Any:
    cur: Any = item
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def print_table(rows: list[dict], columns: tuple[str, ...], out=None) -> None:
    out = out or sys.stdout
    table = [[_cell(_get_path(r, c)) for c in columns] for r in rows]
    for row, r in zip(table, rows):
        for i, c in enumerate(columns):
            if row[i] == "" and ((c == "name" and "internal" in r) or c == "source"):
                row[i] = "(AMQP default)"
    widths = [max([len(c)] + [len(row[i]) for row in table]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip(), file=out)
    for row in table:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip(), file=out)


def emit(args, data: Any, columns: tuple[str, ...] | None = None) -> None:
    if args.format == "json" or columns is None:
        print(json.dumps(data, indent=2, sort_keys=False))
    else:
        print_table(data, columns)


# ---- the parser ---------------------------------------------------------------------------------
def _connection_options(p: argparse.ArgumentParser, top: bool) -> None:
    def d(value):
        return value if top else argparse.SUPPRESS
    env = os.environ.get
    default_url = env("EXCHANGE_BROKER_ADMIN_URL") or \
        f"http://127.0.0.1:{env('EXCHANGE_BROKER_ADMIN_PORT', '15672')}"
    p.add_argument("--url", default=d(default_url),
                   help="admin API base URL (env EXCHANGE_BROKER_ADMIN_URL, default http://127.0.0.1:15672)")
    p.add_argument("--user", "-u", default=d(env("EXCHANGE_BROKER_ADMIN_USER", "guest")))
    p.add_argument("--password", "-p", default=d(env("EXCHANGE_BROKER_ADMIN_PASSWORD", "guest")))
    p.add_argument("--vhost", "-V", default=d("/"), help="virtual host (default /)")
    p.add_argument("--format", "-f", choices=("table", "json"), default=d("table"))
    p.add_argument("--timeout", type=float, default=d(30.0))
    p.add_argument("--log-level", default=d("WARNING"), help=argparse.SUPPRESS)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``admin`` command to the main CLI's subparsers."""
    admin = sub.add_parser("admin", help="manage a running broker through its admin HTTP API",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _build(admin)
    return admin


def _build(admin: argparse.ArgumentParser) -> None:
    _connection_options(admin, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, top=False)
    cmds = admin.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    p = cmds.add_parser("overview", parents=[common], help="broker overview")
    p = cmds.add_parser("list", parents=[common], help="list objects")
    p.add_argument("what", choices=sorted(LIST_COLUMNS))
    p.add_argument("--all-vhosts", "-A", action="store_true", help="every vhost, not just --vhost")
    p.add_argument("--columns", help="comma-separated fields to show (table format)")

    p = cmds.add_parser("declare", parents=[common], help="declare a queue, exchange or binding")
    dsub = p.add_subparsers(dest="kind", required=True)
    dq = dsub.add_parser("queue", parents=[common])
    dq.add_argument("name")
    dq.add_argument("--durable", action="store_true")
    dq.add_argument("--auto-delete", action="store_true")
    dq.add_argument("--arguments", help="JSON object of queue arguments")
    dx = dsub.add_parser("exchange", parents=[common])
    dx.add_argument("name")
    dx.add_argument("--type", "-t", default="direct")
    dx.add_argument("--durable", action="store_true")
    dx.add_argument("--auto-delete", action="store_true")
    dx.add_argument("--internal", action="store_true")
    dx.add_argument("--arguments", help="JSON object of exchange arguments")
    db = dsub.add_parser("binding", parents=[common])
    db.add_argument("--source", "-s", required=True)
    db.add_argument("--destination", "-d", required=True)
    db.add_argument("--destination-type", choices=("queue", "exchange"), default="queue")
    db.add_argument("--routing-key", "-k", default="")
    db.add_argument("--arguments", help="JSON object of binding arguments")

    p = cmds.add_parser("delete", parents=[common], help="delete a queue, exchange, binding or connection")
    xsub = p.add_subparsers(dest="kind", required=True)
    xq = xsub.add_parser("queue", parents=[common])
    xq.add_argument("name")
    xq.add_argument("--if-empty", action="store_true")
    xq.add_argument("--if-unused", action="store_true")
    xx = xsub.add_parser("exchange", parents=[common])
    xx.add_argument("name")
    xx.add_argument("--if-unused", action="store_true")
    xb = xsub.add_parser("binding", parents=[common])
    xb.add_argument("--source", "-s", required=True)
    xb.add_argument("--destination", "-d", required=True)
    xb.add_argument("--destination-type", choices=("queue", "exchange"), default="queue")
    xb.add_argument("--properties-key", help="the binding's properties_key (see list bindings)")
    xb.add_argument("--routing-key", "-k", help="or: the routing key of a binding without arguments")
    for kind in POLICY_KINDS:
        xsub.add_parser(kind, parents=[common]).add_argument("name")
    xc = xsub.add_parser("connection", parents=[common])
    xc.add_argument("name")
    xc.add_argument("--reason", default=None, help="close reason sent to the client")

    p = cmds.add_parser("set", parents=[common], help="set a policy or operator policy (applied at once)")
    ssub = p.add_subparsers(dest="kind", required=True)
    for kind in POLICY_KINDS:
        sp = ssub.add_parser(kind, parents=[common])
        sp.add_argument("name")
        sp.add_argument("pattern", help="regular expression matched against queue / exchange names")
        sp.add_argument("definition", help='JSON object, e.g. {"message-ttl": 60000, "max-length": 1000}')
        sp.add_argument("--apply-to", choices=APPLY_TO, default="all")
        sp.add_argument("--priority", type=int, default=0)

    p = cmds.add_parser("close", parents=[common], help="close a client connection")
    csub = p.add_subparsers(dest="kind", required=True)
    cc = csub.add_parser("connection", parents=[common])
    cc.add_argument("name")
    cc.add_argument("--reason", default=None)

    p = cmds.add_parser("publish", parents=[common], help="publish a message")
    p.add_argument("--exchange", "-e", default="amq.default")
    p.add_argument("--routing-key", "-k", required=True)
    p.add_argument("--payload", help="message body (default: read standard input)")
    p.add_argument("--payload-encoding", choices=("string", "base64"), default="string")
    p.add_argument("--properties", help='JSON object, e.g. {"delivery_mode": 2, "headers": {"a": 1}}')

    p = cmds.add_parser("get", parents=[common], help="get messages from a queue")
    p.add_argument("queue")
    p.add_argument("--count", "-c", type=int, default=1)
    p.add_argument("--ackmode", choices=ACKMODES, default="ack_requeue_true")
    p.add_argument("--encoding", choices=("auto", "base64"), default="auto")
    p.add_argument("--truncate", type=int, default=None)

    p = cmds.add_parser("purge", parents=[common], help="remove every ready message of a queue")
    p.add_argument("queue")

    p = cmds.add_parser("export", parents=[common], help="export definitions (JSON) to a file or stdout")
    p.add_argument("file", nargs="?", default="-")
    p.add_argument("--only-vhost", action="store_true", help="just --vhost, in RabbitMQ's per-vhost format")

    p = cmds.add_parser("import", parents=[common], help="import (merge) a definitions file")
    p.add_argument("file", help="definitions JSON file, or - for standard input")
    p.add_argument("--only-vhost", action="store_true", help="import into --vhost (per-vhost format)")

    cli_super_streams.add_commands(cmds, common)
    cli_shovels.add_commands(cmds, common)
    cli_vhosts.add_commands(cmds, common)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="exchange-broker admin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _build(p)
    return p


# ---- commands -----------------------------------------------------------------------------------
def run(args) -> int:
    client = AdminClient(args.url, args.user, args.password, args.timeout)
    try:
        return _dispatch(args, client)
    except ApiError as exc:
        print(f"exchange-broker admin: {exc}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"exchange-broker admin: cannot reach {args.url}: {exc.reason}", file=sys.stderr)
        return 3
    except (OSError, TimeoutError) as exc:
        print(f"exchange-broker admin: {exc}", file=sys.stderr)
        return 3


def _dispatch(args, c: AdminClient) -> int:
    cmd = args.admin_command
    vh = q(args.vhost)
    if cmd == "overview":
        emit(args, c.request("GET", "overview"))
    elif cmd == "super-stream":
        return cli_super_streams.run(args, c, emit)
    elif cmd == "shovel":
        return cli_shovels.run(args, c, emit)
    elif cmd in ("vhost", "trace"):
        return cli_vhosts.run(args, c)
    elif cmd == "list":
        what = args.what
        path = what
        if what in VHOST_SCOPED and not args.all_vhosts:
            path = f"{what}/{vh}"
        data = c.request("GET", path)
        cols = tuple(args.columns.split(",")) if args.columns else LIST_COLUMNS[what]
        emit(args, data, cols)
    elif cmd == "declare":
        if args.kind == "queue":
            body = {"durable": args.durable, "auto_delete": args.auto_delete,
                    "arguments": _json_arg(args.arguments, "--arguments")}
            c.request("PUT", f"queues/{vh}/{q(args.name)}", body)
            print(f"queue declared: {args.name}")
        elif args.kind == "exchange":
            body = {"type": args.type, "durable": args.durable, "auto_delete": args.auto_delete,
                    "internal": args.internal, "arguments": _json_arg(args.arguments, "--arguments")}
            c.request("PUT", f"exchanges/{vh}/{q(args.name)}", body)
            print(f"exchange declared: {args.name}")
        else:
            kind = "q" if args.destination_type == "queue" else "e"
            body = {"routing_key": args.routing_key, "arguments": _json_arg(args.arguments, "--arguments")}
            c.request("POST", f"bindings/{vh}/e/{q(args.source)}/{kind}/{q(args.destination)}", body)
            print(f"binding declared: {args.source} -> {args.destination} ({args.routing_key!r})")
    elif cmd in ("delete", "close"):
        if args.kind == "queue":
            params = {k: "true" for k, on in (("if-empty", args.if_empty), ("if-unused", args.if_unused)) if on}
            c.request("DELETE", f"queues/{vh}/{q(args.name)}", params=params)
            print(f"queue deleted: {args.name}")
        elif args.kind == "exchange":
            params = {"if-unused": "true"} if args.if_unused else None
            c.request("DELETE", f"exchanges/{vh}/{q(args.name)}", params=params)
            print(f"exchange deleted: {args.name}")
        elif args.kind == "binding":
            kind = "q" if args.destination_type == "queue" else "e"
            base = f"bindings/{vh}/e/{q(args.source)}/{kind}/{q(args.destination)}"
            key = args.properties_key
            if key is None:
                if args.routing_key is None:
                    print("exchange-broker admin: give --properties-key or --routing-key", file=sys.stderr)
                    return 2
                found = [b for b in c.request("GET", base) if b["routing_key"] == args.routing_key]
                if not found:
                    print("exchange-broker admin: no such binding", file=sys.stderr)
                    return 1
                key = found[0]["properties_key"]
            c.request("DELETE", f"{base}/{q(key)}")
            print(f"binding deleted: {args.source} -> {args.destination}")
        elif args.kind in POLICY_KINDS:
            c.request("DELETE", f"{POLICY_KINDS[args.kind]}/{vh}/{q(args.name)}")
            print(f"{args.kind} deleted: {args.name}")
        else:
            headers = {"X-Reason": args.reason} if args.reason else None
            c.request("DELETE", f"connections/{q(args.name)}", headers=headers)
            print(f"connection closed: {args.name}")
    elif cmd == "set":
        body = {"pattern": args.pattern, "definition": _json_arg(args.definition, "the definition"),
                "apply-to": args.apply_to, "priority": args.priority}
        c.request("PUT", f"{POLICY_KINDS[args.kind]}/{vh}/{q(args.name)}", body)
        print(f"{args.kind} set: {args.name}")
    elif cmd == "publish":
        payload = args.payload if args.payload is not None else sys.stdin.read()
        body = {"routing_key": args.routing_key, "payload": payload,
                "payload_encoding": args.payload_encoding,
                "properties": _json_arg(args.properties, "--properties")}
        result = c.request("POST", f"exchanges/{vh}/{q(args.exchange)}/publish", body)
        routed = bool(result and result.get("routed"))
        if args.format == "json":
            emit(args, result)
        else:
            print("message published" if routed else "message published but not routed")
        return 0 if routed else 4
    elif cmd == "get":
        body = {"count": args.count, "ackmode": args.ackmode, "encoding": args.encoding}
        if args.truncate is not None:
            body["truncate"] = args.truncate
        msgs = c.request("POST", f"queues/{vh}/{q(args.queue)}/get", body)
        emit(args, msgs, ("routing_key", "exchange", "message_count", "redelivered", "payload",
                          "payload_bytes", "payload_encoding", "properties"))
    elif cmd == "purge":
        c.request("DELETE", f"queues/{vh}/{q(args.queue)}/contents")
        print(f"queue purged: {args.queue}")
    elif cmd == "export":
        path = f"definitions/{vh}" if args.only_vhost else "definitions"
        data = c.request("GET", path)
        text = json.dumps(data, indent=2)
        if args.file == "-":
            print(text)
        else:
            with open(args.file, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            print(f"definitions exported to {args.file}", file=sys.stderr)
    elif cmd == "import":
        try:
            if args.file == "-":
                doc = json.load(sys.stdin)
            else:
                with open(args.file, encoding="utf-8") as fh:
                    doc = json.load(fh)
        except (OSError, ValueError) as exc:
            print(f"exchange-broker admin: cannot read {args.file}: {exc}", file=sys.stderr)
            return 2
        path = f"definitions/{vh}" if args.only_vhost else "definitions"
        c.request("POST", path, doc)
        print(f"definitions imported from {args.file}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
