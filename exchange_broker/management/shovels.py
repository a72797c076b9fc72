"""Shovel status: /api/shovels[/{vhost}], /api/shovels/vhost/{vhost}/{name} and
DELETE /api/shovels/vhost/{vhost}/{name}/restart (RabbitMQ's shovel management plugin).

Each item has RabbitMQ's fields: ``name``, ``vhost``, ``type`` (``dynamic``), ``state``
(``starting`` / ``running`` / ``terminated``, with ``reason``), ``src_uri`` and ``dest_uri``
(passwords left out), the source and destination, and the counters ``forwarded`` (messages moved)
and ``pending`` (published, not yet confirmed); ``remaining`` with ``delete-after``.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from exchange_broker.management.common import NODE, AdminContext, Principal, not_found, visible_vhosts
from exchange_broker.management.parameters import movers
from exchange_broker.management.web import Ctx, Who, listing, no_content, u
from exchange_broker.movers.parameters import SHOVEL

router = APIRouter(tags=["shovels"])


def shovel_status(key, mover, status) -> dict:
    _kind, vhost, name = key
    out = {"node": NODE, "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.since)),
           "name": name, "vhost": vhost, "type": "dynamic", "state": status.state,
           "blocked_status": "running" if status.state == "running" else status.state}
    out.update(mover.info())
    if status.reason:
        out["reason"] = status.reason
    return out


def list_shovels(ctx: AdminContext, vhost: str | None, who: Principal | None = None) -> list[dict]:
    names = {vh.name for vh in visible_vhosts(ctx.broker, vhost, who)}
    return [shovel_status(*e) for e in movers(ctx).supervisor.entries(SHOVEL) if e[0][1] in names]


def one_shovel(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> dict:
    visible_vhosts(ctx.broker, vhost, who)
    found = movers(ctx).supervisor.get((SHOVEL, vhost, name))
    if found is None:
        raise not_found()
    return shovel_status((SHOVEL, vhost, name), *found)


@router.get("/api/shovels", summary="Every shovel and its state")
async def all_(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_shovels(ctx, None, who))


@router.get("/api/shovels/{vhost}", summary="The shovels of a vhost")
async def of_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_shovels(ctx, u(vhost), who))


@router.get("/api/shovels/vhost/{vhost}/{name}", summary="One shovel's state")
async def one(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return one_shovel(ctx, u(vhost), u(name), who)


@router.delete("/api/shovels/vhost/{vhost}/{name}/restart", status_code=204, summary="Restart a shovel")
async def restart(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    one_shovel(ctx, u(vhost), u(name), who)
    movers(ctx).supervisor.restart((SHOVEL, u(vhost), u(name)))
    return no_content()
