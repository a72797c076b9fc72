"""Super streams and their consumer groups: /api/super-streams.

* ``GET /api/super-streams[/{vhost}]``: every super stream (exchange of type ``x-super-stream``)
  with its partition count and message total.
* ``GET /api/super-streams/{vhost}/{name}``: its partitions (queue, first/next offset, messages,
  bytes, consumers) and its groups.
* ``PUT /api/super-streams/{vhost}/{name}`` ``{"partitions": M, "arguments": {...}}``: declare it
  (durable, with those stream retention arguments) or raise its partition count to M (new
  partitions start empty; a lower count is 400: partitions are never removed).
* ``GET /api/super-streams/{vhost}/{name}/groups[/{group}]``: each consumer group's members (consumer
  tag, connection, channel, partitions held), its assignment, and per partition the committed
  offset (the last acked, stored), the next offset of the log and the lag.

A group is listed while it has members, and afterwards while a partition stores an offset under
its name (a partition's named-consumer offsets are the groups' offsets). ``lag`` is the number of
messages in the partition after the committed offset (from the first kept offset when nothing
is committed). Reading needs read permission on the partitions; declaring and growing, configure
permission on the exchange and the partitions.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from exchange_broker.core import super_streams as core_ss
from exchange_broker.management.common import (CONFIGURE, READ, AdminContext, Principal, bad_request,
                                                check_resource, find_vhost, from_amqp, not_found,
                                                visible_vhosts)
from exchange_broker.management.connections import conn_name
from exchange_broker.management.fields import arguments_from, to_json
from exchange_broker.management.web import Ctx, Who, created, json_object, listing, u
from exchange_broker.protocol.errors import AMQPError
from exchange_broker.queue_types import consumer_groups
from routing.super_stream import MAX_PARTITIONS, PARTITIONS_ARG, X_SUPER_STREAM

router = APIRouter(tags=["super-streams"])


# ---- service -----------------------------------------------------------------------------------
def _find(ctx: AdminContext, vhost: str, name: str, who: Principal | None):
    vh = find_vhost(ctx.broker, vhost)
    if who is not None and not who.can_see(vhost):
        raise not_found()
    ex = vh.exchanges.get(name)
    if ex is None or ex.type != X_SUPER_STREAM:
        raise not_found(f"no super stream '{name}' in vhost '{vhost}'")
    queues = core_ss.partitions(vh, ex)
    for i, q in enumerate(queues):
        check_resource(ctx.broker, who, vhost, READ, "queue", q.name if q else core_ss.partition_name(name, i))
    return vh, ex, queues


def _summary(ex, queues: list) -> dict:
    return {"vhost": ex.vhost, "name": ex.name, "partitions": ex.index.partitions,
            "messages": sum(q.message_count for q in queues if q is not None),
            "arguments": to_json(ex.arguments)}


def list_super_streams(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    return [_summary(ex, core_ss.partitions(vh, ex)) for vh in visible_vhosts(ctx.broker, vhost, who)
            for ex in vh.exchanges.values() if ex.type == X_SUPER_STREAM]


def partition_info(number: int, q) -> dict:
    if q is None:
        return {"partition": number, "queue": None}
    return {"partition": number, "queue": q.name, "first_offset": q.first_offset,
            "next_offset": q.next_offset, "messages": q.message_count, "bytes": q.total_bytes,
            "consumers": len(q.consumers)}


def describe_super_stream(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> dict:
    _vh, ex, queues = _find(ctx, vhost, name, who)
    info = _summary(ex, queues)
    info["partition_details"] = [partition_info(i, q) for i, q in enumerate(queues)]
    info["groups"] = sorted(_group_names(ctx.broker, vhost, name, queues))
    return info


def _group_names(broker, vhost: str, name: str, queues: list) -> set:
    names = {g.group for g in consumer_groups.groups(broker, vhost, name)}
    for q in queues:
        if q is not None:
            names.update(q.offsets)
    return names


def group_info(ctx: AdminContext, vhost: str, name: str, queues: list, group: str) -> dict:
    live = next((g for g in consumer_groups.groups(ctx.broker, vhost, name) if g.group == group), None)
    state = live.info() if live is not None else {"group": group, "members": [], "partitions": []}
    by_number = {p["partition"]: p for p in state["partitions"]}
    rows = []
    for i, q in enumerate(queues):
        row = {"partition": i, "queue": q.name if q is not None else None, "owner": None,
               "state": "unassigned", "unacked": 0}
        row.update(by_number.get(i, {}))
        if q is not None:
            committed = q.offsets.get(group)
            start = max(q.first_offset, committed + 1) if committed is not None else q.first_offset
            row.update(committed_offset=committed, next_offset=q.next_offset,
                       lag=max(0, q.next_offset - start))
        rows.append(row)
    for m in state["members"]:
        m["connection"] = conn_name(ctx, m.pop("session"))
    return {"vhost": vhost, "super_stream": name, "group": group, "members": state["members"],
            "partitions": rows, "lag": sum(r.get("lag", 0) for r in rows)}


def list_groups(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> list[dict]:
    _vh, _ex, queues = _find(ctx, vhost, name, who)
    return [group_info(ctx, vhost, name, queues, g) for g in sorted(_group_names(ctx.broker, vhost, name, queues))]


def get_group(ctx: AdminContext, vhost: str, name: str, group: str, who: Principal | None = None) -> dict:
    _vh, _ex, queues = _find(ctx, vhost, name, who)
    if group not in _group_names(ctx.broker, vhost, name, queues):
        raise not_found(f"no consumer group '{group}' of super stream '{name}' in vhost '{vhost}'")
    return group_info(ctx, vhost, name, queues, group)


def all_group_rows(ctx: AdminContext) -> list[dict]:
    """Every group of every super stream (the metrics' source)."""
    out = []
    for vh in ctx.broker.vhosts.values():
        for ex in list(vh.exchanges.values()):
            if ex.type == X_SUPER_STREAM:
                queues = core_ss.partitions(vh, ex)
                for g in sorted(_group_names(ctx.broker, vh.name, ex.name, queues)):
                    out.append(group_info(ctx, vh.name, ex.name, queues, g))
    return out


def put_super_stream(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> bool:
    """Declare (True: created) or grow (False) to ``body["partitions"]``."""
    vh = find_vhost(ctx.broker, vhost)
    n = body.get("partitions")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise bad_request(f"'partitions' must be an integer from 1 to {MAX_PARTITIONS}")
    check_resource(ctx.broker, who, vhost, CONFIGURE, "exchange", name)
    for i in range(n):
        check_resource(ctx.broker, who, vhost, CONFIGURE, "queue", core_ss.partition_name(name, i))
    ex = vh.exchanges.get(name)
    if ex is None:
        args = {**arguments_from(body.get("arguments")), PARTITIONS_ARG: n}
        try:
            vh.declare_exchange(name, X_SUPER_STREAM, False, True, False, False, args)
        except AMQPError as err:
            raise from_amqp(err) from None
        return True
    if ex.type != X_SUPER_STREAM:
        raise bad_request(f"exchange '{name}' in vhost '{vhost}' is not a super stream")
    if n != ex.index.partitions:
        try:
            core_ss.grow(vh, name, n)
        except (LookupError, ValueError) as exc:
            raise bad_request(str(exc)) from None
        consumer_groups.partitions_changed(ctx.broker, vhost, name, core_ss.partitions(vh, ex))
    return False


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/super-streams")
async def super_streams_all(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    """Every super stream: name, partitions, messages."""
    return listing(request, list_super_streams(ctx, None, who))


@router.get("/api/super-streams/{vhost}")
async def super_streams_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_super_streams(ctx, u(vhost), who))


@router.get("/api/super-streams/{vhost}/{name}")
async def super_stream_get(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    """A super stream's partitions (offsets, messages) and the names of its groups."""
    return describe_super_stream(ctx, u(vhost), u(name), who)


@router.put("/api/super-streams/{vhost}/{name}")
async def super_stream_put(vhost: str, name: str, request: Request, who: Principal = Who,
                           ctx: AdminContext = Ctx):
    """{"partitions": M, "arguments": {...}}: declare, or raise the partition count to M."""
    return created(put_super_stream(ctx, u(vhost), u(name), await json_object(request), who))


@router.get("/api/super-streams/{vhost}/{name}/groups")
async def super_stream_groups(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    """Each consumer group: members, assignment, committed offsets and lag per partition."""
    return list_groups(ctx, u(vhost), u(name), who)


@router.get("/api/super-streams/{vhost}/{name}/groups/{group}")
async def super_stream_group(vhost: str, name: str, group: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_group(ctx, u(vhost), u(name), u(group), who)
