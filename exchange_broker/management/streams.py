"""Stream queues: /api/stream-offsets, a stream's log (first/next offset, counts, segments) and
the offsets stored for its named consumers (``x-stream-consumer-name``).

The answers come from the stream queue object itself (``info()``, ``query_offset``, ``set_offset``).
Reading or setting needs read permission on the queue.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from exchange_broker.management.common import (READ, AdminContext, Principal, bad_request, check_resource,
                                                find_vhost, is_stream, not_found)
from exchange_broker.management.web import Ctx, Who, json_object, no_content, u

router = APIRouter(tags=["streams"])


# ---- service -----------------------------------------------------------------------------------
def find_stream(ctx: AdminContext, vhost: str, name: str):
    """The stream queue ``name`` (404 no such vhost or queue, 400 not a stream)."""
    q = find_vhost(ctx.broker, vhost).queues.get(name)
    if q is None:
        raise not_found()
    if not is_stream(q):
        raise bad_request(f"queue '{name}' in vhost '{vhost}' is not a stream queue: "
                          f"queue '{name}' in vhost '{vhost}' is not a stream")
    return q


def describe_stream(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> dict:
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    return find_stream(ctx, vhost, name).info()


def stream_offset(ctx: AdminContext, vhost: str, name: str, consumer: str, who: Principal | None = None) -> dict:
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    offset = find_stream(ctx, vhost, name).query_offset(consumer)
    if offset is None:
        raise not_found(f"no stored offset for consumer '{consumer}'")
    return {"vhost": vhost, "queue": name, "name": consumer, "offset": offset}


def set_stream_offset(ctx: AdminContext, vhost: str, name: str, consumer: str, body: dict,
                      who: Principal | None = None) -> None:
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    offset = body.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise bad_request("'offset' must be a non-negative integer")
    find_stream(ctx, vhost, name).set_offset(consumer, offset)


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/stream-offsets/{vhost}/{name}")
async def stream_info(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    """A stream queue's log: first/next offset, counts, segments and stored consumer offsets."""
    return describe_stream(ctx, u(vhost), u(name), who)


@router.get("/api/stream-offsets/{vhost}/{name}/{consumer}")
async def stream_offset_get(vhost: str, name: str, consumer: str, who: Principal = Who, ctx: AdminContext = Ctx):
    """The offset stored for a named consumer (`x-stream-consumer-name`)."""
    return stream_offset(ctx, u(vhost), u(name), u(consumer), who)


@router.put("/api/stream-offsets/{vhost}/{name}/{consumer}", status_code=204)
async def stream_offset_put(vhost: str, name: str, consumer: str, request: Request, who: Principal = Who,
                            ctx: AdminContext = Ctx):
    """Store {"offset": N}: the named consumer's next consume resumes at N + 1."""
    set_stream_offset(ctx, u(vhost), u(name), u(consumer), await json_object(request), who)
    return no_content()
