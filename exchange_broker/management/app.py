"""The FastAPI application: RabbitMQ's management API paths over a BrokerService.

Every handler is ``async def``: it runs on the broker's event loop, so calling the
(synchronous) service needs no locking. Handlers never touch broker internals.

Names in paths are percent-encoded as RabbitMQ's clients send them (the vhost ``/`` is
``%2F``); the ``_RawPath`` middleware routes on the raw path so an encoded ``/`` stays
inside its segment, and handlers decode each segment with ``_u``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import quote, unquote

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from exchange_broker import __version__
from exchange_broker.management.service import BrokerService, Principal, ServiceError, bad_request
from exchange_broker.management import paging
from exchange_broker.management.auth import REALM, require_user
from exchange_broker.management.metrics import CONTENT_TYPE, make_registry, render

log = logging.getLogger("exchange_broker.admin")

MAX_BODY = 64 * 1024 * 1024
PUBLISH_CONFIRM_TIMEOUT = 30.0
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


def _u(segment: str) -> str:
    return unquote(segment, encoding="utf-8", errors="replace")


# ---- request bodies (documented in the OpenAPI schema; parsed and checked by the service) ------
class ExchangeBody(BaseModel):
    type: str = "direct"
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


class QueueBody(BaseModel):
    durable: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = Field(default_factory=dict)


class PublishBody(BaseModel):
    routing_key: str
    payload: str
    payload_encoding: str = Field("string", description="string or base64")
    properties: dict[str, Any] = Field(default_factory=dict)


class GetBody(BaseModel):
    count: int = 1
    ackmode: str = Field(..., description="ack_requeue_true, ack_requeue_false, reject_requeue_true "
                                          "or reject_requeue_false")
    encoding: str = Field("auto", description="auto or base64")
    truncate: int | None = None


class BindingBody(BaseModel):
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


class VhostBody(BaseModel):
    description: str = ""
    tags: str | list[str] = ""


class UserBody(BaseModel):
    password: str | None = None
    password_hash: str | None = None
    hashing_algorithm: str | None = None
    tags: str | list[str] = ""


class PermissionBody(BaseModel):
    configure: str
    write: str
    read: str


def _body_doc(model: type[BaseModel]) -> dict:
    return {"requestBody": {"required": False,
                            "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def json_body(request: Request, *, allow_empty: bool = True) -> Any:
    """The request's JSON (whatever its content-type, as RabbitMQ accepts), size-limited."""
    size = 0
    chunks = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ServiceError(413, "bad_request", f"request body larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        if allow_empty:
            return {}
        raise bad_request("not_json")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad_request("failed_to_parse_json") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def json_object(request: Request) -> dict:
    data = await json_body(request)
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


def _flag(request: Request, *names: str) -> bool:
    for name in names:
        value = request.query_params.get(name)
        if value is not None:
            return value.lower() in ("true", "1", "yes", "")
    return False


def _created(created: bool) -> Response:
    return Response(status_code=201 if created else 204)


def _list(request: Request, items: list[dict], *, sort: tuple[str, ...] = ("vhost", "name"),
          paginate: bool = True) -> JSONResponse:
    return JSONResponse(paging.apply(items, request.query_params, default_sort=sort, paginate=paginate))


# ---- middleware -------------------------------------------------------------------------------
class _RawPath:
    """Route on the request's raw path so that ``%2F`` inside a name is not a path separator."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path")
            if raw:
                scope = dict(scope)
                scope["path"] = quote(raw.split(b"?", 1)[0], safe=_PATH_SAFE)
        await self.app(scope, receive, send)


class _Guard:
    """Last line: an unexpected exception becomes a 500 JSON answer; the broker keeps running."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def _send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except Exception as exc:  # noqa: BLE001 - anything a request triggers must not escape
            log.exception("admin API: internal error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                body = json.dumps({"error": "internal_error", "reason": f"{type(exc).__name__}: {exc}"[:500]})
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body.encode()})


