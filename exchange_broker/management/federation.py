"""Federation links: /api/federation-links[/{vhost}] (RabbitMQ's federation management plugin).

Each item: ``type`` (``exchange`` / ``queue``), ``vhost``, ``exchange`` or ``queue`` (the local
one), ``upstream_exchange`` / ``upstream_queue``, ``upstream``, ``uri`` (password left out),
``status`` (``starting`` / ``running`` / ``error`` with ``error``: the reason), and the counters
``forwarded`` (messages brought over) and ``dropped`` (over ``max-hops`` or back from a cycle).
Upstreams and sets are runtime parameters (parameters.py); policies pick what is federated.
``node`` is the node running the link: in a cluster with per-queue leaders every node's links are
listed (``mover_nodes.py``).
"""

from __future__ import annotations

import time
from urllib.parse import quote

from fastapi import APIRouter, Request

from exchange_broker.management import mover_nodes
from exchange_broker.management.common import NODE, AdminContext, Principal, visible_vhosts
from exchange_broker.management.parameters import movers
from exchange_broker.management.web import Ctx, Who, listing, u
from exchange_broker.movers.federation import EXCHANGE_LINK, QUEUE_LINK

router = APIRouter(tags=["federation"])


def link_status(key, mover, status, node: str = NODE) -> dict:
    out = {"node": node, "vhost": key[1], "id": key[2],
           "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status.since)),
           "status": "error" if status.state == "terminated" else status.state}
    out.update(mover.info())
    if status.reason:
        out["error"] = status.reason
    return out


def list_links(ctx: AdminContext, vhost: str | None, who: Principal | None = None) -> list[dict]:
    names = {vh.name for vh in visible_vhosts(ctx.broker, vhost, who)}
    node = mover_nodes.node_name(ctx, NODE)
    return [link_status(*e, node=node) for e in movers(ctx).supervisor.entries()
            if e[0][0] in (EXCHANGE_LINK, QUEUE_LINK) and e[0][1] in names]


@router.get("/api/federation-links", summary="Every federation link and its status")
async def all_(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    rows = list_links(ctx, None, who) + await mover_nodes.others(ctx, request, "/api/federation-links")
    return listing(request, rows, sort=("vhost", "id"))


@router.get("/api/federation-links/{vhost}", summary="The federation links of a vhost")
async def of_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    path = f"/api/federation-links/{quote(u(vhost), safe='')}"
    rows = list_links(ctx, u(vhost), who) + await mover_nodes.others(ctx, request, path)
    return listing(request, rows, sort=("vhost", "id"))
