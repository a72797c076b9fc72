"""Client connections, their channels and consumers: /api/connections, /api/channels,
/api/consumers and the per-vhost listings. Read from ``broker.sessions`` and the queues.

A connection's name is RabbitMQ's "peer -> listener" form when the AMQP listener is known;
a channel is "<connection name> (<number>)".
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from exchange_broker.management.common import (NODE, AdminContext, Principal, not_authorised, not_found,
                                                visible_vhosts)
from exchange_broker.management.fields import to_json
from exchange_broker.management.web import Ctx, Who, listing, no_content, u
from exchange_broker.protocol.constants import CONNECTION_FORCED

router = APIRouter()


# ---- connections -------------------------------------------------------------------------------
def sessions(ctx: AdminContext, who: Principal | None) -> list:
    """Open (past connection.open) connections ``who`` may see: all, or only its own."""
    out = [s for s in list(ctx.broker.sessions) if s.vhost is not None]
    if who is not None and not who.sees_all:
        out = [s for s in out if s.user == who.name]
    return out


def conn_name(ctx: AdminContext, sess) -> str:
    peer = sess.peer or ("", 0)
    if hasattr(sess, "admin_info"):  # another protocol's connection (MQTT): its own listener
        return f"{peer[0]}:{peer[1]} -> {sess.listener_name}"
    listener = ctx.amqp_server
    if listener is not None:
        return f"{peer[0]}:{peer[1]} -> {listener.host}:{listener.port}"
    return sess.name


def _conn_state(sess, state: str) -> str:
    """running; blocked (publishers held by a resource alarm); flow (reading paused); or closing."""
    if state != "opened":
        return state
    if getattr(sess, "blocked", False):
        return "blocked"
    return "running" if getattr(sess, "reading", True) else "flow"


def conn_info(ctx: AdminContext, sess) -> dict:
    if hasattr(sess, "admin_info"):  # an MQTT connection describes itself (no AMQP channels)
        return {"node": NODE, "type": "network", **sess.admin_info()}
    conn = sess.conn
    peer = sess.peer or ("", 0)
    listener = ctx.amqp_server
    cp = to_json(getattr(sess, "client_properties", None) or {})
    if not isinstance(cp, dict):
        cp = {}
    state = conn.state
    info = {
        "name": conn_name(ctx, sess), "node": NODE, "type": "network", "protocol": "AMQP 0-8" if conn.amqp_0_8 else "AMQP 0-9-1",
        "vhost": sess.vhost.name if sess.vhost is not None else None, "user": sess.user,
        "user_who_performed_action": sess.user,
        "host": listener.host if listener is not None else None,
        "port": listener.port if listener is not None else None,
        "peer_host": peer[0], "peer_port": peer[1],
        "state": _conn_state(sess, state),
        "channels": len(sess.channels), "channel_max": conn.channel_max, "frame_max": conn.frame_max,
        "timeout": conn.heartbeat, "client_properties": cp,
        "user_provided_name": cp.get("connection_name"), "auth_mechanism": "PLAIN", "ssl": False,
    }
    connected_at = getattr(sess, "connected_at", None)
    if connected_at is not None:
        info["connected_at"] = connected_at
    return info


def list_connections(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    if vhost is not None:
        visible_vhosts(ctx.broker, vhost, who)
    return [conn_info(ctx, s) for s in sessions(ctx, who) if vhost is None or s.vhost.name == vhost]


def find_session(ctx: AdminContext, name: str, who: Principal | None):
    for s in sessions(ctx, who):
        if conn_name(ctx, s) == name or s.name == name:
            return s
    raise not_found()


def close_connection(ctx: AdminContext, name: str, reason: str | None = None,
                     who: Principal | None = None) -> None:
    sess = find_session(ctx, name, who)
    if who is not None and not who.is_admin and sess.user != who.name:
        raise not_authorised()
    sess.server_close(CONNECTION_FORCED, reason or "Closed via management plugin")


# ---- channels ----------------------------------------------------------------------------------
def channel_info(ctx: AdminContext, sess, ch) -> dict:
    cname = conn_name(ctx, sess)
    peer = sess.peer or ("", 0)
    return {
        "name": f"{cname} ({ch.number})", "number": ch.number, "node": NODE,
        "vhost": sess.vhost.name if sess.vhost is not None else None, "user": sess.user,
        "user_who_performed_action": sess.user,
        "connection_details": {"name": cname, "peer_host": peer[0], "peer_port": peer[1]},
        "state": "running", "consumer_count": len(ch.consumers),
        "messages_unacknowledged": len(ch.unacked), "messages_unconfirmed": ch.unconfirmed_count(),
        "messages_uncommitted": len(ch.tx_publishes), "acks_uncommitted": len(ch.tx_acks),
        "prefetch_count": ch.prefetch, "global_prefetch_count": ch.global_prefetch,
        "confirm": ch.confirm, "transactional": ch.tx,
        "message_stats": ctx.rates.channel_stats(ch),  # publish, deliver, ack with their rates
    }


def list_channels(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    if vhost is not None:
        visible_vhosts(ctx.broker, vhost, who)
    return [channel_info(ctx, s, ch) for s in sessions(ctx, who)
            if vhost is None or s.vhost.name == vhost for ch in list(s.channels.values())]


def get_channel(ctx: AdminContext, name: str, who: Principal | None = None) -> dict:
    for s in sessions(ctx, who):
        for ch in list(s.channels.values()):
            if f"{conn_name(ctx, s)} ({ch.number})" == name:
                return channel_info(ctx, s, ch)
    raise not_found()


# ---- consumers ---------------------------------------------------------------------------------
def consumer_info(ctx: AdminContext, c) -> dict:
    ch = c.channel
    sess = ch.session if ch is not None else c.session  # None: an MQTT subscription (no channel)
    number = ch.number if ch is not None else 0
    cname = conn_name(ctx, sess)
    peer = sess.peer or ("", 0)
    return {
        "consumer_tag": c.tag, "exclusive": c.exclusive, "ack_required": not c.no_ack,
        "prefetch_count": c.prefetch, "arguments": to_json(c.arguments), "active": bool(c.active),
        "activity_status": "up" if c.active else "waiting",
        "queue": {"name": c.queue.name, "vhost": c.queue.vhost},
        "channel_details": {"name": f"{cname} ({number})", "number": number,
                            "connection_name": cname, "node": NODE, "peer_host": peer[0],
                            "peer_port": peer[1], "user": sess.user},
    }


def list_consumers(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    return [consumer_info(ctx, c) for vh in visible_vhosts(ctx.broker, vhost, who)
            for q in vh.queues.values() for c in list(q.consumers)]


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/vhosts/{vhost}/connections", tags=["connections"])
async def vhost_connections(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_connections(ctx, u(vhost), who), sort=("name",))


@router.get("/api/vhosts/{vhost}/channels", tags=["channels"])
async def vhost_channels(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_channels(ctx, u(vhost), who), sort=("name",))


@router.get("/api/connections", tags=["connections"])
async def connections(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_connections(ctx, None, who), sort=("name",))


@router.get("/api/connections/{name}", tags=["connections"])
async def connection_get(name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return conn_info(ctx, find_session(ctx, u(name), who))


@router.delete("/api/connections/{name}", tags=["connections"], status_code=204,
               summary="Close a client connection (reason in the X-Reason header)")
async def connection_delete(name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    close_connection(ctx, u(name), request.headers.get("x-reason"), who)
    return no_content()


@router.get("/api/connections/{name}/channels", tags=["channels"])
async def connection_channels(name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    sess = find_session(ctx, u(name), who)
    return [channel_info(ctx, sess, ch) for ch in list(sess.channels.values())]


@router.get("/api/channels", tags=["channels"])
async def channels(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_channels(ctx, None, who), sort=("name",))


@router.get("/api/channels/{name}", tags=["channels"])
async def channel_get(name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_channel(ctx, u(name), who)


@router.get("/api/consumers", tags=["consumers"])
async def consumers(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_consumers(ctx, None, who), sort=(), paginate=False)


@router.get("/api/consumers/{vhost}", tags=["consumers"])
async def consumers_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_consumers(ctx, u(vhost), who), sort=(), paginate=False)