# ---- the application --------------------------------------------------------------------------
def create_app(service: BrokerService) -> FastAPI:
    app = FastAPI(title="exchange-broker management API",
                  description="RabbitMQ management HTTP API compatible admin API of exchange-broker. "
                              "Names in paths are percent-encoded; the vhost `/` is `%2F`; the default "
                              "exchange is `amq.default`. HTTP Basic authentication with the broker's "
                              "users (tag `administrator`, `monitoring`, `management` or `policymaker`).",
                  version=__version__, openapi_url="/api/openapi.json", docs_url="/api/docs",
                  redoc_url=None)
    app.state.service = service
    app.state.registry = make_registry(service)
    app.add_middleware(_RawPath)
    app.add_middleware(_Guard)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        headers = {}
        if exc.status == 401 and exc.error == "not_authorized":
            headers["WWW-Authenticate"] = f'Basic realm="{REALM}"'
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            body = {"error": "Object Not Found", "reason": "Not Found"}
        elif exc.status_code == 401:
            return JSONResponse({"error": "not_authorized", "reason": "Login failed"}, status_code=401,
                                headers={"WWW-Authenticate": f'Basic realm="{REALM}"'})
        elif exc.status_code == 405:
            body = {"error": "method_not_allowed", "reason": f"{request.method} is not allowed here"}
        else:
            body = {"error": "bad_request" if exc.status_code == 400 else "error", "reason": str(exc.detail)}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        reasons = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                            for e in exc.errors())
        return JSONResponse({"error": "bad_request", "reason": reasons}, status_code=400)

    svc = service
    User = Depends(require_user)

    # -- overview and misc ---------------------------------------------------------------------
    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/api/docs")

    @app.get("/api/overview", tags=["overview"])
    async def overview(who: Principal = User):
        return svc.overview(who)

    @app.get("/api/whoami", tags=["overview"])
    async def whoami(who: Principal = User):
        return {"name": who.name, "tags": who.tags}

    @app.get("/api/nodes", tags=["overview"])
    async def nodes(who: Principal = User):
        return svc.nodes()

    @app.get("/api/extensions", tags=["overview"])
    async def extensions(who: Principal = User):
        return []

    @app.get("/api/cluster-name", tags=["overview"])
    async def cluster_name(who: Principal = User):
        return {"name": "exchange-broker"}

    @app.get("/api/aliveness-test/{vhost}", tags=["overview"])
    async def aliveness(vhost: str, who: Principal = User):
        return svc.aliveness(_u(vhost), who)

    @app.get("/metrics", tags=["metrics"], response_class=Response,
             summary="Prometheus metrics (text exposition format, no authentication)")
    async def metrics(request: Request):
        return Response(render(request.app.state.registry), media_type=CONTENT_TYPE)

    # -- vhosts ------------------------------------------------------------------------------
    @app.get("/api/vhosts", tags=["vhosts"])
    async def vhosts(request: Request, who: Principal = User):
        return _list(request, svc.vhosts(who), sort=("name",))

    @app.get("/api/vhosts/{vhost}", tags=["vhosts"])
    async def vhost_get(vhost: str, who: Principal = User):
        return svc.vhost(_u(vhost), who)

    @app.put("/api/vhosts/{vhost}", tags=["vhosts"], openapi_extra=_body_doc(VhostBody))
    async def vhost_put(vhost: str, request: Request, who: Principal = User):
        await json_object(request)
        return _created(svc.add_vhost(_u(vhost), who))

    @app.delete("/api/vhosts/{vhost}", tags=["vhosts"], status_code=204)
    async def vhost_delete(vhost: str, who: Principal = User):
        svc.delete_vhost(_u(vhost), who)
        return Response(status_code=204)

    @app.get("/api/vhosts/{vhost}/permissions", tags=["permissions"])
    async def vhost_permissions(vhost: str, who: Principal = User):
        name = _u(vhost)
        svc.vhost(name, who)
        return svc.permissions(who, vhost=name)

    @app.get("/api/vhosts/{vhost}/connections", tags=["connections"])
    async def vhost_connections(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.connections(_u(vhost), who), sort=("name",))

    @app.get("/api/vhosts/{vhost}/channels", tags=["channels"])
    async def vhost_channels(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.channels(_u(vhost), who), sort=("name",))

    # -- users and permissions ---------------------------------------------------------------------
    @app.get("/api/users", tags=["users"])
    async def users(request: Request, who: Principal = User):
        return _list(request, svc.users(who), sort=("name",), paginate=False)

    @app.get("/api/users/{user}", tags=["users"])
    async def user_get(user: str, who: Principal = User):
        return svc.user(_u(user), who)

    @app.put("/api/users/{user}", tags=["users"], openapi_extra=_body_doc(UserBody))
    async def user_put(user: str, request: Request, who: Principal = User):
        return _created(svc.put_user(_u(user), await json_object(request), who))

    @app.delete("/api/users/{user}", tags=["users"], status_code=204)
    async def user_delete(user: str, who: Principal = User):
        svc.delete_user(_u(user), who)
        return Response(status_code=204)

    @app.get("/api/users/{user}/permissions", tags=["permissions"])
    async def user_permissions(user: str, who: Principal = User):
        name = _u(user)
        svc.user(name, who)
        return svc.permissions(who, user=name)

    @app.get("/api/permissions", tags=["permissions"])
    async def permissions(who: Principal = User):
        return svc.permissions(who)

    # -- stream queues -------------------------------------------------------------------------
    @app.get("/api/stream-offsets/{vhost}/{name}", tags=["streams"])
    async def stream_info(vhost: str, name: str, who: Principal = User):
        """A stream queue's log: first/next offset, counts, segments and stored consumer offsets."""
        return svc.stream_info(_u(vhost), _u(name), who)

    @app.get("/api/stream-offsets/{vhost}/{name}/{consumer}", tags=["streams"])
    async def stream_offset_get(vhost: str, name: str, consumer: str, who: Principal = User):
        """The offset stored for a named consumer (`x-stream-consumer-name`)."""
        return svc.stream_offset(_u(vhost), _u(name), _u(consumer), who)

    @app.put("/api/stream-offsets/{vhost}/{name}/{consumer}", tags=["streams"], status_code=204)
    async def stream_offset_put(vhost: str, name: str, consumer: str, request: Request,
                                who: Principal = User):
        """Store {"offset": N}: the named consumer's next consume resumes at N + 1."""
        svc.set_stream_offset(_u(vhost), _u(name), _u(consumer), await json_object(request), who)
        return Response(status_code=204)

    @app.get("/api/permissions/{vhost}/{user}", tags=["permissions"])
    async def permission_get(vhost: str, user: str, who: Principal = User):
        found = svc.permissions(who, user=_u(user), vhost=_u(vhost))
        if not found:
            raise ServiceError(404, "Object Not Found", "Not Found")
        return found[0]

    @app.put("/api/permissions/{vhost}/{user}", tags=["permissions"], openapi_extra=_body_doc(PermissionBody))
    async def permission_put(vhost: str, user: str, request: Request, who: Principal = User):
        return _created(svc.set_permission(_u(vhost), _u(user), await json_object(request), who))

    @app.delete("/api/permissions/{vhost}/{user}", tags=["permissions"], status_code=204)
    async def permission_delete(vhost: str, user: str, who: Principal = User):
        svc.clear_permission(_u(vhost), _u(user), who)
        return Response(status_code=204)

    # -- exchanges ---------------------------------------------------------------------------
    @app.get("/api/exchanges", tags=["exchanges"])
    async def exchanges(request: Request, who: Principal = User):
        return _list(request, svc.exchanges(None, who))

    @app.get("/api/exchanges/{vhost}", tags=["exchanges"])
    async def exchanges_vhost(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.exchanges(_u(vhost), who))

    @app.get("/api/exchanges/{vhost}/{name}", tags=["exchanges"])
    async def exchange_get(vhost: str, name: str, who: Principal = User):
        return svc.exchange(_u(vhost), _u(name), who)

    @app.put("/api/exchanges/{vhost}/{name}", tags=["exchanges"], openapi_extra=_body_doc(ExchangeBody),
             summary="Declare an exchange (201 created, 204 already there)")
    async def exchange_put(vhost: str, name: str, request: Request, who: Principal = User):
        return _created(svc.declare_exchange(_u(vhost), _u(name), await json_object(request), who))

    @app.delete("/api/exchanges/{vhost}/{name}", tags=["exchanges"], status_code=204,
                summary="Delete an exchange (?if-unused=true)")
    async def exchange_delete(vhost: str, name: str, request: Request, who: Principal = User):
        svc.delete_exchange(_u(vhost), _u(name), _flag(request, "if-unused", "if_unused"), who)
        return Response(status_code=204)

    @app.get("/api/exchanges/{vhost}/{name}/bindings/source", tags=["bindings"])
    async def exchange_bindings_source(vhost: str, name: str, request: Request, who: Principal = User):
        return _list(request, svc.bindings_for(_u(vhost), source=_u(name), who=who), sort=(), paginate=False)

    @app.get("/api/exchanges/{vhost}/{name}/bindings/destination", tags=["bindings"])
    async def exchange_bindings_destination(vhost: str, name: str, request: Request, who: Principal = User):
        return _list(request, svc.bindings_for(_u(vhost), dest_type="exchange", dest=_u(name), who=who),
                     sort=(), paginate=False)

    @app.post("/api/exchanges/{vhost}/{name}/publish", tags=["exchanges"], openapi_extra=_body_doc(PublishBody),
              summary='Publish a message; answers {"routed": true|false}')
    async def exchange_publish(vhost: str, name: str, request: Request, who: Principal = User):
        body = await json_object(request)
        routed, waiter = svc.publish(_u(vhost), _u(name), body, who)
        if waiter is not None and not waiter.done:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()

            def _stored(_arg, ok: bool) -> None:
                if not fut.done():
                    fut.set_result(ok)

            waiter.add(_stored, None)
            try:
                ok = await asyncio.wait_for(fut, PUBLISH_CONFIRM_TIMEOUT)
            except asyncio.TimeoutError:
                ok = False
            if not ok:
                raise ServiceError(500, "internal_error", "the message could not be stored")
        return {"routed": routed}

    # -- queues ------------------------------------------------------------------------------
    @app.get("/api/queues", tags=["queues"])
    async def queues(request: Request, who: Principal = User):
        return _list(request, svc.queues(None, who))

    @app.get("/api/queues/{vhost}", tags=["queues"])
    async def queues_vhost(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.queues(_u(vhost), who))

    @app.get("/api/queues/{vhost}/{name}", tags=["queues"])
    async def queue_get(vhost: str, name: str, who: Principal = User):
        return svc.queue(_u(vhost), _u(name), who)

    @app.put("/api/queues/{vhost}/{name}", tags=["queues"], openapi_extra=_body_doc(QueueBody),
             summary="Declare a queue (201 created, 204 already there)")
    async def queue_put(vhost: str, name: str, request: Request, who: Principal = User):
        return _created(svc.declare_queue(_u(vhost), _u(name), await json_object(request), who))

    @app.delete("/api/queues/{vhost}/{name}", tags=["queues"], status_code=204,
                summary="Delete a queue (?if-empty=true, ?if-unused=true)")
    async def queue_delete(vhost: str, name: str, request: Request, who: Principal = User):
        svc.delete_queue(_u(vhost), _u(name), _flag(request, "if-empty", "if_empty"),
                         _flag(request, "if-unused", "if_unused"), who)
        return Response(status_code=204)

    @app.delete("/api/queues/{vhost}/{name}/contents", tags=["queues"], status_code=204,
                summary="Purge a queue")
    async def queue_purge(vhost: str, name: str, who: Principal = User):
        svc.purge_queue(_u(vhost), _u(name), who)
        return Response(status_code=204)

    @app.post("/api/queues/{vhost}/{name}/get", tags=["queues"], openapi_extra=_body_doc(GetBody),
              summary="Get messages (ackmode, encoding, truncate)")
    async def queue_get_messages(vhost: str, name: str, request: Request, who: Principal = User):
        return svc.get_messages(_u(vhost), _u(name), await json_object(request), who)

    @app.get("/api/queues/{vhost}/{name}/bindings", tags=["bindings"])
    async def queue_bindings(vhost: str, name: str, request: Request, who: Principal = User):
        return _list(request, svc.bindings_for(_u(vhost), dest_type="queue", dest=_u(name), who=who),
                     sort=(), paginate=False)

    # -- bindings ----------------------------------------------------------------------------
    @app.get("/api/bindings", tags=["bindings"])
    async def bindings(request: Request, who: Principal = User):
        return _list(request, svc.bindings(None, who), sort=(), paginate=False)

    @app.get("/api/bindings/{vhost}", tags=["bindings"])
    async def bindings_vhost(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.bindings(_u(vhost), who), sort=(), paginate=False)

    def _dtype(kind: str) -> str:
        return "queue" if kind == "q" else "exchange"

    for kind in ("q", "e"):
        _binding_routes(app, svc, kind, _dtype(kind), User)

    # -- connections, channels, consumers ------------------------------------------------------
    @app.get("/api/connections", tags=["connections"])
    async def connections(request: Request, who: Principal = User):
        return _list(request, svc.connections(None, who), sort=("name",))

    @app.get("/api/connections/{name}", tags=["connections"])
    async def connection_get(name: str, who: Principal = User):
        return svc.connection(_u(name), who)

    @app.delete("/api/connections/{name}", tags=["connections"], status_code=204,
                summary="Close a client connection (reason in the X-Reason header)")
    async def connection_delete(name: str, request: Request, who: Principal = User):
        svc.close_connection(_u(name), request.headers.get("x-reason"), who)
        return Response(status_code=204)

    @app.get("/api/connections/{name}/channels", tags=["channels"])
    async def connection_channels(name: str, who: Principal = User):
        return svc.connection_channels(_u(name), who)

    @app.get("/api/channels", tags=["channels"])
    async def channels(request: Request, who: Principal = User):
        return _list(request, svc.channels(None, who), sort=("name",))

    @app.get("/api/channels/{name}", tags=["channels"])
    async def channel_get(name: str, who: Principal = User):
        return svc.channel(_u(name), who)

    @app.get("/api/consumers", tags=["consumers"])
    async def consumers(request: Request, who: Principal = User):
        return _list(request, svc.consumers(None, who), sort=(), paginate=False)

    @app.get("/api/consumers/{vhost}", tags=["consumers"])
    async def consumers_vhost(vhost: str, request: Request, who: Principal = User):
        return _list(request, svc.consumers(_u(vhost), who), sort=(), paginate=False)

    # -- definitions -------------------------------------------------------------------------
    def _download(request: Request, data: dict) -> JSONResponse:
        headers = {}
        name = request.query_params.get("download")
        if name:
            headers["Content-Disposition"] = f'attachment; filename="{quote(name)}"'
        return JSONResponse(data, headers=headers)

    @app.get("/api/definitions", tags=["definitions"], summary="Export every vhost's definitions")
    async def definitions(request: Request, who: Principal = User):
        return _download(request, svc.export_definitions(None, who))

    @app.post("/api/definitions", tags=["definitions"], status_code=204,
              summary="Import (merge) a definitions document, e.g. a RabbitMQ export")
    async def definitions_import(request: Request, who: Principal = User):
        svc.import_definitions(await json_body(request, allow_empty=False), None, who)
        return Response(status_code=204)

    @app.get("/api/definitions/{vhost}", tags=["definitions"])
    async def definitions_vhost(vhost: str, request: Request, who: Principal = User):
        return _download(request, svc.export_definitions(_u(vhost), who))

    @app.post("/api/definitions/{vhost}", tags=["definitions"], status_code=204)
    async def definitions_vhost_import(vhost: str, request: Request, who: Principal = User):
        svc.import_definitions(await json_body(request, allow_empty=False), _u(vhost), who)
        return Response(status_code=204)

    return app


