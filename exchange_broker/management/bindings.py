"""Bindings: /api/bindings, exchange-to-queue (``q``) and exchange-to-exchange (``e``) bindings,
and the bindings of one exchange (as source or destination) or one queue.

A binding is named by RabbitMQ's ``properties_key``: the quoted routing key, and a hash of the
arguments when there are any. The default exchange's implicit bindings are listed, never changed.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from exchange_broker.management.common import (AdminContext, Principal, check_binding, exchange_name,
                                                find_exchange, find_queue, find_vhost, from_amqp,
                                                not_authorised, not_found, visible_vhosts)
from exchange_broker.management.fields import arguments_from, str_from, to_json
from exchange_broker.management.web import Ctx, Who, body_doc, json_object, listing, no_content, u
from exchange_broker.protocol.errors import AMQPError

router = APIRouter(tags=["bindings"])


class BindingBody(BaseModel):
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


# ---- service -----------------------------------------------------------------------------------
def props_key(routing_key: str, arguments: dict) -> str:
    """RabbitMQ's binding ``properties_key``: the quoted routing key, ``~`` and an arguments hash."""
    if not arguments:
        return "~" if routing_key == "" else quote(routing_key, safe="")
    canonical = json.dumps(to_json(arguments), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()[:4]
    return f"{quote(routing_key, safe='')}~{base64.urlsafe_b64encode(digest).decode().rstrip('=')}"


def bindings_of(vh) -> list[dict]:
    out = []
    for q in vh.queues.values():  # the default exchange's implicit bindings
        out.append({"source": "", "vhost": vh.name, "destination": q.name, "destination_type": "queue",
                    "routing_key": q.name, "arguments": {}, "properties_key": props_key(q.name, {})})
    for source, dtype, dest, rk, args in vh.bindings():
        out.append({"source": source, "vhost": vh.name, "destination": dest, "destination_type": dtype,
                    "routing_key": rk, "arguments": to_json(args), "properties_key": props_key(rk, args)})
    return out


def list_bindings(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    return [b for vh in visible_vhosts(ctx.broker, vhost, who) for b in bindings_of(vh)]


def bindings_for(ctx: AdminContext, vhost: str, *, source: str | None = None, dest_type: str | None = None,
                 dest: str | None = None, who: Principal | None = None) -> list[dict]:
    """The bindings of a vhost from ``source`` and/or to ``dest`` (404 if either does not exist)."""
    broker = ctx.broker
    vh = visible_vhosts(broker, vhost, who)[0]
    if source is not None:
        find_exchange(broker, vhost, source)
        source = exchange_name(source)
    if dest is not None:
        if dest_type == "queue":
            find_queue(broker, vhost, dest)
        else:
            find_exchange(broker, vhost, dest)
            dest = exchange_name(dest)
    return [b for b in bindings_of(vh)
            if (source is None or b["source"] == source)
            and (dest is None or (b["destination"] == dest and b["destination_type"] == dest_type))]


def get_binding(ctx: AdminContext, vhost: str, source: str, dest_type: str, dest: str, key: str,
                who: Principal | None = None) -> dict:
    for b in bindings_for(ctx, vhost, source=source, dest_type=dest_type, dest=dest, who=who):
        if b["properties_key"] == key:
            return b
    raise not_found()


def bind(ctx: AdminContext, vhost: str, source: str, dest_type: str, dest: str, body: dict,
         who: Principal | None = None) -> str:
    """POST /api/bindings/...: returns the new binding's properties_key."""
    vh = find_vhost(ctx.broker, vhost)
    check_binding(ctx.broker, who, vhost, source, dest_type, dest)
    source = exchange_name(source)
    if source not in vh.exchanges:
        raise not_found(f"no {vh.describe('exchange', source)}")
    owner = None
    if dest_type == "queue":
        q = vh.queues.get(dest)
        if q is None:
            raise not_found(f"no {vh.describe('queue', dest)}")
        owner = q.exclusive_owner
    else:
        dest = exchange_name(dest)
        if dest not in vh.exchanges:
            raise not_found(f"no {vh.describe('exchange', dest)}")
    rk = str_from(body, "routing_key", "")
    args = arguments_from(body.get("arguments"))
    try:
        vh.bind(source, dest_type, dest, rk, args, 0, 0, owner)
    except AMQPError as err:
        raise from_amqp(err) from None
    return props_key(rk, args)


def unbind(ctx: AdminContext, vhost: str, source: str, dest_type: str, dest: str, key: str,
           who: Principal | None = None, raw_key: str | None = None) -> None:
    vh = find_vhost(ctx.broker, vhost)
    check_binding(ctx.broker, who, vhost, source, dest_type, dest)
    matches = bindings_for(ctx, vhost, source=source, dest_type=dest_type, dest=dest)
    found = next((b for b in matches if b["properties_key"] == key), None)
    if found is None:  # a client that sent the routing key itself, unquoted (pyrabbit2 does)
        found = next((b for b in matches if b["properties_key"] == raw_key
                      or (not b["arguments"] and b["routing_key"] == key)), None)
    if found is None:
        raise not_found()
    src = exchange_name(source)
    dst = dest if dest_type == "queue" else exchange_name(dest)
    # find the stored arguments (not their JSON form) to remove exactly that binding
    for s, dt, d, rk, args in vh.bindings():
        if s == src and dt == dest_type and d == dst and props_key(rk, args) == found["properties_key"]:
            owner = None
            if dest_type == "queue":
                q = vh.queues.get(dst)
                owner = q.exclusive_owner if q is not None else None
            try:
                vh.unbind(src, dest_type, dst, rk, args, 0, 0, owner)
            except AMQPError as err:
                raise from_amqp(err) from None
            return
    raise not_authorised("operation not permitted on the default exchange")


# ---- routes ------------------------------------------------------------------------------------
def _unpaged(request: Request, items: list[dict]):
    return listing(request, items, sort=(), paginate=False)


@router.get("/api/exchanges/{vhost}/{name}/bindings/source")
async def exchange_bindings_source(vhost: str, name: str, request: Request, who: Principal = Who,
                                   ctx: AdminContext = Ctx):
    return _unpaged(request, bindings_for(ctx, u(vhost), source=u(name), who=who))


@router.get("/api/exchanges/{vhost}/{name}/bindings/destination")
async def exchange_bindings_destination(vhost: str, name: str, request: Request, who: Principal = Who,
                                        ctx: AdminContext = Ctx):
    return _unpaged(request, bindings_for(ctx, u(vhost), dest_type="exchange", dest=u(name), who=who))


@router.get("/api/queues/{vhost}/{name}/bindings")
async def queue_bindings(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return _unpaged(request, bindings_for(ctx, u(vhost), dest_type="queue", dest=u(name), who=who))


@router.get("/api/bindings")
async def bindings(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return _unpaged(request, list_bindings(ctx, None, who))


@router.get("/api/bindings/{vhost}")
async def bindings_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return _unpaged(request, list_bindings(ctx, u(vhost), who))


def _between(kind: str) -> None:
    """The four routes of exchange-to-queue (``q``) or exchange-to-exchange (``e``) bindings."""
    dtype = "queue" if kind == "q" else "exchange"
    base = f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}"

    async def list_between(vhost: str, source: str, dest: str, request: Request, who: Principal = Who,
                           ctx: AdminContext = Ctx):
        return _unpaged(request, bindings_for(ctx, u(vhost), source=u(source), dest_type=dtype, dest=u(dest),
                                              who=who))

    async def create(vhost: str, source: str, dest: str, request: Request, who: Principal = Who,
                     ctx: AdminContext = Ctx):
        key = bind(ctx, u(vhost), u(source), dtype, u(dest), await json_object(request), who)
        # Location is relative to this URL, the key quoted once more as RabbitMQ does
        return Response(status_code=201, headers={"Location": f"{quote(u(dest), safe='')}/"
                                                              f"{quote(key, safe='~')}"})

    async def get_one(vhost: str, source: str, dest: str, props: str, who: Principal = Who,
                      ctx: AdminContext = Ctx):
        return get_binding(ctx, u(vhost), u(source), dtype, u(dest), u(props), who)

    async def delete_one(vhost: str, source: str, dest: str, props: str, who: Principal = Who,
                         ctx: AdminContext = Ctx):
        unbind(ctx, u(vhost), u(source), dtype, u(dest), u(props), who, raw_key=props)
        return no_content()

    router.add_api_route(base, list_between, methods=["GET"], summary=f"Bindings from an exchange to a {dtype}")
    router.add_api_route(base, create, methods=["POST"], status_code=201, openapi_extra=body_doc(BindingBody),
                         summary=f"Bind an exchange to a {dtype} (answers Location with the properties_key)")
    router.add_api_route(base + "/{props}", get_one, methods=["GET"],
                         summary=f"One exchange-to-{dtype} binding by properties_key")
    router.add_api_route(base + "/{props}", delete_one, methods=["DELETE"], status_code=204,
                         summary=f"Delete one exchange-to-{dtype} binding by properties_key")


_between("q")
_between("e")
