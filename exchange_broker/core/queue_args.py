"""Queue arguments (RabbitMQ's `x-` names): validated once at declaration into QueueOptions."""

from __future__ import annotations

from dataclasses import dataclass

from exchange_broker.protocol.constants import PRECONDITION_FAILED
from exchange_broker.protocol.errors import AMQPError

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(slots=True)
class QueueOptions:
    message_ttl: int | None = None          # ms
    expires: int | None = None              # ms of disuse before the queue is deleted
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False
    consumer_timeout: int | None = None     # ms
    deduplication: bool = False
    dedup_cache_size: int | None = None
    dedup_cache_ttl: int | None = None      # ms

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def amqp_type(v) -> str:
    """The AMQP field type name RabbitMQ prints in {unacceptable_type,...}."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "signedint" if -2 ** 31 <= v < 2 ** 31 else "long"
    if isinstance(v, float):
        return "double"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, (list, tuple)):
        return "array"
    if v is None:
        return "void"
    return "longstr"


def parse_queue_arguments(arguments: dict | None, describe: str) -> QueueOptions:
    """Validate arguments as RabbitMQ does; a bad value is a 406 naming the argument."""
    args = arguments or {}
    opts = QueueOptions()

    def bad(name: str, why: str) -> AMQPError:
        return AMQPError(PRECONDITION_FAILED, f"invalid arg '{name}' for {describe}: {why}", 50, 10,
                         hard=False)

    def int_arg(name: str, minimum: int, maximum: int | None = None) -> int | None:
        if name not in args:
            return None
        v = args[name]
        if not _is_int(v):
            raise bad(name, f'"expected integer, got {amqp_type(v)}"')
        if v < 0:
            raise bad(name, f"{{value_negative,{v}}}")
        if v < minimum:
            raise bad(name, f"{{value_zero,{v}}}")
        if maximum is not None and v > maximum:
            raise bad(name, f"{{max_value_exceeded,{v}}}")
        return v

    opts.message_ttl = int_arg("x-message-ttl", 0)
    opts.expires = int_arg("x-expires", 1)
    opts.max_length = int_arg("x-max-length", 0)
    opts.max_length_bytes = int_arg("x-max-length-bytes", 0)
    opts.max_priority = int_arg("x-max-priority", 0, 255)
    opts.consumer_timeout = int_arg("x-consumer-timeout", 1)
    opts.dedup_cache_size = int_arg("x-cache-size", 1)
    opts.dedup_cache_ttl = int_arg("x-cache-ttl", 1)
    if "x-overflow" in args:
        v = _text(args["x-overflow"])
        if v not in OVERFLOW_MODES:
            raise bad("x-overflow", "invalid_overflow")
        opts.overflow = v
    if "x-dead-letter-exchange" in args:
        v = _text(args["x-dead-letter-exchange"])
        if not isinstance(v, str):
            raise bad("x-dead-letter-exchange", "{unacceptable_type}")
        opts.dead_letter_exchange = v
    if "x-dead-letter-routing-key" in args:
        v = _text(args["x-dead-letter-routing-key"])
        if not isinstance(v, str):
            raise bad("x-dead-letter-routing-key", "{unacceptable_type}")
        if opts.dead_letter_exchange is None:
            raise bad("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
        opts.dead_letter_routing_key = v
    for name in ("x-single-active-consumer", "x-message-deduplication"):
        if name in args and not isinstance(args[name], bool):
            raise bad(name, f"{{unacceptable_type,{amqp_type(args[name])}}}")
    opts.single_active_consumer = bool(args.get("x-single-active-consumer", False))
    opts.deduplication = bool(args.get("x-message-deduplication", False))
    return opts
