"""Definitions: export and import (merge) RabbitMQ's definitions document, for every vhost
(/api/definitions) or one (/api/definitions/{vhost}). Administrators only.

An import is checked item by item (:class:`DefinitionsPlan`) before anything is applied; items the
broker then refuses (e.g. an inequivalent redeclaration) are reported together in one 400.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from exchange_broker import __version__
from exchange_broker.core.auth import HASHING_SHA256
from exchange_broker.management.common import (PRODUCT, RABBIT_COMPAT_VERSION, AdminContext, Principal,
                                                bad_request, check_admin, find_vhost, visible_vhosts)
from exchange_broker.management import limits as limits_api
from exchange_broker.management import parameters as parameters_api
from exchange_broker.management import policies as policies_api
from exchange_broker.management import topic_permissions as topics_api
from exchange_broker.management.fields import arguments_from, bool_from, tags_from, to_json
from exchange_broker.management.users import user_info
from exchange_broker.management.vhosts import default_queue_type_of
from exchange_broker.management.web import Ctx, Who, json_body, no_content, u
from exchange_broker.protocol.errors import AMQPError

router = APIRouter(tags=["definitions"])
MAX_REPORTED_ERRORS = 20


# ---- export ------------------------------------------------------------------------------------
def export_definitions(ctx: AdminContext, vhost: str | None = None, who: Principal | None = None) -> dict:
    check_admin(who)
    broker = ctx.broker
    vhosts = visible_vhosts(broker, vhost, None)
    queues, exchanges, bindings = [], [], []
    policies = policies_api.export_policies(vhosts)
    parameters = limits_api.export_vhost_limits(broker, vhosts) + policies_api.export_operator_parameters(vhosts)
    parameters += parameters_api.export_parameters(ctx, vhosts)  # shovels
    for vh in vhosts:
        for q in vh.queues.values():
            if q.exclusive:
                continue  # they die with their connection: RabbitMQ does not export them
            queues.append({"name": q.name, "vhost": vh.name, "durable": q.durable,
                           "auto_delete": q.auto_delete, "arguments": to_json(q.arguments)})
        for ex in vh.exchanges.values():
            if ex.name == "" or ex.name.startswith("amq."):
                continue
            exchanges.append({"name": ex.name, "vhost": vh.name, "type": ex.type, "durable": ex.durable,
                              "auto_delete": ex.auto_delete, "internal": ex.internal,
                              "arguments": to_json(ex.arguments)})
        for source, dtype, dest, rk, args in vh.bindings():
            if dtype == "queue":
                q = vh.queues.get(dest)
                if q is None or q.exclusive:
                    continue
            bindings.append({"source": source, "vhost": vh.name, "destination": dest,
                             "destination_type": dtype, "routing_key": rk, "arguments": to_json(args)})
    head = {"rabbit_version": RABBIT_COMPAT_VERSION, "rabbitmq_version": RABBIT_COMPAT_VERSION,
            "product_name": PRODUCT, "product_version": __version__}
    if vhost is not None:  # RabbitMQ's per-vhost export leaves the vhost out of each item
        for item in (*queues, *exchanges, *bindings, *policies, *parameters):
            item.pop("vhost", None)
        return {**head, "parameters": parameters, "policies": policies, "queues": queues, "exchanges": exchanges,
                "bindings": bindings}
    return {
        **head,
        "users": [{**user_info(user), "limits": limits_api.user_limits_of(broker, user.name)}
                  for user in broker.users.values()],
        "vhosts": [vhost_definition(vh) for vh in vhosts],
        "permissions": [{"user": user, "vhost": v, "configure": c, "write": w, "read": r}
                        for (user, v), (c, w, r) in broker.permissions.items()],
        "topic_permissions": topics_api.list_topic_permissions(ctx),
        "parameters": parameters, "global_parameters": [], "policies": policies,
        "queues": queues, "exchanges": exchanges, "bindings": bindings,
    }


def vhost_definition(vh) -> dict:
    """A vhost as RabbitMQ exports it (its default queue type at the top and in ``metadata``)."""
    out = {"name": vh.name, "limits": [], "metadata": {"description": "", "tags": []}}
    if vh.default_queue_type:
        out["default_queue_type"] = out["metadata"]["default_queue_type"] = vh.default_queue_type
    return out


# ---- import ------------------------------------------------------------------------------------
def import_definitions(ctx: AdminContext, doc: Any, vhost: str | None = None,
                       who: Principal | None = None) -> dict:
    """Merge a definitions document (RabbitMQ's format). Validates the whole document first."""
    check_admin(who)
    broker = ctx.broker
    if not isinstance(doc, dict):
        raise bad_request("definitions must be a JSON object")
    if vhost is not None:
        find_vhost(broker, vhost)
    plan = DefinitionsPlan(doc, vhost)
    movers = parameters_api.plan_parameters(ctx, DefinitionsPlan._list(doc, "parameters"), vhost)
    known_vhosts = set(broker.vhosts) | {v["name"] for v in plan.vhosts}
    known_users = set(broker.users) | {user["name"] for user in plan.users}
    for items in (plan.queues, plan.exchanges, plan.bindings, plan.permissions):
        for item in items:
            if item["vhost"] not in known_vhosts:
                raise bad_request(["no_such_vhost", item["vhost"]])
    for p in plan.policies:
        if p.vhost not in known_vhosts:
            raise bad_request(["no_such_vhost", p.vhost])
    for _component, where, _name, _value in movers:
        if where not in known_vhosts:
            raise bad_request(["no_such_vhost", where])
    for p in plan.permissions:
        if p["user"] not in known_users:
            raise bad_request(["no_such_user", p["user"]])
    _check_limits_and_topics(plan, known_vhosts, known_users)
    for v in plan.vhosts:
        if v["default_queue_type"] is not None and v["default_queue_type"] not in broker.queue_types:
            raise bad_request(f"vhost '{v['name']}': unsupported default_queue_type '{v['default_queue_type']}'")
    for user in plan.users:
        broker.add_user(user["name"], user.get("password"), user["tags"],
                        password_hash=user.get("password_hash"), hashing_algorithm=user.get("hashing_algorithm"))
    for v in plan.vhosts:
        broker.add_vhost(v["name"])
        if v["default_queue_type"] is not None:
            broker.set_default_queue_type(v["name"], v["default_queue_type"])
    for p in plan.permissions:
        broker.set_permissions(p["user"], p["vhost"], p["configure"], p["write"], p["read"])
    _apply_limits_and_topics(broker, plan)
    counts = {"users": len(plan.users), "vhosts": len(plan.vhosts), "permissions": len(plan.permissions),
              "exchanges": 0, "queues": 0, "bindings": 0, "policies": len(plan.policies)}
    errors: list[str] = []
    for x in plan.exchanges:
        if x["name"] == "" or x["name"].startswith("amq."):
            continue  # built in
        _apply(errors, counts, "exchanges", f"exchange '{x['name']}' in vhost '{x['vhost']}'",
               broker.vhosts[x["vhost"]].declare_exchange, x["name"], x["type"], False, x["durable"],
               x["auto_delete"], x["internal"], x["arguments"])
    policies_api.apply_policies(broker, plan.policies)  # before the queues: they start with their policy
    for qd in plan.queues:
        _apply(errors, counts, "queues", f"queue '{qd['name']}' in vhost '{qd['vhost']}'",
               broker.vhosts[qd["vhost"]].declare_queue, qd["name"], False, qd["durable"], False,
               qd["auto_delete"], qd["arguments"])
    for b in plan.bindings:
        if b["source"] == "":
            continue  # the default exchange's bindings are implicit
        _apply(errors, counts, "bindings", f"binding '{b['source']}' -> {b['destination_type']} "
               f"'{b['destination']}' in vhost '{b['vhost']}'", broker.vhosts[b["vhost"]].bind,
               b["source"], b["destination_type"], b["destination"], b["routing_key"], b["arguments"], 0, 0)
    parameters_api.apply_parameters(ctx, movers)  # last: shovels find their queues and exchanges
    if errors:
        more = len(errors) - MAX_REPORTED_ERRORS
        raise bad_request("; ".join(errors[:MAX_REPORTED_ERRORS]) + (f" (and {more} more)" if more > 0 else ""))
    return counts


def _check_limits_and_topics(plan: "DefinitionsPlan", known_vhosts: set, known_users: set) -> None:
    """Vhost limits, user limits and topic permissions name vhosts and users that exist or come."""
    for vhost, _name, _value in plan.vhost_limits:
        if vhost not in known_vhosts:
            raise bad_request(["no_such_vhost", vhost])
    for user, vhost, *_rest in plan.topic_permissions:
        if vhost not in known_vhosts:
            raise bad_request(["no_such_vhost", vhost])
        if user not in known_users:
            raise bad_request(["no_such_user", user])


def _apply_limits_and_topics(broker, plan: "DefinitionsPlan") -> None:
    limits_api.apply_limits(broker, plan.vhost_limits, plan.user_limits)
    topics_api.apply_topic_permissions(broker, plan.topic_permissions)


def _apply(errors: list[str], counts: dict, kind: str, what: str, fn, *args) -> None:
    """Apply one item; a refusal is collected in ``errors`` rather than stopping the import."""
    try:
        fn(*args)
        counts[kind] += 1
    except AMQPError as err:
        errors.append(f"{what}: {err.text}")


class DefinitionsPlan:
    """A definitions document checked item by item before anything is applied."""

    def __init__(self, doc: dict, vhost: str | None) -> None:
        self.vhost = vhost
        whole = vhost is None  # users, vhosts and permissions only in a whole-broker import
        self.users = [self._user(x) for x in self._list(doc, "users")] if whole else []
        self.vhosts = [self._vhost(x) for x in self._list(doc, "vhosts")] if whole else []
        self.permissions = [self._permission(x) for x in self._list(doc, "permissions")] if whole else []
        self.exchanges = [self._exchange(x) for x in self._list(doc, "exchanges")]
        self.queues = [self._queue(x) for x in self._list(doc, "queues")]
        self.bindings = [self._binding(x) for x in self._list(doc, "bindings")]
        self.policies = policies_api.plan_policies(self._list(doc, "policies"), self._list(doc, "parameters"),
                                                   vhost)
        for key in ("parameters", "global_parameters", "topic_permissions"):
            self._list(doc, key)  # accepted (RabbitMQ exports carry them); not applied
        # vhost limits (the vhost-limits parameters), user limits, topic permissions (whole import)
        self.vhost_limits = limits_api.plan_vhost_limits(self._list(doc, "parameters"), vhost)
        self.user_limits = limits_api.plan_user_limits(self._list(doc, "users")) if whole else []
        self.topic_permissions = topics_api.plan_topic_permissions(self._list(doc, "topic_permissions")) \
            if whole else []

    @staticmethod
    def _list(doc: dict, key: str) -> list:
        value = doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise bad_request(f"definitions: '{key}' must be a list")
        for item in value:
            if not isinstance(item, dict):
                raise bad_request(f"definitions: every item of '{key}' must be an object")
        return value

    def _item_vhost(self, item: dict, what: str) -> str:
        if self.vhost is not None:
            return self.vhost
        v = item.get("vhost")
        if not isinstance(v, str) or not v:
            raise bad_request(f"definitions: {what} needs a 'vhost'")
        return v

    @staticmethod
    def _name(item: dict, what: str, key: str = "name", allow_empty: bool = False) -> str:
        v = item.get(key)
        if not isinstance(v, str) or (not v and not allow_empty):
            raise bad_request(f"definitions: {what} needs a string '{key}'")
        if len(v.encode("utf-8")) > 255:
            raise bad_request(f"definitions: {what} '{key}' is longer than 255 bytes")
        return v

    def _user(self, x: dict) -> dict:
        name = self._name(x, "a user")
        out = {"name": name, "tags": tags_from(x.get("tags"))}
        if isinstance(x.get("password"), str):
            out["password"] = x["password"]
        else:
            h = x.get("password_hash", "")
            algo = x.get("hashing_algorithm") or HASHING_SHA256
            if not isinstance(h, str) or not isinstance(algo, str):
                raise bad_request(f"definitions: user '{name}': password_hash must be a string")
            out["password_hash"], out["hashing_algorithm"] = h, algo
        return out

    def _vhost(self, x: dict) -> dict:
        return {"name": self._name(x, "a vhost"), "default_queue_type": default_queue_type_of(x)}

    def _permission(self, x: dict) -> dict:
        out = {"user": self._name(x, "a permission", "user"), "vhost": self._item_vhost(x, "a permission")}
        for key in ("configure", "write", "read"):
            value = x.get(key, "")
            if not isinstance(value, str):
                raise bad_request(f"definitions: permission '{key}' must be a string")
            try:
                re.compile(value)
            except re.error:
                raise bad_request(f"definitions: permission '{key}' is not a valid regex") from None
            out[key] = value
        return out

    def _exchange(self, x: dict) -> dict:
        name = self._name(x, "an exchange", allow_empty=True)
        return {"name": name, "vhost": self._item_vhost(x, f"exchange '{name}'"),
                "type": self._name(x, f"exchange '{name}'", "type"),
                "durable": bool_from(x, "durable", True), "auto_delete": bool_from(x, "auto_delete", False),
                "internal": bool_from(x, "internal", False),
                "arguments": arguments_from(x.get("arguments"), f"exchange '{name}' arguments")}

    def _queue(self, x: dict) -> dict:
        name = self._name(x, "a queue")
        return {"name": name, "vhost": self._item_vhost(x, f"queue '{name}'"),
                "durable": bool_from(x, "durable", True), "auto_delete": bool_from(x, "auto_delete", False),
                "arguments": arguments_from(x.get("arguments"), f"queue '{name}' arguments")}

    def _binding(self, x: dict) -> dict:
        dtype = x.get("destination_type")
        if dtype not in ("queue", "exchange"):
            raise bad_request("definitions: binding destination_type must be 'queue' or 'exchange'")
        rk = x.get("routing_key", "")
        if not isinstance(rk, str):
            raise bad_request("definitions: binding routing_key must be a string")
        return {"source": self._name(x, "a binding", "source", allow_empty=True),
                "vhost": self._item_vhost(x, "a binding"),
                "destination": self._name(x, "a binding", "destination"), "destination_type": dtype,
                "routing_key": rk, "arguments": arguments_from(x.get("arguments"), "binding arguments")}


# ---- routes ------------------------------------------------------------------------------------
def _download(request: Request, data: dict) -> JSONResponse:
    headers = {}
    name = request.query_params.get("download")
    if name:
        headers["Content-Disposition"] = f'attachment; filename="{quote(name)}"'
    return JSONResponse(data, headers=headers)


@router.get("/api/definitions", summary="Export every vhost's definitions")
async def definitions(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return _download(request, export_definitions(ctx, None, who))


@router.post("/api/definitions", status_code=204,
             summary="Import (merge) a definitions document, e.g. a RabbitMQ export")
async def definitions_import(request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    import_definitions(ctx, await json_body(request, allow_empty=False), None, who)
    return no_content()


@router.get("/api/definitions/{vhost}")
async def definitions_vhost(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    return _download(request, export_definitions(ctx, u(vhost), who))


@router.post("/api/definitions/{vhost}", status_code=204)
async def definitions_vhost_import(vhost: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    import_definitions(ctx, await json_body(request, allow_empty=False), u(vhost), who)
    return no_content()
