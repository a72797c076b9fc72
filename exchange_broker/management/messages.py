"""Messages through the API: publish to an exchange, get from a queue (RabbitMQ's ackmodes).

Publishing goes through ``Broker.publish`` as an AMQP basic.publish does; when the message is
stored, the answer waits for the store (publisher-confirm style) up to a timeout.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as _dt
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from exchange_broker.core.message import Message, from_wire
from exchange_broker.core.queue import delivery_guard
from exchange_broker.management.common import (READ, WRITE, AdminContext, Principal, ServiceError, bad_request,
                                                check_resource, exchange_name, find_vhost, from_amqp, not_authorised,
                                                not_found)
from exchange_broker.core import permissions
from exchange_broker.management.fields import arguments_from, bool_from, int_from, str_from, to_json
from exchange_broker.management.web import Ctx, Who, body_doc, json_object, u
from exchange_broker.protocol import codec
from exchange_broker.protocol.errors import AMQPError

router = APIRouter()

PUBLISH_CONFIRM_TIMEOUT = 30.0
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
MAX_GET_COUNT = 100_000

# AMQP basic properties as RabbitMQ's JSON names them -> pamqp's names
_PROPS = {"content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
          "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
          "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id",
          "timestamp": "timestamp", "type": "message_type", "user_id": "user_id", "app_id": "app_id"}
_PROPS_BACK = {v: k for k, v in _PROPS.items()}


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


# ---- publish -----------------------------------------------------------------------------------
def publish(ctx: AdminContext, vhost: str, exchange: str, body: dict, who: Principal | None = None):
    """POST .../publish: returns (routed, durability waiter or None)."""
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, WRITE, "exchange", exchange)
    ex = vh.exchanges.get(exchange_name(exchange))
    if ex is None:
        raise not_found(f"no {vh.describe('exchange', exchange_name(exchange))}")
    if ex.internal:
        raise bad_request(f"403 ACCESS_REFUSED - cannot publish to internal {vh.describe('exchange', ex.name)}")
    routing_key = str_from(body, "routing_key", required=True)
    if len(routing_key.encode("utf-8")) > 255:
        raise bad_request("routing_key is longer than 255 bytes")
    if who is not None and not who.is_admin and (ctx.broker.topic_permissions or who.authz is not None) and \
            not permissions.topic_allowed(ctx.broker, who.name, vhost, ex, routing_key, WRITE, who.authz):
        raise not_authorised(permissions.topic_refused(who.name, vhost, ex.name, routing_key).text)
    data = _payload(body)
    raw_props, props = encode_properties(body.get("properties"))
    quick = codec.quick_properties(raw_props)
    try:  # the per-message TTL (expiration) and the user-id, as a basic.publish
        msg = from_wire(ex.name, routing_key, raw_props, data, who, quick)
    except AMQPError as err:
        raise bad_request(err.reply_text) from None
    result = ctx.broker.publish(vh, ex, msg, bool(quick[2] & codec.FLAG_HEADERS), None)
    return bool(result[0]), result[1]


def _payload(body: dict) -> bytes:
    payload = body.get("payload")
    if not isinstance(payload, str):
        raise bad_request("[{key_missing,payload}]" if payload is None else "payload must be a string")
    encoding = str_from(body, "payload_encoding", "string")
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("payload is not valid base64") from None
    raise bad_request(f"payload_encoding must be 'string' or 'base64', not '{encoding}'")


def encode_properties(value: Any) -> tuple[bytes, dict]:
    """RabbitMQ's JSON properties -> (encoded AMQP properties, pamqp-named dict); 400 if invalid."""
    if value is None or value == []:
        value = {}
    if not isinstance(value, dict):
        raise bad_request("properties must be a JSON object")
    props: dict = {}
    for key, v in value.items():
        if v is None:
            continue
        name = _PROPS.get(key)
        if name is None:
            raise bad_request(f"unknown message property '{key}'")
        if key == "headers":
            props[name] = arguments_from(v, "properties.headers")
        elif key in ("delivery_mode", "priority"):
            if isinstance(v, str) and v.isdigit():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
                raise bad_request(f"properties.{key} must be an integer 0..255")
            if key == "delivery_mode" and v not in (1, 2):
                raise bad_request("properties.delivery_mode must be 1 or 2")
            props[name] = v
        elif key == "timestamp":
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 63 // 1000:
                raise bad_request("properties.timestamp must be an integer (seconds since the epoch)")
            props[name] = _dt.datetime.fromtimestamp(v, _dt.timezone.utc)
        else:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and key == "expiration":
                v = str(v)
            if not isinstance(v, str):
                raise bad_request(f"properties.{key} must be a string")
            if len(v.encode("utf-8")) > 255:
                raise bad_request(f"properties.{key} is longer than 255 bytes")
            props[name] = v
    try:
        raw = codec.encode_properties(props)
    except Exception as exc:  # pamqp: ValueError, TypeError, struct.error ...
        raise bad_request(f"invalid message properties: {exc}") from None
    return raw, props


