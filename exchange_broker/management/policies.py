"""Policies and operator policies: /api/policies and /api/operator-policies (list, get, set, clear).

RabbitMQ's rules: listing needs any management user (items of the vhosts the user can see);
reading, setting and clearing one policy needs ``administrator``, or ``policymaker`` with
permissions in its vhost; operator policies are for administrators only. A refused value is a
400 whose reason is RabbitMQ's ``Validation failed`` text (HTML-escaped on /api/policies, as
RabbitMQ does). Matching, precedence and applying are core/policies.py's business.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from exchange_broker.core.policies import OPERATOR_POLICY, POLICY, PolicyError, parse_policy
from exchange_broker.core.policy_defs import escape_html
from exchange_broker.management.common import (AdminContext, Principal, ServiceError, bad_request,
                                                not_authorised, not_found, visible_vhosts)
from exchange_broker.management.web import Ctx, Who, body_doc, created, json_object, listing, no_content, u

router = APIRouter(tags=["policies"])


class PolicyBody(BaseModel):
    pattern: str
    definition: dict[str, Any] = Field(default_factory=dict)
    priority: int = 0
    apply_to: str = Field("all", alias="apply-to")


# ---- service -----------------------------------------------------------------------------------
def _may_edit(ctx: AdminContext, kind: str, vhost: str, who: Principal | None) -> None:
    if who is None or who.is_admin:
        return
    if kind == OPERATOR_POLICY:
        raise not_authorised("Not administrator user")
    if "policymaker" not in who.tags or vhost not in who.vhosts:
        raise not_authorised("User not authorised to access object")


def list_policies(ctx: AdminContext, kind: str, vhost: str | None = None,
                  who: Principal | None = None) -> list[dict]:
    return [p.info() for vh in visible_vhosts(ctx.broker, vhost, who) for p in vh.policies.list(kind)]


def get_policy(ctx: AdminContext, kind: str, vhost: str, name: str, who: Principal | None = None) -> dict:
    _may_edit(ctx, kind, vhost, who)
    vh = ctx.broker.vhosts.get(vhost)
    policy = vh.policies.get(kind, name) if vh is not None else None
    if policy is None:
        raise not_found()
    return policy.info()


def set_policy(ctx: AdminContext, kind: str, vhost: str, name: str, body: dict,
               who: Principal | None = None) -> bool:
    """PUT: add (True) or replace (False) a policy; it applies at once to what it matches."""
    _may_edit(ctx, kind, vhost, who)
    vh = ctx.broker.vhosts.get(vhost)
    if vh is None:
        raise ServiceError(404, "not_found", "vhost_not_found")
    missing = [key for key in ("pattern", "definition") if key not in body]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    try:
        policy = parse_policy(kind, vhost, name, body["pattern"], body["definition"], body.get("priority"),
                              body.get("apply-to"))
    except PolicyError as err:
        raise bad_request(escape_html(err.reason) if kind == POLICY else err.reason) from None
    return vh.policies.set(policy)


def clear_policy(ctx: AdminContext, kind: str, vhost: str, name: str, who: Principal | None = None) -> None:
    _may_edit(ctx, kind, vhost, who)
    vh = ctx.broker.vhosts.get(vhost)
    if vh is None or not vh.policies.clear(kind, name):
        raise not_found()


async def stored(ctx: AdminContext) -> None:
    """Answer once the change is in the store (as RabbitMQ answers once it is in its database):
    a policy that got its 201 / 204 survives a crash right after."""
    pending = ctx.broker.durability.pending_definition
    if pending is None or pending.done:
        if pending is not None and not pending.ok:
            raise ServiceError(500, "internal_error", "the policy could not be stored")
        return
    done = asyncio.get_running_loop().create_future()
    pending.add(lambda _arg, ok: done.done() or done.set_result(ok), None)
    if not await done:
        raise ServiceError(500, "internal_error", "the policy could not be stored")


# ---- definitions (export / import; called by definitions.py) ----------------------------------
def export_policies(vhosts) -> list[dict]:
    """The ``policies`` of a definitions export (operator policies are ``parameters``, as RabbitMQ)."""
    return [p.info() for vh in vhosts for p in vh.policies.list(POLICY)]


def export_operator_parameters(vhosts) -> list[dict]:
    """Operator policies as RabbitMQ exports them: runtime parameters of component ``operator_policy``."""
    return [{"value": p.value(), "vhost": vh.name, "component": OPERATOR_POLICY, "name": p.name}
            for vh in vhosts for p in vh.policies.list(OPERATOR_POLICY)]


def plan_policies(policies: list[dict], parameters: list[dict], vhost: str | None) -> list:
    """Every policy of a definitions document, checked (400 naming the first refused one, with
    RabbitMQ's text ``<reason> (vhost/name)``): the ``policies`` items, and the ``parameters``
    items of component ``policy`` / ``operator_policy``; other components are not ours."""
    items = [(POLICY, x, x) for x in policies]
    items += [(x.get("component"), x, x.get("value")) for x in parameters
              if x.get("component") in (POLICY, OPERATOR_POLICY)]
    out = []
    for kind, item, value in items:
        where = vhost if vhost is not None else item.get("vhost")
        if not isinstance(where, str) or not where:
            raise bad_request("definitions: a policy needs a 'vhost'")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise bad_request(f"policy in virtual host '{where}' has undefined name")
        if not isinstance(value, dict):
            value = {"definition": value}
        try:
            out.append(parse_policy(kind, where, name, value.get("pattern"), value.get("definition"),
                                    value.get("priority"), value.get("apply-to", "all")))
        except PolicyError as err:
            label = f"{where}/{name}" if item is value else f"{where}/{kind}/{name}"
            raise bad_request(escape_html(f"{err.reason} ({label})")) from None
    return out


def apply_policies(broker, planned: list) -> None:
    """Set the planned policies (before the queues are declared, as RabbitMQ imports them)."""
    for p in planned:
        broker.vhosts[p.vhost].policies.set(p, apply=False)
    for name in {p.vhost for p in planned}:
        broker.vhosts[name].policies.apply_all()


# ---- routes ------------------------------------------------------------------------------------
def _routes(prefix: str, kind: str, label: str) -> None:
    @router.get(prefix, summary=f"Every {label} (of the vhosts you can see)", name=f"{kind}_list")
    async def all_(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
        return listing(request, list_policies(ctx, kind, None, who), sort=("priority",))

    @router.get(prefix + "/{vhost}", summary=f"The {label} of a vhost", name=f"{kind}_vhost")
    async def of_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
        return listing(request, list_policies(ctx, kind, u(vhost), who), sort=("priority",))

    @router.get(prefix + "/{vhost}/{name}", name=f"{kind}_get")
    async def one(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
        return get_policy(ctx, kind, u(vhost), u(name), who)

    @router.put(prefix + "/{vhost}/{name}", openapi_extra=body_doc(PolicyBody), name=f"{kind}_put",
                summary=f"Set a {label} (201 created, 204 replaced); applied at once")
    async def put(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
        was_created = set_policy(ctx, kind, u(vhost), u(name), await json_object(request), who)
        await stored(ctx)
        return created(was_created)

    @router.delete(prefix + "/{vhost}/{name}", status_code=204, name=f"{kind}_delete",
                   summary=f"Clear a {label}")
    async def delete(vhost: str, name: str, who: Principal = Who, ctx: AdminContext = Ctx):
        clear_policy(ctx, kind, u(vhost), u(name), who)
        await stored(ctx)
        return no_content()


_routes("/api/policies", POLICY, "policy")
_routes("/api/operator-policies", OPERATOR_POLICY, "operator policy")
