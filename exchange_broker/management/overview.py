"""The broker as a whole: /api/overview, /api/nodes, /api/whoami, /api/extensions,
/api/cluster-name and /api/aliveness-test/{vhost} (RabbitMQ's publish-and-get health check)."""

from __future__ import annotations

from fastapi import APIRouter, Request

import routing
from exchange_broker import __version__
from exchange_broker.core.message import from_wire
from exchange_broker.management.common import (CLUSTER_NAME, NODE, PRODUCT, RABBIT_COMPAT_VERSION, AdminContext,
                                                Principal, visible_vhosts)
from exchange_broker.management.connections import sessions
from exchange_broker.management.nodes import node_info
from exchange_broker.management.samples import NO_RANGES, Ranges
from exchange_broker.management.stats import unacked_by_queue
from exchange_broker.management.web import Ctx, Who, ranges, u
from exchange_broker.protocol import codec
from exchange_broker.protocol.errors import AMQPError

router = APIRouter(tags=["overview"])
STANDARD_EXCHANGE_TYPES = ("direct", "fanout", "headers", "topic")


# ---- service -----------------------------------------------------------------------------------
def exchange_types(broker) -> list[str]:
    """The standard four, then the other registered types (x-delayed-message ...) by name."""
    names = set(routing.TYPES)
    return [*STANDARD_EXCHANGE_TYPES, *sorted(names - set(STANDARD_EXCHANGE_TYPES))]


def build_overview(ctx: AdminContext, who: Principal | None = None, ranges: Ranges = NO_RANGES) -> dict:
    broker = ctx.broker
    vhosts = visible_vhosts(broker, None, who)
    unacked = unacked_by_queue(broker)
    ready = unack = queues = exchanges = consumers = 0
    for vh in vhosts:
        exchanges += len(vh.exchanges)
        for q in vh.queues.values():
            queues += 1
            ready += q.message_count
            unack += unacked.get(id(q), (0, 0))[0]
            consumers += len(q.consumers)
    open_sessions = sessions(ctx, who)
    channels = sum(len(s.channels) for s in open_sessions)
    if len(vhosts) == len(broker.vhosts):
        queue_totals = ctx.rates.queue_totals(ready, unack, ranges.lengths)
    else:  # the totals sampled are the broker's: not for a user who sees only some vhosts
        zero = {"rate": 0.0}
        queue_totals = {"messages": ready + unack, "messages_details": dict(zero), "messages_ready": ready,
                        "messages_ready_details": dict(zero), "messages_unacknowledged": unack,
                        "messages_unacknowledged_details": dict(zero)}
    return {
        "management_version": RABBIT_COMPAT_VERSION,
        "rates_mode": "basic",
        "exchange_types": [{"name": t, "description": f"AMQP {t} exchange", "enabled": True}
                           for t in exchange_types(broker)],
        "product_version": __version__,
        "product_name": PRODUCT,
        "rabbitmq_version": RABBIT_COMPAT_VERSION,
        "cluster_name": CLUSTER_NAME,
        "node": NODE,
        "disable_stats": False,
        "enable_queue_totals": True,
        "message_stats": ctx.rates.message_stats(broker, ranges.msg_rates),
        "churn_rates": {},
        "queue_totals": queue_totals,
        "object_totals": {"channels": channels, "connections": len(open_sessions), "consumers": consumers,
                          "exchanges": exchanges, "queues": queues},
        "statistics_db_event_queue": 0,
        "collect_statistics_interval": int(ctx.rates.interval * 1000),  # ms, RabbitMQ's setting name
        "sample_retention_policies": {"global": [ctx.rates.history_seconds], "basic": [ctx.rates.history_seconds],
                                      "detailed": [ctx.rates.history_seconds]},
        "listeners": listeners(ctx),
        "contexts": [],
        "uptime": ctx.uptime_ms(),
    }


def listeners(ctx: AdminContext) -> list[dict]:
    """The AMQP (and AMQPS) listeners of this node, as RabbitMQ lists them."""
    out = []
    server = ctx.amqp_server
    if server is not None:
        out.append({"node": NODE, "protocol": "amqp", "ip_address": server.host, "port": server.port})
        tls_port = getattr(server, "tls_port", None)
        if tls_port:
            out.append({"node": NODE, "protocol": "amqp/ssl", "ip_address": server.host, "port": tls_port})
    return out


def list_nodes(ctx: AdminContext) -> list[dict]:
    return [node_info(ctx, listeners(ctx))]


def cluster_nodes(ctx: AdminContext, members: list[dict]) -> list[dict]:
    """With --cluster: every node of the cluster (this one with its own figures), RabbitMQ's
    ``name`` and ``running`` plus the membership fields: ``alive``, ``cluster_role``,
    ``heartbeat_at``, ``seconds_since_heartbeat``, addresses, ``queues_led`` and
    ``definitions_version`` (the definitions the node has loaded)."""
    out = []
    for m in members:
        row = node_info(ctx, listeners(ctx)) if m["name"] == ctx.cluster.name else {"type": "disc"}
        row.update({"name": m["name"], "running": m["alive"], "alive": m["alive"], "cluster_role": m["role"],
                    "amqp_address": m["amqp_address"], "admin_address": m["admin_address"],
                    "os_pid": str(m["pid"]), "host": m["host"], "incarnation": m["incarnation"],
                    "started_at": m["started_at"], "heartbeat_at": m["heartbeat_at"],
                    "seconds_since_heartbeat": m["seconds_since_heartbeat"],
                    "failover_timeout": m["failover_timeout"], "queues_led": m["queues"],
                    "definitions_version": m.get("definitions_version", 0)})
        out.append(row)
    return out


def check_aliveness(ctx: AdminContext, vhost: str, who: Principal | None = None) -> dict:
    """Declare ``aliveness-test``, publish a message to it and read it back (RabbitMQ's check)."""
    broker = ctx.broker
    vh = visible_vhosts(broker, vhost, who)[0]
    try:
        q = vh.declare_queue("aliveness-test", durable=False)
    except AMQPError as err:
        return {"status": "failed", "reason": err.text}
    raw = codec.encode_properties({})
    broker.publish(vh, vh.exchanges[""], from_wire("", q.name, raw, b"test_message"), False, None)
    got = None
    while True:
        msg = q.get()
        if msg is None:
            break
        q.settle(msg)
        got = got or (msg.body == b"test_message")
    return {"status": "ok"} if got else {"status": "failed", "reason": "message not received"}


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/overview")
async def overview(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return build_overview(ctx, who, ranges(request))


@router.get("/api/whoami")
async def whoami(who: Principal = Who):
    return {"name": who.name, "tags": who.tags}


@router.get("/api/nodes")
async def nodes(who: Principal = Who, ctx: AdminContext = Ctx):
    if ctx.cluster is not None:
        return cluster_nodes(ctx, await ctx.cluster.nodes())
    return list_nodes(ctx)


@router.get("/api/extensions")
async def extensions(who: Principal = Who):
    return []


@router.get("/api/cluster-name")
async def cluster_name(who: Principal = Who):
    return {"name": CLUSTER_NAME}


@router.get("/api/aliveness-test/{vhost}")
async def aliveness(vhost: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return check_aliveness(ctx, u(vhost), who)
