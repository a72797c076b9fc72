"""The FastAPI application: RabbitMQ's management API paths, one router per resource module.

This module only assembles: the app, its middleware (raw-path routing, last-line 500, 503 for
changes while a cluster node cannot reach its database), the error
handlers giving RabbitMQ's ``{"error", "reason"}`` bodies, and each resource's routes. The routes
and the work behind them are in the resource modules (vhosts.py, queues.py, ...).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import quote

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from exchange_broker import __version__
from exchange_broker.management import (bindings, connections, definitions, exchanges, messages, metrics,
                                        overview, permissions, policies, queues, streams, users, vhosts)
from exchange_broker.management import health, limits, move, super_streams, topic_permissions, ui_routes
from exchange_broker.management import federation, parameters, rebalance, shovels
from exchange_broker.management.auth import REALM
from exchange_broker.management.common import AdminContext, ServiceError

log = logging.getLogger("exchange_broker.admin")

_PATH_SAFE = "/%:@!$&'()*+,;=-._~"

# in this order (a path's first route answers 405 for the other methods, with its Allow header)
RESOURCES = (overview, metrics, vhosts, permissions, users, streams, exchanges, bindings, messages, move, queues,
             connections, definitions, policies, health, limits, topic_permissions, super_streams, parameters,
             shovels, federation, rebalance)


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


# changes that store nothing (a publish, a get, closing a connection, restarting a shovel): served
# while the database is away
_NO_DEFINITION = ("/publish", "/get", "/restart")


class _DatabaseAway:
    """A change (PUT, POST, DELETE) while a cluster node cannot reach its database
    (``Broker.definitions_unavailable``): 503 with a JSON reason at once, nothing changed."""

    def __init__(self, app, context: AdminContext) -> None:
        self.app = app
        self.context = context

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") in ("PUT", "POST", "DELETE"):
            path = scope.get("path", "")
            reason = self.context.broker.definitions_unavailable()
            if reason is not None and path.startswith("/api/") and not path.endswith(_NO_DEFINITION) \
                    and not path.startswith("/api/connections/"):
                body = json.dumps({"error": "service_unavailable", "reason": reason}).encode()
                await send({"type": "http.response.start", "status": 503,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _challenge(request: Request) -> dict:
    """The Basic challenge of a 401, but not for the web UI's own calls (``X-Requested-With``):
    a browser answers a challenge with its login dialog, and the UI has its own login form."""
    if request.headers.get("x-requested-with", "").lower() == "xmlhttprequest":
        return {}
    return {"WWW-Authenticate": f'Basic realm="{REALM}"'}


async def _service_error(request: Request, exc: ServiceError):
    headers = {}
    if exc.status == 401 and exc.error == "not_authorized":
        headers = _challenge(request)
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: StarletteHTTPException):
    if exc.status_code == 404:
        body = {"error": "Object Not Found", "reason": "Not Found"}
    elif exc.status_code == 401:
        return JSONResponse({"error": "not_authorized", "reason": "Login failed"}, status_code=401,
                            headers=_challenge(request))
    elif exc.status_code == 405:
        body = {"error": "method_not_allowed", "reason": f"{request.method} is not allowed here"}
    else:
        body = {"error": "bad_request" if exc.status_code == 400 else "error", "reason": str(exc.detail)}
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: RequestValidationError):
    reasons = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                        for e in exc.errors())
    return JSONResponse({"error": "bad_request", "reason": reasons}, status_code=400)


def _docs(app: FastAPI) -> None:
    """``/api/docs``: Swagger UI from files installed with the broker (the fastapi-offline
    package ships them), never from a CDN, so the page works on a machine without internet.
    Every URL in the page is relative to it (also behind a proxy that adds a path prefix)."""
    static = Path(fastapi_offline.__file__).resolve().parent / "static"
    app.mount("/api/docs/static", StaticFiles(directory=static), name="docs-static")

    @app.get("/api/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="openapi.json", title=f"{app.title} - Swagger UI",
                                   swagger_js_url="docs/static/swagger-ui-bundle.js",
                                   swagger_css_url="docs/static/swagger-ui.css",
                                   swagger_favicon_url="docs/static/favicon.png", oauth2_redirect_url=None)


def create_app(context: AdminContext) -> FastAPI:
    app = FastAPI(title="exchange-broker management API",
                  description="RabbitMQ management HTTP API compatible admin API of exchange-broker. "
                              "Names in paths are percent-encoded; the vhost `/` is `%2F`; the default "
                              "exchange is `amq.default`. HTTP Basic authentication with the broker's "
                              "users (tag `administrator`, `monitoring`, `management` or `policymaker`).",
                  version=__version__, openapi_url="/api/openapi.json", docs_url=None, redoc_url=None)
    app.state.admin = context
    app.state.registry = metrics.make_registry(context)
    app.add_middleware(_DatabaseAway, context=context)
    app.add_middleware(_RawPath)
    app.add_middleware(_Guard)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)

    ui_routes.mount(app)  # the web UI: "/" and its files under /ui/
    _docs(app)

    for resource in RESOURCES:
        app.include_router(resource.router)
    return app
