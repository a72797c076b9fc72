"""Shovels and federation links of every node of a cluster with per-queue leaders.

Each mover runs on one node (``movers/placement.py``), so a listing on one node shows only its own.
``/api/shovels[...]`` and ``/api/federation-links[...]`` on a node of such a cluster also ask every
other live node's admin API for the same path (on executor threads, in parallel, with the caller's
``Authorization``: the users are the cluster's) and add what they run, each row naming its
``node``; the requests carry :data:`LOCAL` so the nodes asked answer with their own movers only.
A node that does not answer within :data:`TIMEOUT` s is left out of the listing (its movers are
taken over by the others once it is declared dead). One shovel (``/api/shovels/vhost/V/N``) and
its restart are asked of the node that runs it when it is not this one (:func:`elsewhere`).
"""

from __future__ import annotations

import asyncio
import http.client
import logging

from exchange_broker.management.peer_http import peer_request

log = logging.getLogger("exchange_broker.management")

LOCAL = "x-exchange-broker-movers-local"
TIMEOUT = 3.0


def node_name(ctx, default: str) -> str:
    """This node's name in a cluster, else ``default``."""
    return getattr(ctx.cluster, "name", "") or default


def _others_wanted(ctx, request) -> bool:
    return getattr(ctx.cluster, "mode", "") == "leaders" and request.headers.get(LOCAL) is None


async def _other_nodes(ctx) -> list[tuple[str, str]]:
    """``(name, admin address)`` of every other live node with an admin API."""
    try:
        nodes = await ctx.cluster.nodes()
    except Exception as exc:  # noqa: BLE001 - the database away: this node's own movers only
        log.warning("movers listing: the cluster's nodes could not be read: %s", exc)
        return []
    me = ctx.cluster.name
    return [(n["name"], n["admin_address"]) for n in nodes
            if n.get("alive") and n.get("name") != me and n.get("admin_address")]


async def others(ctx, request, path: str) -> list[dict]:
    """The rows ``path`` lists on every other live node (none outside such a cluster)."""
    if not _others_wanted(ctx, request):
        return []
    loop = asyncio.get_running_loop()
    auth = request.headers.get("authorization")

    async def one(name: str, address: str) -> list[dict]:
        try:
            status, rows = await loop.run_in_executor(None, _request, "GET", address, path, auth)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.info("movers listing: node '%s' did not answer: %s", name, exc)
            return []
        if status != 200 or not isinstance(rows, list):
            return []
        return [dict(r, node=r.get("node") or name) for r in rows if isinstance(r, dict)]

    answers = await asyncio.gather(*(one(n, a) for n, a in await _other_nodes(ctx)))
    return [row for rows in answers for row in rows]


async def elsewhere(ctx, request, method: str, path: str) -> tuple[int, object] | None:
    """``method path`` on the first other live node that answers it with something but a 404
    (the node that runs the mover): ``(status, body)``, or None when none does."""
    if not _others_wanted(ctx, request):
        return None
    loop = asyncio.get_running_loop()
    auth = request.headers.get("authorization")
    for name, address in await _other_nodes(ctx):
        try:
            status, body = await loop.run_in_executor(None, _request, method, address, path, auth)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            log.info("movers: node '%s' did not answer: %s", name, exc)
            continue
        if status != 404:
            if isinstance(body, dict) and status == 200:
                body.setdefault("node", name)
            return status, body
    return None


def _request(method: str, address: str, path: str, auth: str | None) -> tuple[int, object]:
    return peer_request(method, address, path, auth, LOCAL, TIMEOUT)
