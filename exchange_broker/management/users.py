"""Users: /api/users (list, get, create or update, delete). Administrators only.

A user's permissions are in permissions.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from exchange_broker.core.auth import HASHING_SHA256
from exchange_broker.management.common import AdminContext, Principal, bad_request, check_admin, not_found
from exchange_broker.management.fields import str_from, tags_from
from exchange_broker.management.web import Ctx, Who, body_doc, created, json_object, listing, no_content, u

router = APIRouter(tags=["users"])


class UserBody(BaseModel):
    password: str | None = None
    password_hash: str | None = None
    hashing_algorithm: str | None = None
    tags: str | list[str] = ""


# ---- service -----------------------------------------------------------------------------------
def user_info(user, limits: dict | None = None) -> dict:
    """A user as RabbitMQ shows it; ``limits``: its user limits (broker.user_limits)."""
    return {"name": user.name, "password_hash": user.password_hash,
            "hashing_algorithm": user.hashing_algorithm, "tags": list(user.tags), "limits": dict(limits or {})}


def list_users(ctx: AdminContext, who: Principal | None = None) -> list[dict]:
    check_admin(who)
    return [user_info(user, ctx.broker.user_limits.get(user.name)) for user in ctx.broker.users.values()]


def get_user(ctx: AdminContext, name: str, who: Principal | None = None) -> dict:
    check_admin(who)
    user = ctx.broker.users.get(name)
    if user is None:
        raise not_found()
    return user_info(user, ctx.broker.user_limits.get(name))


def put_user(ctx: AdminContext, name: str, body: dict, who: Principal | None = None) -> bool:
    """Create (True) or update (False): a password, a password hash, or (existing user) only tags."""
    check_admin(who)
    if not name:
        raise bad_request("user name must not be empty")
    broker = ctx.broker
    tags = tags_from(body.get("tags", []))
    was_created = name not in broker.users
    if body.get("password") is not None:
        broker.add_user(name, str_from(body, "password"), tags)
    elif body.get("password_hash") is not None:
        algo = str_from(body, "hashing_algorithm", HASHING_SHA256)
        broker.add_user(name, None, tags, password_hash=str_from(body, "password_hash"),
                        hashing_algorithm=algo)
    elif not was_created:
        broker.set_user_tags(name, tags)
    else:
        raise bad_request("password or password_hash is required")
    return was_created


def delete_user(ctx: AdminContext, name: str, who: Principal | None = None) -> None:
    check_admin(who)
    if not ctx.broker.delete_user(name):  # its connections get 320; the deletion is stored
        raise not_found()


# ---- routes ------------------------------------------------------------------------------------
@router.get("/api/users")
async def users(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return listing(request, list_users(ctx, who), sort=("name",), paginate=False)


@router.get("/api/users/{user}")
async def user_get(user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    return get_user(ctx, u(user), who)


@router.put("/api/users/{user}", openapi_extra=body_doc(UserBody))
async def user_put(user: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return created(put_user(ctx, u(user), await json_object(request), who))


@router.delete("/api/users/{user}", status_code=204)
async def user_delete(user: str, who: Principal = Who, ctx: AdminContext = Ctx):
    delete_user(ctx, u(user), who)
    return no_content()
