"""Stream filtering over AMQP 0-9-1 (RabbitMQ 3.13, rabbit_stream_queue:filter_spec/1).

* A publisher tags a message with the header ``x-stream-filter-value`` (a string; another type
  leaves the message unfiltered, as RabbitMQ reads only a utf8 value).
* A consumer asks with the basic.consume arguments ``x-stream-filter`` (a string, or an array whose
  string items count; anything else: no filtering, as RabbitMQ) and ``x-stream-match-unfiltered``
  (a bool; also deliver messages without a filter value; default false).

RabbitMQ filters whole chunks with a Bloom filter: a chunk is skipped when no wanted value can be in
it, otherwise all its messages go out, so a consumer may receive messages with other values (false
positives) and RabbitMQ's docs tell clients to filter again. This broker filters each message
exactly: a consumer with filters gets only messages whose value it asked for (and, with
match-unfiltered, those without a value). That is within RabbitMQ's contract (a client that
re-filters sees the same messages), only with no false positives. The queue argument
``x-stream-filter-size-bytes`` (the Bloom filter's size, 16-255) is checked as RabbitMQ checks it
and otherwise has no effect here.
"""
from __future__ import annotations

from exchange_broker.protocol import codec
from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

FILTER_VALUE = b"x-stream-filter-value"
FILTER_ARG = "x-stream-filter"
MATCH_UNFILTERED_ARG = "x-stream-match-unfiltered"
FILTER_SIZE_ARG = "x-stream-filter-size-bytes"


def _bytes(value) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return None


def filter_spec(arguments: dict | None) -> tuple[frozenset, bool] | None:
    """(wanted values as bytes, match unfiltered) of a consumer's arguments; None: no filtering."""
    args = arguments or {}
    raw = args.get(FILTER_ARG)
    if isinstance(raw, (list, tuple)):
        wanted = frozenset(b for b in map(_bytes, raw) if b is not None)
    else:
        one = _bytes(raw)
        if one is None:
            return None
        wanted = frozenset((one,))
    return wanted, args.get(MATCH_UNFILTERED_ARG) is True


def filter_value(properties: bytes) -> bytes | None:
    """A message's ``x-stream-filter-value`` (raw properties scanned in place); None: unfiltered."""
    if FILTER_VALUE not in properties:
        return None
    value = codec.raw_header(properties, FILTER_VALUE)
    return value if isinstance(value, bytes) else None


def wanted(spec: tuple[frozenset, bool], properties: bytes) -> bool:
    """Whether a consumer with filter ``spec`` gets a message with these properties."""
    value = filter_value(properties)
    if value is None:
        return spec[1]
    return value in spec[0]


def check_filter_size(desc: str, arguments: dict) -> None:
    """``x-stream-filter-size-bytes``: an integer from 16 to 255 (406 with RabbitMQ's texts)."""
    if FILTER_SIZE_ARG not in arguments:
        return
    value = arguments[FILTER_SIZE_ARG]
    if isinstance(value, bool) or not isinstance(value, int):
        raise AMQPError(PRECONDITION_FAILED, f"Invalid type for {FILTER_SIZE_ARG}", 50, 10, hard=False)
    if not 16 <= value <= 255:
        raise AMQPError(PRECONDITION_FAILED, f"Invalid value for {FILTER_SIZE_ARG}", 50, 10, hard=False)
