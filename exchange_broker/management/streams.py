"""Stream queues: /api/stream-offsets, a stream's log (first/next offset, counts, segments) and
the offsets stored for its named consumers (``x-stream-consumer-name``); /api/stream-chunks, a
range of a stored stream's log as the chunks the store holds (a bulk read with no per-message
work in the broker: ``persistence.stream_chunks.read_frames`` decodes it).

The answers come from the stream queue object itself (``info()``, ``query_offset``, ``set_offset``)
and, for chunks, from its store (read off the event loop). Everything needs read permission on
the queue.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from persistence.stream_chunks import frame

from exchange_broker.core.queue import HELD_HERE
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
    if HELD_HERE not in q.capabilities():  # a cluster: its log and offsets are served by its leader's admin API
        raise bad_request(f"stream '{name}' in vhost '{vhost}' is led by node '{q.leader}': ask that node's "
                          f"admin API (exchange-broker cluster status lists it)")
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


CHUNKS_PER_READ = 32  # chunks read from the store at a time while a /api/stream-chunks answer streams


def _offset_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise bad_request(f"'{name}' must be a non-negative integer offset, not {raw!r}") from None
    if value < 0:
        raise bad_request(f"'{name}' must be a non-negative integer offset, not {raw!r}")
    return value


def _read_chunks(store, queue_id: int, start: int, end: int) -> list:
    return store.read_chunks(queue_id, start, end, CHUNKS_PER_READ)


async def _chunks(st, queue_id: int, start: int, end: int) -> list:
    fut = asyncio.get_running_loop().create_future()

    def done(got, exc) -> None:
        if not fut.done():
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(got)
    st.read(_read_chunks, queue_id, start, end, done=done)
    return await fut


def chunk_range(ctx: AdminContext, vhost: str, name: str, request: Request,
                who: Principal | None = None) -> tuple:
    """(durability, store id, first offset, end offset) of a /api/stream-chunks read."""
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    q = find_stream(ctx, vhost, name)
    st = q._durability
    if st is None:
        raise bad_request(f"stream '{name}' in vhost '{vhost}' is not stored (the broker runs "
                          f"without a store): read it over AMQP")
    start = max(_offset_param(request, "from", q.first_offset), q.first_offset)
    end = min(_offset_param(request, "to", q.next_offset), q.committed_end())
    return st, q.store_id, start, max(start, end)


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/stream-offsets/{vhost}/{name}")
async def stream_info(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    """A stream queue's log: first/next offset, counts, segments and stored consumer offsets."""
    return describe_stream(ctx, u(vhost), u(name), who)


@router.get("/api/stream-chunks/{vhost}/{name}")
async def stream_chunks(vhost: str, name: str, request: Request, who: Principal = Who,
                        ctx: AdminContext = Ctx):
    """Offsets `from` (default: the first kept) up to `to` (exclusive; default: the end of what is
    committed) of a stored stream, as the store's chunks: for each, `<qI` (its first offset, the
    blob's length) and the blob (persistence/stream_chunks.py). The first and last chunk may hold
    offsets outside the range; `X-Stream-From` and `X-Stream-To` say which range was read."""
    st, queue_id, start, end = chunk_range(ctx, u(vhost), u(name), request, who)

    async def body():
        pos = start  # offsets: seq = offset + 1
        while pos < end:
            rows = await _chunks(st, queue_id, pos, end)
            if not rows:
                return
            for first_seq, _last, blob in rows:
                yield frame(first_seq - 1, blob)
            pos = rows[-1][1]  # the offset after the last chunk's last message
    return StreamingResponse(body(), media_type="application/octet-stream",
                             headers={"X-Stream-From": str(start), "X-Stream-To": str(end)})


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
