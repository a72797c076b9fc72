"""Runtime parameters of the movers: /api/parameters[/{component}[/{vhost}[/{name}]]].

The components this broker runs (``shovel``): values are checked with RabbitMQ's rules and
texts (400 ``Validation failed ...``), stored, and put to work at once (movers/parameters.py).
Reading and changing them needs ``administrator``, or ``policymaker`` with access to the vhost,
as RabbitMQ. Definitions export/import carry them in ``parameters`` (export_parameters /
plan_parameters / apply_parameters below).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from exchange_broker.management.common import (AdminContext, Principal, ServiceError, bad_request,
                                                find_vhost, not_authorised, not_found)
from exchange_broker.management.policies import stored
from exchange_broker.management.web import Ctx, Who, created, json_object, listing, no_content, u
from exchange_broker.movers.parameters import COMPONENTS, UnknownComponent
from exchange_broker.movers.validation import ParameterError, erl

router = APIRouter(tags=["parameters"])


# ---- service -----------------------------------------------------------------------------------
def movers(ctx: AdminContext):
    if ctx.movers is None:
        raise ServiceError(503, "not_available", "shovels and runtime parameters are not running here")
    return ctx.movers


def _may(who: Principal | None, vhost: str | None) -> None:
    if who is None or who.is_admin:
        return
    if "policymaker" not in who.tags or (vhost is not None and vhost not in who.vhosts):
        raise not_authorised("User not authorised to access object")


def list_parameters(ctx: AdminContext, component: str | None, vhost: str | None,
                    who: Principal | None = None) -> list[dict]:
    if who is not None and not who.is_admin and "policymaker" not in who.tags:
        raise not_authorised("User not authorised to access object")
    if vhost is not None:
        find_vhost(ctx.broker, vhost)
        _may(who, vhost)
    return [p for p in movers(ctx).list(component, vhost) if who is None or who.can_see(p["vhost"])]


def get_parameter(ctx: AdminContext, component: str, vhost: str, name: str, who=None) -> dict:
    _may(who, vhost)
    params = movers(ctx)
    if (component, vhost, name) not in params.values:
        raise not_found()
    return params.item((component, vhost, name))


def put_parameter(ctx: AdminContext, component: str, vhost: str, name: str, body: dict, who=None) -> bool:
    _may(who, vhost)
    params = movers(ctx)
    if vhost not in ctx.broker.vhosts:
        raise ServiceError(404, "not_found", "vhost_not_found")
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    try:
        return params.put(component, vhost, name, body["value"])
    except UnknownComponent:
        raise bad_request(f"Validation failed\n\ncomponent {erl(component)} not found\n") from None
    except ParameterError as err:
        raise bad_request(err.reason) from None


def delete_parameter(ctx: AdminContext, component: str, vhost: str, name: str, who=None) -> None:
    _may(who, vhost)
    if not movers(ctx).delete(component, vhost, name):
        raise not_found()


# ---- definitions (export / import; called by definitions.py) ----------------------------------
def export_parameters(ctx: AdminContext, vhosts) -> list[dict]:
    if ctx.movers is None:
        return []
    names = {vh.name for vh in vhosts}
    return [p for p in ctx.movers.list() if p["vhost"] in names]


def plan_parameters(ctx: AdminContext, items: list[dict], vhost: str | None) -> list[tuple]:
    """The movers' items of a definitions ``parameters`` list, checked (400 naming the first
    refused one): ``(component, vhost, name, value)``."""
    out = []
    for item in items:
        component = item.get("component")
        if component not in COMPONENTS:
            continue  # policies and limits: their own modules
        where = vhost if vhost is not None else item.get("vhost")
        name = item.get("name")
        if not isinstance(where, str) or not isinstance(name, str) or not name:
            raise bad_request(f"definitions: a {component} parameter needs a 'vhost' and a 'name'")
        try:
            movers(ctx).check(component, name, item.get("value"))
        except ParameterError as err:
            raise bad_request(f"{err} ({where}/{component}/{name})") from None
        out.append((component, where, name, item.get("value")))
    return out


def apply_parameters(ctx: AdminContext, planned: list[tuple]) -> None:
    for component, vhost, name, value in planned:
        movers(ctx).put(component, vhost, name, value)


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/parameters", summary="Every runtime parameter of the shovels")
async def all_(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_parameters(ctx, None, None, who))


@router.get("/api/parameters/{component}", summary="The parameters of a component")
async def of_component(component: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_parameters(ctx, u(component), None, who))


@router.get("/api/parameters/{component}/{vhost}", summary="A component's parameters in a vhost")
async def of_vhost(component: str, vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_parameters(ctx, u(component), u(vhost), who))


@router.get("/api/parameters/{component}/{vhost}/{name}", summary="One runtime parameter")
async def one(component: str, vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_parameter(ctx, u(component), u(vhost), u(name), who)


@router.put("/api/parameters/{component}/{vhost}/{name}",
            summary='Set a runtime parameter ({"value": ...}; 201 created, 204 replaced); started at once')
async def put(component: str, vhost: str, name: str, request: Request, who: Principal = Who,
              ctx: AdminContext = Ctx):
    was_created = put_parameter(ctx, u(component), u(vhost), u(name), await json_object(request), who)
    await stored(ctx)
    return created(was_created)


@router.delete("/api/parameters/{component}/{vhost}/{name}", status_code=204,
               summary="Clear a runtime parameter (a shovel stops)")
async def delete(component: str, vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    delete_parameter(ctx, u(component), u(vhost), u(name), who)
    await stored(ctx)
    return no_content()
