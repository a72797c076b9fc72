"""Stream queue arguments: which queue.declare arguments a stream accepts (RabbitMQ's rules and
406 texts) and the basic.consume ``x-stream-offset`` specification."""

from __future__ import annotations

import datetime
import re

from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

# Queue arguments RabbitMQ knows; those not in STREAM_ARGS are refused for a stream.
KNOWN_QUEUE_ARGS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version", "x-single-active-consumer",
    "x-queue-type", "x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator", "x-queue-master-locator",
    "x-delivery-limit", "x-dead-letter-strategy"))
STREAM_ARGS = frozenset(("x-queue-type", "x-max-length-bytes", "x-max-age",
                         "x-stream-max-segment-size-bytes", "x-initial-cluster-size",
                         "x-queue-leader-locator"))
CONSUMER_NAME_ARG = "x-stream-consumer-name"

_AGE_RE = re.compile(r"^(\d+)([YMDhms])$")
_AGE_UNIT_MS = {"Y": 365 * 86400_000, "M": 30 * 86400_000, "D": 86400_000, "h": 3600_000,
                "m": 60_000, "s": 1000}


def _norm(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _amqp_type(value) -> str:
    """RabbitMQ's name for the AMQP field type a decoded value arrived as."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -2 ** 31 <= value < 2 ** 31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, (bytes, bytearray)):
        return "bytearray"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return "void" if value is None else type(value).__name__


def _erl(value) -> str:
    """An Erlang-ish rendering of a value for RabbitMQ-style error terms."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    return str(value)


def parse_interval_ms(value) -> int | None:
    """``7D``/``12h``/``30m``... as milliseconds (> 0), or None when not such a string."""
    if not isinstance(value, str):
        return None
    match = _AGE_RE.match(value)
    if match is None or int(match.group(1)) <= 0:
        return None
    return int(match.group(1)) * _AGE_UNIT_MS[match.group(2)]

# -- declaring ----------------------------------------------------------------------------------
def check_stream_arguments(desc: str, arguments: dict) -> None:
    def bad(arg: str, why: str | None = None) -> AMQPError:
        text = f"invalid arg '{arg}' for {desc}"
        text += f": {why}" if why is not None else " of queue type rabbit_stream_queue"
        return AMQPError(PRECONDITION_FAILED, text, 50, 10, hard=False)

    for arg in arguments:
        if arg in KNOWN_QUEUE_ARGS and arg not in STREAM_ARGS:
            raise bad(arg)
    for arg in ("x-max-length-bytes", "x-stream-max-segment-size-bytes"):
        if arg in arguments:
            value = arguments[arg]
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(arg, f'"expected integer, got {_amqp_type(value)}"')
            if value < 0:
                raise bad(arg, f"{{value_negative,{value}}}")
    if "x-max-age" in arguments:
        value = _norm(arguments["x-max-age"])
        if not isinstance(value, str):
            raise bad("x-max-age", f"{{unacceptable_type,{_amqp_type(value)}}}")
        if parse_interval_ms(value) is None:
            raise bad("x-max-age", "invalid_max_age")



# -- consume arguments ----------------------------------------------------------------------------
def parse_offset_spec(value, desc: str, now_ms: int) -> tuple:
    """x-stream-offset → ("first",) | ("last",) | ("next",) | ("offset", n) | ("time", ms);
    an interval ("1h") counts back from ``now_ms`` (the broker clock's wall time)."""
    value = _norm(value)
    if value is None:
        return ("next",)
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return (value,)
        interval = parse_interval_ms(value)
        if interval is not None:
            return ("time", now_ms - interval)
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        return ("offset", value)
    elif isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return ("time", int(value.timestamp() * 1000))
    raise AMQPError(PRECONDITION_FAILED, f"invalid arg 'x-stream-offset' for {desc}: "
                    f"{{invalid_stream_offset_arg,{{{_amqp_type(value)},{_erl(value)}}}}}",
                    60, 20, hard=False)


