"""A queue's real figures on every node of a cluster with per-queue leaders.

A node that does not lead a queue holds a placeholder for it (``cluster/remote.py``) that knows
nothing of the queue's messages. ``/api/queues[/{vhost}[/{name}]]`` on such a node asks the
leader's own admin API for them: one ``GET`` per (leader node, vhost), on an executor thread,
with the caller's own ``Authorization`` header (the users are the cluster's, so the leader applies
the same rules) and :data:`LOCAL` set so the leader answers with what it holds itself and asks no
one in turn. A leader that does not answer within :data:`TIMEOUT` seconds (or whose admin API is
off) leaves the figures ``null`` with ``"figures": "unknown"`` and the reason, never ``0``.

Every queue's row also names its leader (``leader``, ``node``) and the nodes that serve it
(``members``: every live node of the cluster), as RabbitMQ shows for quorum queues.
"""

from __future__ import annotations

import asyncio
import http.client
from urllib.parse import quote

from exchange_broker.core.queue import HELD_HERE
from exchange_broker.management.peer_http import peer_request

LOCAL = "x-exchange-broker-leader-figures"  # set on the requests a node sends to a queue's leader
TIMEOUT = 3.0
FIGURES = ("messages", "messages_ready", "messages_unacknowledged", "messages_details",
           "messages_ready_details", "messages_unacknowledged_details", "message_bytes", "message_bytes_ready",
           "message_bytes_unacknowledged", "consumers", "consumer_capacity", "consumer_utilisation",
           "exclusive_consumer_tag", "message_stats", "state")
COUNTS = ("messages", "messages_ready", "messages_unacknowledged", "message_bytes", "message_bytes_ready",
          "message_bytes_unacknowledged", "consumers")


def wanted(ctx, request) -> bool:
    return getattr(ctx.cluster, "mode", "") == "leaders" and request.headers.get(LOCAL) is None


async def fill(ctx, request, infos: list[dict], queues: list) -> None:
    """``infos[i]`` describes ``queues[i]``: names the leader of each, and puts the leader's figures
    into the rows of queues this node does not lead."""
    cluster = ctx.cluster
    if getattr(cluster, "mode", "") != "leaders":
        return
    members = sorted(getattr(cluster, "members", {}) or {cluster.name: ""})
    for info, q in zip(infos, queues):
        leader = cluster.name if HELD_HERE in q.capabilities() else (q.leader or "")
        info["leader"] = info["node"] = leader or "unknown"
        info["members"] = members
    if request.headers.get(LOCAL) is not None:
        return
    remote = [(info, q) for info, q in zip(infos, queues) if HELD_HERE not in q.capabilities()]
    if not remote:
        return
    try:
        admin = {n["name"]: n.get("admin_address") or "" for n in await cluster.nodes() if n.get("alive")}
    except Exception as exc:  # the database away: the figures are unknown, the listing still answers
        admin, failure = {}, f"the cluster's nodes could not be read: {' '.join(str(exc).split())[:200]}"
    else:
        failure = ""
    groups: dict[tuple[str, str], list[dict]] = {}
    for info, q in remote:
        groups.setdefault((info["leader"], q.vhost), []).append(info)
    auth = request.headers.get("authorization")
    single = len(remote) == 1 and len(infos) == 1
    loop = asyncio.get_running_loop()

    async def one(leader: str, vhost: str, rows: list[dict]) -> None:
        address = admin.get(leader, "")
        if not address:
            _unknown(rows, failure or f"node '{leader}' is not a live node with an admin API")
            return
        path = f"/api/queues/{quote(vhost, safe='')}"
        if single:
            path += f"/{quote(rows[0]['name'], safe='')}"
        try:
            answer = await loop.run_in_executor(None, _get, address, path, auth)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            _unknown(rows, f"node '{leader}' did not answer: {' '.join(str(exc).split()) or type(exc).__name__}")
            return
        theirs = {a.get("name"): a for a in (answer if isinstance(answer, list) else [answer])
                  if isinstance(a, dict)}
        for info in rows:
            got = theirs.get(info["name"])
            if got is None or got.get("leader") not in (None, leader):
                _unknown([info], f"node '{leader}' does not lead it (any more)")
                continue
            for key in FIGURES:
                if key in got:
                    info[key] = got[key]
            info.pop("figures", None)
    await asyncio.gather(*(one(leader, vhost, rows) for (leader, vhost), rows in groups.items()))


def _unknown(rows: list[dict], why: str) -> None:
    for info in rows:
        for key in COUNTS:
            info[key] = None
        info["figures"] = "unknown"
        info["figures_reason"] = why


def _get(address: str, path: str, auth: str | None):
    status, body = peer_request("GET", address, path, auth, LOCAL, TIMEOUT)
    if status != 200:
        raise ValueError(f"HTTP {status} from {address}{path}")
    return body
