"""HTTP glue shared by the resource modules' routes: path segments, request bodies, answers.

Names in paths are percent-encoded as RabbitMQ's clients send them (the vhost ``/`` is ``%2F``);
the app routes on the raw path so an encoded ``/`` stays inside its segment, and handlers decode
each segment with :func:`u`. Every handler is ``async def``: it runs on the broker's event loop,
so calling the synchronous service functions needs no locking.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from fastapi import Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from exchange_broker.management import paging
from exchange_broker.management.auth import require_user
from exchange_broker.management.common import AdminContext, ServiceError, bad_request
from exchange_broker.management.samples import RangeError, Ranges, parse_ranges

MAX_BODY = 64 * 1024 * 1024


def u(segment: str) -> str:
    """A path segment, percent-decoded."""
    return unquote(segment, encoding="utf-8", errors="replace")


def admin_context(request: Request) -> AdminContext:
    return request.app.state.admin


Who = Depends(require_user)          # the authenticated Principal (401 otherwise)
Ctx = Depends(admin_context)         # the AdminContext


def body_doc(model: type[BaseModel]) -> dict:
    """Document a request body in the OpenAPI schema (the service parses and checks it)."""
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
        data = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad_request("failed_to_parse_json") from None
    if not _valid_text(data):
        raise bad_request("failed_to_parse_json: a string holds an unpaired surrogate (\\ud800-\\udfff)")
    return data


def _valid_text(value) -> bool:
    """No string in the document holds a lone surrogate (JSON escapes allow one; it is not text
    and would fail later, when encoded)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def json_object(request: Request) -> dict:
    data = await json_body(request)
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


def ranges(request: Request) -> Ranges:
    """The samples asked for: RabbitMQ's ``lengths_age``/``lengths_incr`` and
    ``msg_rates_age``/``msg_rates_incr`` query parameters (400 when out of bounds)."""
    try:
        return parse_ranges(request.query_params)
    except RangeError as err:
        raise ServiceError(400, "invalid_range_parameters", str(err)) from None


def flag(request: Request, *names: str) -> bool:
    """A boolean query parameter (the first of ``names`` present)."""
    for name in names:
        value = request.query_params.get(name)
        if value is not None:
            return value.lower() in ("true", "1", "yes", "")
    return False


def created(was_created: bool) -> Response:
    return Response(status_code=201 if was_created else 204)


def no_content() -> Response:
    return Response(status_code=204)


def listing(request: Request, items: list[dict], *, sort: tuple[str, ...] = ("vhost", "name"),
            paginate: bool = True) -> JSONResponse:
    """A list answer with RabbitMQ's filter / sort / columns / page query parameters applied."""
    return JSONResponse(paging.apply(items, request.query_params, default_sort=sort, paginate=paginate))
