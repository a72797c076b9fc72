"""JSON <-> AMQP field values, and reading typed fields out of a request body (400 when wrong)."""

from __future__ import annotations

import datetime as _dt
import math
from decimal import Decimal
from typing import Any

from exchange_broker.management.common import bad_request

AMQP_INT_MIN, AMQP_INT_MAX = -2 ** 63, 2 ** 64 - 1
MAX_NESTING = 32


def to_json(value: Any, _depth: int = 0) -> Any:
    """An AMQP field value (bytes, Decimal, datetime, nested tables ...) as a JSON-safe value."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if _depth > MAX_NESTING:
        return str(value)
    if isinstance(value, dict):
        return {_key(k): to_json(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v, _depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        if not value.is_finite():
            return str(value)
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return int(value.timestamp())
    if isinstance(value, _dt.date):
        return value.isoformat()
    return str(value)


def _key(k: Any) -> str:
    if isinstance(k, (bytes, bytearray)):
        return bytes(k).decode("utf-8", "replace")
    return str(k)


def check_field_value(value: Any, where: str, _depth: int = 0) -> Any:
    """A JSON value that can be an AMQP field value; raises 400 for what cannot."""
    if _depth > MAX_NESTING:
        raise bad_request(f"{where}: nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not AMQP_INT_MIN <= value <= AMQP_INT_MAX:
            raise bad_request(f"{where}: integer {value} out of range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise bad_request(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, dict):
        return {str(k): check_field_value(v, where, _depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [check_field_value(v, where, _depth + 1) for v in value]
    raise bad_request(f"{where}: unsupported value {value!r}")


def arguments_from(value: Any, where: str = "arguments") -> dict:
    """RabbitMQ accepts an object, an empty list (Erlang's empty proplist) or nothing."""
    if value is None or value == [] or value == "":
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON object")
    return check_field_value(value, where)


def bool_from(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(["not_boolean", to_json(value)])


def str_from(body: dict, key: str, default: str | None = None, *, required: bool = False) -> str:
    value = body.get(key, default)
    if value is None:
        if required:
            raise bad_request(f"[{{key_missing,{key}}}]")
        return default if default is not None else ""
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def int_from(body: dict, key: str, default: int, lo: int, hi: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_request(f"{key} must be an integer between {lo} and {hi}")
    return value


def tags_from(value: Any) -> list[str]:
    """User tags: a list of strings or RabbitMQ's comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a list of strings or a comma-separated string")
