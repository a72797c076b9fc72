"""Move a queue's messages to another queue of the same vhost: POST
/api/queues/{vhost}/{name}/move with ``{"destination": "other", "count": N}`` (count optional:
every ready message). What RabbitMQ's UI does with a dynamic shovel, done here in one step on the
broker's loop: each message is taken from the source, published to the destination through the
default exchange (same properties and body; it keeps its persistence) and then acknowledged, so a
message is never in neither queue; one the destination refuses goes back and the move stops there. Needs read permission on the source and write on the
destination (as a shovel under the user's name would)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from exchange_broker.core.message import from_wire
from exchange_broker.management.common import (READ, WRITE, AdminContext, Principal, bad_request, check_resource,
                                                find_vhost, is_stream, not_found)
from exchange_broker.management.fields import int_from, str_from
from exchange_broker.management.messages import MAX_GET_COUNT
from exchange_broker.management.web import Ctx, Who, json_object, u
from exchange_broker.protocol import codec

router = APIRouter(tags=["queues"])


def move_messages(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> int:
    vh = find_vhost(ctx.broker, vhost)
    source = vh.queues.get(name)
    if source is None:
        raise not_found()
    dest_name = str_from(body, "destination", required=True)
    dest = vh.queues.get(dest_name)
    if dest is None:
        raise not_found(f"no queue '{dest_name}' in vhost '{vhost}'")
    if dest is source:
        raise bad_request("the destination is the queue itself")
    if is_stream(source):
        raise bad_request("messages cannot be moved out of a stream queue")
    if source.exclusive_owner is not None:
        raise bad_request(f"405 RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                          f"{vh.describe('queue', name)}")
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    check_resource(ctx.broker, who, vhost, WRITE, "exchange", "amq.default")
    limit = int_from(body, "count", source.message_count, 0, MAX_GET_COUNT * 100)
    default = vh.exchanges[""]
    moved = 0
    while moved < limit:
        msg = source.get()
        if msg is None:
            break
        quick = codec.quick_properties(msg.properties)  # republished: its TTL starts again
        copy = from_wire("", dest_name, msg.properties, msg.body, None, quick)
        routed, _waiter, rejected = ctx.broker.publish(vh, default, copy, bool(quick[2] & codec.FLAG_HEADERS))
        if not routed or rejected:  # e.g. the destination refuses (overflow reject-publish): keep it
            source.requeue([msg])
            break
        source.settle(msg)
        moved += 1
    return moved


@router.post("/api/queues/{vhost}/{name}/move",
             summary='Move messages to another queue ({"destination": "q2", "count": N}); answers {"moved": N}')
async def queue_move(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return {"moved": move_messages(ctx, u(vhost), u(name), await json_object(request), who)}
