"""Queues: /api/queues (list, get, declare, delete, purge).

Declaring, deleting and purging go through the vhost (RabbitMQ's rules, durability). Getting
messages is in messages.py, a queue's bindings in bindings.py, stream offsets in streams.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from exchange_broker.management.common import (CONFIGURE, NODE, READ, AdminContext, Principal, bad_request,
                                                check_resource, find_queue, find_vhost, from_amqp,
                                                not_found, visible_vhosts)
from exchange_broker.management import leader_figures
from exchange_broker.management.connections import conn_name, consumer_info
from exchange_broker.management.fields import arguments_from, bool_from, to_json
from exchange_broker.management.samples import NO_RANGES, Ranges
from exchange_broker.management.stats import unacked_by_queue
from exchange_broker.management.web import (Ctx, Who, body_doc, created, flag, json_object, listing,
                                            no_content, ranges, u)
from exchange_broker.protocol.errors import AMQPError

router = APIRouter(tags=["queues"])


class QueueBody(BaseModel):
    durable: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


# ---- service -----------------------------------------------------------------------------------
def _ready_bytes(q) -> int:
    return q.message_bytes  # every ready message: in memory, paged to the store or held


def queue_info(ctx: AdminContext, q, unacked: dict, ranges: Ranges = NO_RANGES) -> dict:
    n_unacked, b_unacked = unacked.get(id(q), (0, 0))
    ready = q.message_count
    b_ready = _ready_bytes(q)
    consumers = list(q.consumers)
    rates = ctx.rates
    qtype = q.arguments.get("x-queue-type") or "classic"
    info = {
        "name": q.name, "vhost": q.vhost, "durable": q.durable, "auto_delete": q.auto_delete,
        "exclusive": q.exclusive, "arguments": to_json(q.arguments), "node": NODE,
        "type": to_json(qtype), "state": "running", "policy": None,
        # messages, messages_ready, messages_unacknowledged and their *_details (samples.py)
        **rates.queue_lengths(q, ready, n_unacked, ranges.lengths),
        "message_bytes": b_ready + b_unacked, "message_bytes_ready": b_ready,
        "message_bytes_unacknowledged": b_unacked,
        "consumers": len(consumers),
        "consumer_capacity": 1.0 if consumers else 0, "consumer_utilisation": 1.0 if consumers else 0,
        "exclusive_consumer_tag": next((c.tag for c in consumers if c.exclusive), None),
        "message_stats": rates.queue_stats(q, ranges.msg_rates),  # each counter with its rate
    }
    vh = ctx.broker.vhosts.get(q.vhost)  # policies (core/policies.py): names and merged definition
    info["policy"], info["operator_policy"] = q.policy, q.operator_policy
    info["effective_policy_definition"] = \
        vh.policies.effective_definition(q.policy, q.operator_policy) if vh is not None else {}
    owner = q.exclusive_owner
    if owner is not None:
        info["owner_pid_details"] = {"name": conn_name(ctx, owner)}
    return info


def list_queues(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None,
                ranges: Ranges = NO_RANGES) -> list[dict]:
    return [info for info, _q in _listed(ctx, vhost, who, ranges)]


def _listed(ctx: AdminContext, vhost: str | None, who: Principal | None, ranges: Ranges) -> list[tuple[dict, Any]]:
    unacked = unacked_by_queue(ctx.broker)
    return [(queue_info(ctx, q, unacked, ranges), q) for vh in visible_vhosts(ctx.broker, vhost, who)
            for q in vh.queues.values()]


async def _listing_with_leaders(ctx: AdminContext, request: Request, vhost: str | None, who: Principal):
    pairs = _listed(ctx, vhost, who, ranges(request))
    infos = [info for info, _q in pairs]
    await leader_figures.fill(ctx, request, infos, [q for _info, q in pairs])
    return listing(request, infos)


def get_queue(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None,
              ranges: Ranges = NO_RANGES) -> dict:
    visible_vhosts(ctx.broker, vhost, who)
    q = find_queue(ctx.broker, vhost, name)
    info = queue_info(ctx, q, unacked_by_queue(ctx.broker), ranges)
    info["consumer_details"] = [consumer_info(ctx, c) for c in q.consumers]
    return info


def declare_queue(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> bool:
    """PUT: declare (created -> True, already there and equivalent -> False)."""
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, CONFIGURE, "queue", name)
    durable = bool_from(body, "durable", False)
    auto_delete = bool_from(body, "auto_delete", False)
    args = arguments_from(body.get("arguments"))
    if not name:
        raise bad_request("queue name must not be empty")
    existing = vh.queues.get(name)
    try:
        vh.declare_queue(name, False, durable, False, auto_delete, args, owner=None)
    except AMQPError as err:
        raise from_amqp(err) from None
    return existing is None


def delete_queue(ctx: AdminContext, vhost: str, name: str, if_empty: bool = False, if_unused: bool = False,
                 who: Principal | None = None) -> None:
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, CONFIGURE, "queue", name)
    q = vh.queues.get(name)
    if q is None:
        raise not_found()
    try:
        vh.delete_queue(name, if_unused, if_empty, owner=q.exclusive_owner)
    except AMQPError as err:
        raise from_amqp(err) from None


async def purge_queue(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> None:
    """Purge through any node: the queue type's ``purge_later`` answers later when another party
    purges it (a cluster's placeholder: the queue's leader, over this node's link to it)."""
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    q = vh.queues.get(name)
    if q is None:
        raise not_found()
    answer = type("PurgeOk", (), {"message_count": 0})()
    later = q.purge_later(answer)
    if later is None:
        try:
            vh.purge_queue(name, owner=q.exclusive_owner)
        except AMQPError as err:
            raise from_amqp(err, refused_is_auth=False) from None
        return
    done = asyncio.get_running_loop().create_future()
    later.add(lambda _arg, ok: done.done() or done.set_result(ok), None)
    if not await done:
        raise from_amqp(q.command_error(), refused_is_auth=False)


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/queues")
async def queues(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return await _listing_with_leaders(ctx, request, None, who)


@router.get("/api/queues/{vhost}")
async def queues_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return await _listing_with_leaders(ctx, request, u(vhost), who)


@router.get("/api/queues/{vhost}/{name}")
async def queue_get(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    info = get_queue(ctx, u(vhost), u(name), who, ranges(request))
    await leader_figures.fill(ctx, request, [info], [find_queue(ctx.broker, u(vhost), u(name))])
    return info


@router.put("/api/queues/{vhost}/{name}", openapi_extra=body_doc(QueueBody),
            summary="Declare a queue (201 created, 204 already there)")
async def queue_put(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return created(declare_queue(ctx, u(vhost), u(name), await json_object(request), who))


@router.delete("/api/queues/{vhost}/{name}", status_code=204,
               summary="Delete a queue (?if-empty=true, ?if-unused=true)")
async def queue_delete(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    delete_queue(ctx, u(vhost), u(name), flag(request, "if-empty", "if_empty"),
                 flag(request, "if-unused", "if_unused"), who)
    return no_content()


@router.delete("/api/queues/{vhost}/{name}/contents", status_code=204, summary="Purge a queue")
async def queue_purge(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    await purge_queue(ctx, u(vhost), u(name), who)
    return no_content()
