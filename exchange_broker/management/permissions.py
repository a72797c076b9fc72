"""Permissions: a user's configure / write / read patterns in a vhost. Administrators only.

/api/permissions, /api/permissions/{vhost}/{user}, and the per-vhost and per-user listings.
How a pattern is applied to a resource is core/permissions.py's business.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from pydantic import BaseModel

from exchange_broker.management.common import (AdminContext, Principal, ServiceError, bad_request, check_admin,
                                                find_vhost, not_found, visible_vhosts)
from exchange_broker.management.fields import str_from
from exchange_broker.management.web import Ctx, Who, body_doc, created, json_object, no_content, u

router = APIRouter(tags=["permissions"])


class PermissionBody(BaseModel):
    configure: str
    write: str
    read: str


# ---- service -----------------------------------------------------------------------------------
def list_permissions(ctx: AdminContext, who: Principal | None = None, *, user: str | None = None,
                     vhost: str | None = None) -> list[dict]:
    check_admin(who)
    return [{"user": u_, "vhost": v, "configure": c, "write": w, "read": r}
            for (u_, v), (c, w, r) in ctx.broker.permissions.items()
            if (user is None or u_ == user) and (vhost is None or v == vhost)]


def set_permission(ctx: AdminContext, vhost: str, user: str, body: dict, who: Principal | None = None) -> bool:
    """Set a user's three patterns in a vhost (True: there were none)."""
    check_admin(who)
    broker = ctx.broker
    find_vhost(broker, vhost)
    if user not in broker.users:
        raise bad_request(["no_such_user", user])
    perms = []
    for key in ("configure", "write", "read"):
        value = str_from(body, key, required=True)
        try:
            re.compile(value)
        except re.error as exc:
            raise bad_request(f"invalid regular expression for {key}: {exc}") from None
        perms.append(value)
    was_created = (user, vhost) not in broker.permissions
    broker.set_permissions(user, vhost, *perms)
    return was_created


def clear_permission(ctx: AdminContext, vhost: str, user: str, who: Principal | None = None) -> None:
    check_admin(who)
    if not ctx.broker.clear_permissions(user, vhost):
        raise not_found()


def _known_user(ctx: AdminContext, name: str, who: Principal) -> None:
    check_admin(who)
    if name not in ctx.broker.users:
        raise not_found()


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/vhosts/{vhost}/permissions")
async def vhost_permissions(vhost: str, who: Principal = Who, ctx: AdminContext = Ctx):
    name = u(vhost)
    visible_vhosts(ctx.broker, name, who)
    return list_permissions(ctx, who, vhost=name)


@router.get("/api/users/{user}/permissions")
async def user_permissions(user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    name = u(user)
    _known_user(ctx, name, who)
    return list_permissions(ctx, who, user=name)


@router.get("/api/permissions")
async def permissions(who: Principal = Who, ctx: AdminContext = Ctx):
    return list_permissions(ctx, who)


@router.get("/api/permissions/{vhost}/{user}")
async def permission_get(vhost: str, user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    found = list_permissions(ctx, who, user=u(user), vhost=u(vhost))
    if not found:
        raise ServiceError(404, "Object Not Found", "Not Found")
    return found[0]


@router.put("/api/permissions/{vhost}/{user}", openapi_extra=body_doc(PermissionBody))
async def permission_put(vhost: str, user: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return created(set_permission(ctx, u(vhost), u(user), await json_object(request), who))


@router.delete("/api/permissions/{vhost}/{user}", status_code=204)
async def permission_delete(vhost: str, user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    clear_permission(ctx, u(vhost), u(user), who)
    return no_content()
