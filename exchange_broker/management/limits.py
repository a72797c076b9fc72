"""Vhost limits and user limits: /api/vhost-limits and /api/user-limits, and their part of the
definitions document (vhost limits are the ``vhost-limits`` runtime parameter named ``limits``,
user limits the ``limits`` object of each user, as RabbitMQ exports them).

What a limit means and where it is enforced is core/limits.py's business. Answers and error
texts as RabbitMQ 3.10's management API gives them (compared by hand); where RabbitMQ answers 500
(deleting a limit of a missing vhost or user) this answers 404.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from exchange_broker.core import limits
from exchange_broker.management.common import (AdminContext, Principal, ServiceError, bad_request, check_admin,
                                               not_found, visible_vhosts)
from exchange_broker.management.web import Ctx, Who, json_object, listing, no_content, u

router = APIRouter(tags=["limits"])


def erlang_term(value: Any) -> str:
    """A JSON value as RabbitMQ prints it in its validation messages."""
    if isinstance(value, str):
        return "<<" + json.dumps(value, ensure_ascii=False) + ">>"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False)


def limit_value(body: dict, name: str, known: tuple[str, ...], where: str, *, validation: bool) -> int:
    """The integer ``value`` of a PUT body (400 with RabbitMQ's texts otherwise)."""
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    value = body["value"]
    wrap = (lambda text: f"Validation failed\n\n{text}\n") if validation else (lambda text: text)
    if name not in known:
        raise bad_request(wrap(f"Unrecognised terms [{{<<\"{name}\">>,{erlang_term(value)}}}] in {where}"))
    if isinstance(value, bool) or not isinstance(value, int) or not limits.LIMIT_MIN <= value <= limits.LIMIT_MAX:
        raise bad_request(wrap(f"{name} should be a number, actually was {erlang_term(value)}"))
    return value


# ---- vhost limits ------------------------------------------------------------------------------
def list_vhost_limits(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> list[dict]:
    found = ctx.broker.vhost_limits
    return [{"vhost": vh.name, "value": dict(found[vh.name])}
            for vh in visible_vhosts(ctx.broker, vhost, who) if found.get(vh.name)]


def set_vhost_limit(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> None:
    check_admin(who)
    if vhost not in ctx.broker.vhosts:
        raise ServiceError(404, "not_found", "vhost_not_found")
    value = limit_value(body, name, limits.VHOST_LIMITS, "limits", validation=True)
    limits.set_vhost_limit(ctx.broker, vhost, name, value)


def clear_vhost_limit(ctx: AdminContext, vhost: str, name: str, who: Principal | None = None) -> None:
    check_admin(who)
    if vhost not in ctx.broker.vhosts:
        raise not_found()
    limits.clear_vhost_limit(ctx.broker, vhost, name)  # RabbitMQ: 204 whether it was set or not


# ---- user limits -------------------------------------------------------------------------------
def list_user_limits(ctx: AdminContext, user: str | None = None, who: Principal | None = None) -> list[dict]:
    check_admin(who)
    broker = ctx.broker
    if user is not None and user not in broker.users:
        raise not_found()
    names = [user] if user is not None else list(broker.users)
    return [{"user": name, "value": dict(broker.user_limits[name])}
            for name in names if broker.user_limits.get(name)]


def set_user_limit(ctx: AdminContext, user: str, name: str, body: dict, who: Principal | None = None) -> None:
    check_admin(who)
    if user not in ctx.broker.users:
        raise bad_request(["no_such_user", user])
    value = limit_value(body, name, limits.USER_LIMITS, "user-limits", validation=False)
    limits.set_user_limit(ctx.broker, user, name, value)


def clear_user_limit(ctx: AdminContext, user: str, name: str, who: Principal | None = None) -> None:
    check_admin(who)
    if user not in ctx.broker.users:
        raise not_found()
    limits.clear_user_limit(ctx.broker, user, name)


# ---- definitions (called by definitions.py) -----------------------------------------------------
def export_vhost_limits(broker, vhosts: list) -> list[dict]:
    """The ``vhost-limits`` runtime parameters of ``vhosts`` (RabbitMQ's ``parameters`` items; a
    per-vhost export keeps their ``vhost`` too)."""
    return [{"value": dict(broker.vhost_limits[vh.name]), "vhost": vh.name, "component": "vhost-limits",
             "name": "limits"} for vh in vhosts if broker.vhost_limits.get(vh.name)]


def user_limits_of(broker, user: str) -> dict:
    return dict(broker.user_limits.get(user) or {})


def plan_vhost_limits(parameters: list[dict], vhost: str | None) -> list[tuple[str, str, int]]:
    """(vhost, name, value) of the ``vhost-limits`` items of a definitions ``parameters`` list
    (other components are left to their owners); 400 for a malformed one."""
    out = []
    for item in parameters:
        if item.get("component") != "vhost-limits":
            continue
        v = vhost if vhost is not None else item.get("vhost")
        value = item.get("value")
        if not isinstance(v, str) or not v or not isinstance(value, dict):
            raise bad_request("definitions: a vhost-limits parameter needs a 'vhost' and an object 'value'")
        for name, n in value.items():
            out.append((v, name, limit_value({"value": n}, name, limits.VHOST_LIMITS, "limits", validation=True)))
    return out


def plan_user_limits(users: list[dict]) -> list[tuple[str, str, int]]:
    """(user, name, value) of the ``limits`` objects of a definitions ``users`` list."""
    out = []
    for item in users:
        value = item.get("limits")
        if value in (None, [], {}):
            continue
        if not isinstance(value, dict):
            raise bad_request(f"definitions: user '{item.get('name')}': limits must be an object")
        for name, n in value.items():
            out.append((item.get("name"), name,
                        limit_value({"value": n}, name, limits.USER_LIMITS, "user-limits", validation=False)))
    return out


def apply_limits(broker, vhost_limits: list[tuple[str, str, int]], user_limits: list[tuple[str, str, int]]) -> None:
    for vhost, name, value in vhost_limits:
        if vhost not in broker.vhosts:
            raise bad_request(["no_such_vhost", vhost])
        limits.set_vhost_limit(broker, vhost, name, value)
    for user, name, value in user_limits:
        if user in broker.users:
            limits.set_user_limit(broker, user, name, value)


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/vhost-limits")
async def vhost_limits_all(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_vhost_limits(ctx, None, who), sort=("vhost",))


@router.get("/api/vhost-limits/{vhost}")
async def vhost_limits_get(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_vhost_limits(ctx, u(vhost), who), sort=("vhost",))


@router.put("/api/vhost-limits/{vhost}/{name}", status_code=204,
            summary='Set a vhost limit: max-connections or max-queues, body {"value": N} (negative: none)')
async def vhost_limit_put(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    set_vhost_limit(ctx, u(vhost), u(name), await json_object(request), who)
    return no_content()


@router.delete("/api/vhost-limits/{vhost}/{name}", status_code=204)
async def vhost_limit_delete(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    clear_vhost_limit(ctx, u(vhost), u(name), who)
    return no_content()


@router.get("/api/user-limits")
async def user_limits_all(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_user_limits(ctx, None, who), sort=("user",))


@router.get("/api/user-limits/{user}")
async def user_limits_get(user: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_user_limits(ctx, u(user), who), sort=("user",))


@router.put("/api/user-limits/{user}/{name}", status_code=204,
            summary='Set a user limit: max-connections or max-channels, body {"value": N} (negative: none)')
async def user_limit_put(user: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    set_user_limit(ctx, u(user), u(name), await json_object(request), who)
    return no_content()


@router.delete("/api/user-limits/{user}/{name}", status_code=204)
async def user_limit_delete(user: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
    clear_user_limit(ctx, u(user), u(name), who)
    return no_content()