async def stored(waiter) -> None:
    """Wait for the durability waiter of a published message; 500 if it could not be stored."""
    if waiter is None or waiter.done:
        return
    fut = asyncio.get_running_loop().create_future()

    def _stored(_arg, ok: bool) -> None:
        if not fut.done():
            fut.set_result(ok)

    waiter.add(_stored, None)
    try:
        async with asyncio.timeout(PUBLISH_CONFIRM_TIMEOUT):
            ok = await fut
    except asyncio.TimeoutError:
        ok = False
    if not ok:
        raise ServiceError(500, "internal_error", "the message could not be stored")


# ---- get ---------------------------------------------------------------------------------------
def get_messages(ctx: AdminContext, vhost: str, name: str, body: dict, who: Principal | None = None) -> list[dict]:
    """POST .../get: take up to ``count`` messages with RabbitMQ's ackmodes."""
    vh = find_vhost(ctx.broker, vhost)
    check_resource(ctx.broker, who, vhost, READ, "queue", name)
    q = vh.queues.get(name)
    if q is None:
        raise not_found()
    count = int_from(body, "count", 1, 0, MAX_GET_COUNT)
    if "ackmode" not in body and "requeue" in body:  # RabbitMQ < 3.7 clients
        ackmode = "ack_requeue_true" if bool_from(body, "requeue", True) else "ack_requeue_false"
    else:
        ackmode = str_from(body, "ackmode", required=True)
    if ackmode not in ACKMODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACKMODES)}")
    encoding = str_from(body, "encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be 'auto' or 'base64'")
    truncate = body.get("truncate")
    if truncate is not None:
        truncate = int_from(body, "truncate", 0, 0, 2 ** 62)
    if q.exclusive_owner is not None:
        raise bad_request(f"405 RESOURCE_LOCKED - cannot obtain exclusive access to locked "
                          f"{vh.describe('queue', name)}")
    guard = delivery_guard(q)
    if guard is not None and not guard():
        raise ServiceError(503, "service_unavailable", f"{vh.describe('queue', name)}: this node cannot reach "
                           f"the database and may no longer lead the queue; try again when it is back")
    taken: list = []
    out: list[dict] = []
    try:
        for _ in range(count):
            msg = q.get()
            if msg is None:
                break
            q.stats_delivered += 1
            taken.append(msg)
            out.append(message_info(msg, q.message_count, encoding, truncate))
    except BaseException as exc:
        if taken and not q.deleted:  # give back everything taken; nothing is lost
            q.requeue(taken)
        if isinstance(exc, AMQPError):  # e.g. a stream queue refuses basic.get
            raise from_amqp(exc, refused_is_auth=False) from None
        raise
    stats = ctx.broker.stats
    stats["get"] = stats.get("get", 0) + len(taken)
    _settle(q, taken, ackmode)
    return out


def _settle(q, taken: list, ackmode: str) -> None:
    """What the ackmode does with the messages taken: requeue, ack or reject them."""
    if ackmode.endswith("requeue_true"):
        for msg in taken:
            q.delivered(msg)
        if taken and not q.deleted:
            q.requeue(taken)
    else:
        for msg in taken:
            if ackmode.startswith("ack"):
                q.settle(msg)
            else:
                q.reject(msg)


def message_info(msg: Message, remaining: int, encoding: str, truncate: int | None) -> dict:
    data = msg.body
    size = len(data)
    if truncate is not None and size > truncate:
        data = data[:truncate]
    payload, enc = None, "base64"
    if encoding == "auto":
        try:
            payload, enc = data.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    if payload is None:
        payload = base64.b64encode(data).decode("ascii")
    try:
        props = msg.props
    except AMQPError:
        props = {}
    return {"payload_bytes": size, "redelivered": bool(msg.redelivered), "exchange": msg.exchange,
            "routing_key": msg.routing_key, "message_count": remaining,
            "properties": _props_json(props), "payload": payload, "payload_encoding": enc}


def _props_json(props: dict) -> dict:
    out = {}
    for name, value in props.items():
        key = _PROPS_BACK.get(name, name)
        if name == "cluster_id" and not value:
            continue
        out[key] = to_json(value)
    return out


# ---- routes ------------------------------------------------------------------------------------
@router.post("/api/exchanges/{vhost}/{name}/publish", tags=["exchanges"], openapi_extra=body_doc(PublishBody),
             summary='Publish a message; answers {"routed": true|false}')
async def exchange_publish(vhost: str, name: str, request: Request, who: Principal = Who, ctx: AdminContext = Ctx):
    body = await json_object(request)
    routed, waiter = publish(ctx, u(vhost), u(name), body, who)
    await stored(waiter)
    return {"routed": routed}


@router.post("/api/queues/{vhost}/{name}/get", tags=["queues"], openapi_extra=body_doc(GetBody),
             summary="Get messages (ackmode, encoding, truncate)")
async def queue_get_messages(vhost: str, name: str, request: Request, who: Principal = Who,
                             ctx: AdminContext = Ctx):
    return get_messages(ctx, u(vhost), u(name), await json_object(request), who)
