"""Exchanges: /api/exchanges (list, get, declare, delete).

Declaring and deleting go through the vhost, which carries RabbitMQ's rules and tells the
durability layer what to store. Publishing is in messages.py, an exchange's bindings in bindings.py.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from exchange_broker.management.common import (CONFIGURE, AdminContext, Principal, bad_request, check_resource,
                                                exchange_name, find_exchange, find_vhost, from_amqp, not_found,
                                                visible_vhosts)
from exchange_broker.management.fields import arguments_from, bool_from, str_from, to_json
from exchange_broker.management.samples import NO_RANGES, Ranges, Rates
from exchange_broker.management.web import (Ctx, Who, body_doc, created, flag, json_object, listing,
                                            no_content, ranges, u)
from exchange_broker.protocol.errors import AMQPError

router = APIRouter(tags=["exchanges"])


class ExchangeBody(BaseModel):
    type: str = "direct"
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


# ---- service -----------------------------------------------------------------------------------
def exchange_info(ex, rates: Rates | None = None, ranges: Ranges = NO_RANGES) -> dict:
    info = {"name": ex.name, "vhost": ex.vhost, "type": ex.type, "durable": ex.durable,
            "auto_delete": ex.auto_delete, "internal": ex.internal,
            "arguments": to_json(ex.arguments), "user_who_performed_action": "",
            "policy": None}
    if ex.stats_in or ex.stats_out:  # RabbitMQ shows message_stats once something was published
        info["message_stats"] = (rates or Rates()).exchange_stats(ex, ranges.msg_rates)
    return info


def list_exchanges(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None,
                   ranges: Ranges = NO_RANGES) -> list[dict]:
    return [exchange_info(ex, ctx.rates, ranges) for vh in visible_vhosts(ctx.broker, vhost, who)
            for ex in vh.exchanges.values()]


def get_exchange(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None,
                 ranges: Ranges = NO_RANGES) -> dict:
    visible_vhosts(ctx.broker, vhost, who)
    return exchange_info(find_exchange(ctx.broker, vhost, name), ctx.rates, ranges)


def declare_exchange(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> bool:
    """PUT: declare (created -> True, already there and equivalent -> False)."""
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, CONFIGURE, "exchange", name)
    xtype = str_from(body, "type", "direct") or "direct"
    durable = bool_from(body, "durable", False)
    auto_delete = bool_from(body, "auto_delete", False)
    internal = bool_from(body, "internal", False)
    args = arguments_from(body.get("arguments"))
    name = exchange_name(name)
    existed = name in vh.exchanges
    try:
        vh.declare_exchange(name, xtype, False, durable, auto_delete, internal, args)
    except AMQPError as err:
        if "unknown exchange type" in err.text:
            raise bad_request(f"invalid exchange type '{xtype}'") from None
        raise from_amqp(err) from None
    return not existed


def delete_exchange(ctx: AdminContext, vhost: str, name: str, if_unused: bool = False,
                    who: Principal | None = None) -> None:
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, CONFIGURE, "exchange", name)
    name = exchange_name(name)
    if name not in vh.exchanges:
        raise not_found()
    try:
        vh.delete_exchange(name, if_unused)
    except AMQPError as err:
        raise from_amqp(err) from None


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/exchanges")
async def exchanges(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_exchanges(ctx, None, who, ranges(request)))


@router.get("/api/exchanges/{vhost}")
async def exchanges_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_exchanges(ctx, u(vhost), who, ranges(request)))


@router.get("/api/exchanges/{vhost}/{name}")
async def exchange_get(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_exchange(ctx, u(vhost), u(name), who, ranges(request))


@router.put("/api/exchanges/{vhost}/{name}", openapi_extra=body_doc(ExchangeBody),
            summary="Declare an exchange (201 created, 204 already there)")
async def exchange_put(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return created(declare_exchange(ctx, u(vhost), u(name), await json_object(request), who))


@router.delete("/api/exchanges/{vhost}/{name}", status_code=204, summary="Delete an exchange (?if-unused=true)")
async def exchange_delete(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    delete_exchange(ctx, u(vhost), u(name), flag(request, "if-unused", "if_unused"), who)
    return no_content()
