"""Virtual hosts: /api/vhosts (list, get, create, delete).

A vhost's permissions are in permissions.py, its connections and channels in connections.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from exchange_broker.management.common import (NODE, AdminContext, Principal, bad_request, check_admin,
                                                find_vhost, visible_vhosts)
from exchange_broker.management.stats import unacked_by_queue
from exchange_broker.management.web import Ctx, Who, body_doc, created, json_object, listing, no_content, u

router = APIRouter(tags=["vhosts"])


class VhostBody(BaseModel):
    description: str = ""
    tags: str | list[str] = ""
    default_queue_type: str | None = None
    tracing: bool | None = None


# ---- service -----------------------------------------------------------------------------------
def vhost_info(vh, unacked: dict) -> dict:
    ready = sum(q.message_count for q in vh.queues.values())
    unack = sum(unacked.get(id(q), (0, 0))[0] for q in vh.queues.values())
    dqt = vh.default_queue_type
    metadata = {"description": "", "tags": [], **({"default_queue_type": dqt} if dqt else {})}
    return {"name": vh.name, "description": "Default virtual host" if vh.name == "/" else "",
            "tags": [], "metadata": metadata, "tracing": vh.tracing,
            "default_queue_type": dqt or "classic", "cluster_state": {NODE: "running"},
            "messages": ready + unack, "messages_ready": ready, "messages_unacknowledged": unack}


def list_vhosts(ctx: AdminContext, who: Principal | None = None) -> list[dict]:
    unacked = unacked_by_queue(ctx.broker)
    return [vhost_info(vh, unacked) for vh in visible_vhosts(ctx.broker, None, who)]


def get_vhost(ctx: AdminContext, name: str, who: Principal | None = None) -> dict:
    vh = visible_vhosts(ctx.broker, name, who)[0]
    return vhost_info(vh, unacked_by_queue(ctx.broker))


def default_queue_type_of(body: dict) -> str | None:
    """``default_queue_type`` of a vhost's JSON (top level or in ``metadata``, as RabbitMQ takes
    it); None when absent; 400 when not a string."""
    value = body.get("default_queue_type")
    if value is None and isinstance(body.get("metadata"), dict):
        value = body["metadata"].get("default_queue_type")
    if value is None or value in ("", "undefined"):
        return None
    if not isinstance(value, str):
        raise bad_request("default_queue_type must be a string")
    return value


def add_vhost(ctx: AdminContext, name: str, who: Principal | None = None, body: dict | None = None) -> bool:
    """Create the vhost (or update it): ``default_queue_type`` and ``tracing`` from ``body`` when
    given."""
    check_admin(who)
    if not name or len(name.encode("utf-8")) > 255:
        raise bad_request("invalid vhost name")
    dqt = default_queue_type_of(body or {})
    tracing = (body or {}).get("tracing")
    if tracing is not None and not isinstance(tracing, bool):
        raise bad_request("tracing must be true or false")
    if dqt is not None and dqt not in ctx.broker.queue_types:
        raise bad_request(f"unsupported queue type '{dqt}' (one of {', '.join(sorted(ctx.broker.queue_types))})")
    was_created = name not in ctx.broker.vhosts
    ctx.broker.add_vhost(name)
    if dqt is not None:
        ctx.broker.set_default_queue_type(name, dqt)
    if tracing is not None:  # the firehose (core/tracing.py), as rabbitmqctl trace_on/trace_off
        ctx.broker.set_tracing(name, tracing)
    return was_created


def delete_vhost(ctx: AdminContext, name: str, who: Principal | None = None) -> None:
    check_admin(who)
    find_vhost(ctx.broker, name)
    ctx.broker.delete_vhost(name)  # its connections get 320; the deletion is stored
    if ctx.movers is not None:
        ctx.movers.vhost_deleted(name)  # its shovels stop, their parameters go


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/vhosts")
async def vhosts(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_vhosts(ctx, who), sort=("name",))


@router.get("/api/vhosts/{vhost}")
async def vhost_get(vhost: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_vhost(ctx, u(vhost), who)


@router.put("/api/vhosts/{vhost}", openapi_extra=body_doc(VhostBody))
async def vhost_put(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    body = await json_object(request)
    return created(add_vhost(ctx, u(vhost), who, body))


@router.delete("/api/vhosts/{vhost}", status_code=204)
async def vhost_delete(vhost: str, who: Principal = Who, ctx: AdminContext = Ctx):
    delete_vhost(ctx, u(vhost), who)
    return no_content()
