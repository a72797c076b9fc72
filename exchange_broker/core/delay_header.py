"""The ``x-delay`` header of a message published to an ``x-delayed-message`` exchange, read as
RabbitMQ's rabbitmq_delayed_message_exchange plugin reads it (``core/delayed.py`` holds the
messages)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from exchange_broker.core.message import Message
from exchange_broker.protocol import codec
from exchange_broker.protocol.errors import AMQPError

MAX_DELAY = 2 ** 32 - 1  # the plugin's bound (Erlang's max timer); beyond it: no delay
X_DELAY = b"x-delay"
_INT_STR = re.compile(r"[+-]?[0-9]+\Z")


def delay_value(value) -> int | None:
    """The plugin's reading of an x-delay value: integer types as they are, floats and decimals
    truncated, strings parsed as a decimal integer; held only when 0 < delay <= 2^32-1."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        delay = value
    elif isinstance(value, (float, Decimal)):
        if not math.isfinite(value):
            return None
        delay = int(value)  # truncated, like the plugin
    elif isinstance(value, (str, bytes)):
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return None
        if not _INT_STR.match(value):
            return None
        delay = int(value)
    else:  # byte arrays, timestamps, tables, arrays, void (codec.NOT_SCALAR)
        return None
    return delay if 0 < delay <= MAX_DELAY else None


def message_delay(msg: Message) -> int | None:
    """The delay of a published message, read from its raw properties (no full decode)."""
    value = codec.raw_header(msg.properties, X_DELAY)
    if value is codec.UNREADABLE:  # an odd table: take the decoder's word for it
        try:
            value = (msg.headers or {}).get("x-delay")
        except AMQPError:
            return None
    return delay_value(value)
