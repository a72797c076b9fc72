"""Shovel status: /api/shovels[/{vhost}], /api/shovels/vhost/{vhost}/{name} and
DELETE /api/shovels/vhost/{vhost}/{name}/restart (RabbitMQ's shovel management plugin).

Each item has RabbitMQ's fields: ``name``, ``vhost``, ``type`` (``dynamic``), ``state``
(``starting`` / ``running`` / ``terminated``, with ``reason``), ``src_uri`` and ``dest_uri``
(passwords left out), the source and destination, and the counters ``forwarded`` (messages moved)
and ``pending`` (published, not yet confirmed); ``remaining`` with ``delete-after``; ``node``: the
node running it (in a cluster with per-queue leaders every node's shovels are listed, and one
shovel is looked up and restarted on its node: ``mover_nodes.py``).
"""

from __future__ import annotations

import time
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from exchange_broker.management import mover_nodes
from exchange_broker.management.common import NODE, AdminContext, Principal, not_found, visible_vhosts
from exchange_broker.management.parameters import movers
from exchange_broker.management.web import Ctx, Who, listing, no_content, u
from exchange_broker.movers.parameters import SHOVEL

router = APIRouter(tags=["shovels"])


def shovel_status(key, mover, status, node: str = NODE) -> dict:
    _kind, vhost, name = key
    out = {"node": node, "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.since)),
           "name": name, "vhost": vhost, "type": "dynamic", "state": status.state,
           "blocked_status": "running" if status.state == "running" else status.state}
    out.update(mover.info())
    if status.reason:
        out["reason"] = status.reason
    return out


def list_shovels(ctx: AdminContext, vhost: str | None, who: Principal | None = None) -> list[dict]:
    names = {vh.name for vh in visible_vhosts(ctx.broker, vhost, who)}
    node = mover_nodes.node_name(ctx, NODE)
    return [shovel_status(*e, node=node) for e in movers(ctx).supervisor.entries(SHOVEL) if e[0][1] in names]


def one_shovel(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> dict | None:
    """The shovel's status here (None: it does not run on this node)."""
    visible_vhosts(ctx.broker, vhost, who)
    found = movers(ctx).supervisor.get((SHOVEL, vhost, name))
    return None if found is None else shovel_status((SHOVEL, vhost, name), *found,
                                                    node=mover_nodes.node_name(ctx, NODE))


def _path(vhost: str | None = None, name: str | None = None, tail: str = "") -> str:
    if vhost is None:
        return "/api/shovels"
    if name is None:
        return f"/api/shovels/{quote(vhost, safe='')}"
    return f"/api/shovels/vhost/{quote(vhost, safe='')}/{quote(name, safe='')}{tail}"


@router.get("/api/shovels", summary="Every shovel and its state")
async def all_(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    rows = list_shovels(ctx, None, who) + await mover_nodes.others(ctx, request, _path())
    return listing(request, rows)


@router.get("/api/shovels/{vhost}", summary="The shovels of a vhost")
async def of_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    rows = list_shovels(ctx, u(vhost), who) + await mover_nodes.others(ctx, request, _path(u(vhost)))
    return listing(request, rows)


@router.get("/api/shovels/vhost/{vhost}/{name}", summary="One shovel's state")
async def one(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    found = one_shovel(ctx, u(vhost), u(name), who)
    if found is not None:
        return found
    there = await mover_nodes.elsewhere(ctx, request, "GET", _path(u(vhost), u(name)))
    if there is None:
        raise not_found()
    return JSONResponse(there[1], status_code=there[0])


@router.delete("/api/shovels/vhost/{vhost}/{name}/restart", status_code=204, summary="Restart a shovel")
async def restart(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    if one_shovel(ctx, u(vhost), u(name), who) is not None:
        movers(ctx).supervisor.restart((SHOVEL, u(vhost), u(name)))
        return no_content()
    there = await mover_nodes.elsewhere(ctx, request, "DELETE", _path(u(vhost), u(name), "/restart"))
    if there is None:
        raise not_found()
    return no_content() if there[0] == 204 else JSONResponse(there[1], status_code=there[0])
