"""Topic permissions: /api/topic-permissions (administrators only), the per-vhost and per-user
listings, and their part of the definitions document (``topic_permissions``).

A topic permission is (user, vhost, exchange) -> ``write`` and ``read`` regular expressions on
routing keys; core/permissions.py applies them (publish and bind on topic exchanges). Answers as
RabbitMQ 3.10's management API gives them (compared by hand): PUT is 201 when the user had no
topic permission in the vhost, else 204; GET of ``/{vhost}/{user}`` (and ``/{vhost}/{user}/{exchange}``)
lists all of the user's in the vhost, 404 when there is none; DELETE of ``/{vhost}/{user}`` removes
them all, of ``/{vhost}/{user}/{exchange}`` one.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from exchange_broker.core import permissions as perms
from exchange_broker.management.common import (AdminContext, Principal, bad_request, check_admin, not_found,
                                               visible_vhosts)
from exchange_broker.management.web import Ctx, Who, body_doc, created, json_object, listing, no_content, u

router = APIRouter(tags=["permissions"])


class TopicPermissionBody(BaseModel):
    exchange: str
    write: str
    read: str


# ---- service -----------------------------------------------------------------------------------
def list_topic_permissions(ctx: AdminContext, who: Principal | None = None, *, user: str | None = None,
                           vhost: str | None = None) -> list[dict]:
    check_admin(who)
    return [{"user": u_, "vhost": v, "exchange": x, "write": w, "read": r}
            for (u_, v), entries in ctx.broker.topic_permissions.items()
            if (user is None or u_ == user) and (vhost is None or v == vhost)
            for x, (w, r) in entries.items()]


def check_pattern(pattern: str) -> str | None:
    """An error when the pattern (with its variables standing for names) is not a valid regex."""
    return perms.validate(pattern.replace("{username}", "u").replace("{vhost}", "v"))


def topic_permission_body(body: dict) -> tuple[str, str, str]:
    """(exchange, write, read) of a PUT body or a definitions item (400 with RabbitMQ's texts)."""
    missing = [key for key in ("exchange", "write", "read") if key not in body]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    values = []
    for key in ("exchange", "write", "read"):
        value = body[key]
        if not isinstance(value, str):
            raise bad_request(f"{key} must be a string")
        if key != "exchange":
            error = check_pattern(value)
            if error is not None:
                raise bad_request(["invalid_regexp", value, error])
        values.append(value)
    return values[0], values[1], values[2]


def set_topic_permission(ctx: AdminContext, vhost: str, user: str, body: dict,
                         who: Principal | None = None) -> bool:
    """Set the user's topic permission on one exchange (True: the user had none in the vhost)."""
    check_admin(who)
    broker = ctx.broker
    if user not in broker.users or vhost not in broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    exchange, write, read = topic_permission_body(body)
    return perms.set_topic_permission(broker, user, vhost, exchange, write, read)


def clear_topic_permission(ctx: AdminContext, vhost: str, user: str, exchange: str | None = None,
                           who: Principal | None = None) -> None:
    check_admin(who)
    if not perms.clear_topic_permissions(ctx.broker, user, vhost, exchange):
        raise not_found()


def get_topic_permissions(ctx: AdminContext, vhost: str, user: str, who: Principal | None = None) -> list[dict]:
    found = list_topic_permissions(ctx, who, user=user, vhost=vhost)
    if not found:
        raise not_found()
    return found


# ---- definitions (called by definitions.py) -----------------------------------------------------
def plan_topic_permissions(items: list[dict]) -> list[tuple[str, str, str, str, str]]:
    """(user, vhost, exchange, write, read) of a definitions ``topic_permissions`` list."""
    out = []
    for item in items:
        user, vhost = item.get("user"), item.get("vhost")
        if not isinstance(user, str) or not isinstance(vhost, str) or not user or not vhost:
            raise bad_request("definitions: a topic permission needs a string 'user' and 'vhost'")
        out.append((user, vhost, *topic_permission_body(item)))
    return out


def apply_topic_permissions(broker, planned: list[tuple[str, str, str, str, str]]) -> int:
    for user, vhost, *_rest in planned:
        if vhost not in broker.vhosts:
            raise bad_request(["no_such_vhost", vhost])
        if user not in broker.users:
            raise bad_request(["no_such_user", user])
    for user, vhost, exchange, write, read in planned:
        perms.set_topic_permission(broker, user, vhost, exchange, write, read)
    return len(planned)


# ---- routes ------------------------------------------------------------------------------------
_SORT = ("vhost", "user", "exchange")


@router.get("/api/topic-permissions")
async def topic_permissions(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_topic_permissions(ctx, who), sort=_SORT)


@router.get("/api/topic-permissions/{vhost}/{user}")
async def topic_permission_get(vhost: str, user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_topic_permissions(ctx, u(vhost), u(user), who)


@router.get("/api/topic-permissions/{vhost}/{user}/{exchange}")
async def topic_permission_get_exchange(vhost: str, user: str, exchange: str, who: Principal = Who,
                                        ctx: AdminContext = Ctx):
    return get_topic_permissions(ctx, u(vhost), u(user), who)  # RabbitMQ: all of them, too


@router.put("/api/topic-permissions/{vhost}/{user}", openapi_extra=body_doc(TopicPermissionBody),
            summary="Set a user's topic permission on one exchange (201 the user's first in the vhost, 204)")
async def topic_permission_put(vhost: str, user: str, request: Request, who: Principal = Who,
                               ctx: AdminContext = Ctx):
    return created(set_topic_permission(ctx, u(vhost), u(user), await json_object(request), who))


@router.delete("/api/topic-permissions/{vhost}/{user}", status_code=204,
               summary="Clear all of a user's topic permissions in a vhost")
async def topic_permission_delete(vhost: str, user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    clear_topic_permission(ctx, u(vhost), u(user), None, who)
    return no_content()


@router.delete("/api/topic-permissions/{vhost}/{user}/{exchange}", status_code=204,
               summary="Clear a user's topic permission on one exchange")
async def topic_permission_delete_exchange(vhost: str, user: str, exchange: str, who: Principal = Who,
                                           ctx: AdminContext = Ctx):
    clear_topic_permission(ctx, u(vhost), u(user), u(exchange), who)
    return no_content()


@router.get("/api/vhosts/{vhost}/topic-permissions")
async def vhost_topic_permissions(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    name = u(vhost)
    visible_vhosts(ctx.broker, name, who)
    return listing(request, list_topic_permissions(ctx, who, vhost=name), sort=_SORT)


@router.get("/api/users/{user}/topic-permissions")
async def user_topic_permissions(user: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    name = u(user)
    check_admin(who)
    if name not in ctx.broker.users:
        raise not_found()
    return listing(request, list_topic_permissions(ctx, who, user=name), sort=_SORT)
