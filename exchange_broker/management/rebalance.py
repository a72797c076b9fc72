"""POST /api/rebalance/queues (RabbitMQ's management API and ``rabbitmq-queues rebalance all``):
spread the queue leaders of a cluster with per-queue leaders evenly over its live nodes.

The moves are asked for in the store (``persistence/queue_moves.py`` via the node's
``queue_moves``); each queue's leader hands it over itself, a moment later. The answer lists the
moves asked for. Administrators only; 400 on a node that is not in such a cluster."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from exchange_broker.management.common import AdminContext, Principal, ServiceError, bad_request, not_authorised
from exchange_broker.management.web import Ctx, Who

router = APIRouter(tags=["cluster"])


@router.post("/api/rebalance/queues", summary="Spread queue leaders evenly over the cluster's live nodes")
async def rebalance_queues(who: Principal = Who, ctx: AdminContext = Ctx):
    if not who.is_admin:
        raise not_authorised()
    moves = getattr(ctx.cluster, "queue_moves", None)
    if moves is None:
        raise bad_request("queue leaders are rebalanced in a cluster with per-queue leaders "
                          "(--cluster-mode leaders) only")
    try:
        asked = await asyncio.get_running_loop().run_in_executor(None, moves.rebalance)
    except SQLAlchemyError as exc:
        raise ServiceError(503, "unavailable", f"the cluster's database: {' '.join(str(exc).split())[:300]}") \
            from None
    return {"moves": [{"vhost": v, "queue": q, "from": old, "to": new} for v, q, old, new in asked]}