def _binding_routes(app: FastAPI, svc: BrokerService, kind: str, dtype: str, User) -> None:
    base = f"/api/bindings/{{vhost}}/e/{{source}}/{kind}/{{dest}}"
    label = "queue" if kind == "q" else "exchange"

    async def list_between(vhost: str, source: str, dest: str, request: Request, who: Principal = User):
        return _list(request, svc.bindings_for(_u(vhost), source=_u(source), dest_type=dtype, dest=_u(dest),
                                               who=who), sort=(), paginate=False)

    async def create(vhost: str, source: str, dest: str, request: Request, who: Principal = User):
        key = svc.bind(_u(vhost), _u(source), dtype, _u(dest), await json_object(request), who)
        # Location is relative to this URL, the key quoted once more as RabbitMQ does
        return Response(status_code=201, headers={"Location": f"{quote(_u(dest), safe='')}/"
                                                              f"{quote(key, safe='~')}"})

    async def get_one(vhost: str, source: str, dest: str, props: str, who: Principal = User):
        return svc.binding(_u(vhost), _u(source), dtype, _u(dest), _u(props), who)

    async def delete_one(vhost: str, source: str, dest: str, props: str, who: Principal = User):
        svc.unbind(_u(vhost), _u(source), dtype, _u(dest), _u(props), who, raw_key=props)
        return Response(status_code=204)

    app.add_api_route(base, list_between, methods=["GET"], tags=["bindings"],
                      summary=f"Bindings from an exchange to a {label}")
    app.add_api_route(base, create, methods=["POST"], tags=["bindings"], status_code=201,
                      openapi_extra=_body_doc(BindingBody),
                      summary=f"Bind an exchange to a {label} (answers Location with the properties_key)")
    app.add_api_route(base + "/{props}", get_one, methods=["GET"], tags=["bindings"],
                      summary=f"One exchange-to-{label} binding by properties_key")
    app.add_api_route(base + "/{props}", delete_one, methods=["DELETE"], tags=["bindings"], status_code=204,
                      summary=f"Delete one exchange-to-{label} binding by properties_key")
