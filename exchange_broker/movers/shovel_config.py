"""A dynamic shovel's parameter value (component ``shovel``): RabbitMQ's keys, checks and
defaults (``rabbit_shovel_parameters``), as one :class:`ShovelConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from exchange_broker.movers import uris
from exchange_broker.movers.validation import (ParameterError, binary, boolean, enum, erl, number,
                                               proplist, table, uri)

ACK_MODES = ("no-ack", "on-publish", "on-confirm")


def _delete_after(name: str, v) -> None:
    if v in ("never", "queue-length") or (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
        return
    raise ParameterError(f'{name} should be a number greater than or equal to 0, "never" or '
                         f'"queue-length", actually was {erl(v)}')


def _protocol(name: str, v) -> None:
    if v != "amqp091":
        raise ParameterError(f"{name} should be one of [amqp091], actually was {erl(v)} "
                             "(AMQP 1.0 shovels are not supported)")


RULES = {
    "src-uri": (uri, True), "dest-uri": (uri, True),
    "src-protocol": (_protocol, False), "dest-protocol": (_protocol, False),
    "src-exchange": (binary, False), "src-exchange-key": (binary, False), "src-queue": (binary, False),
    "src-queue-args": (table, False), "src-consumer-args": (table, False),
    "src-prefetch-count": (number, False), "prefetch-count": (number, False),
    "src-delete-after": (_delete_after, False), "delete-after": (_delete_after, False),
    "src-predeclared": (boolean, False), "dest-predeclared": (boolean, False),
    "dest-exchange": (binary, False), "dest-exchange-key": (binary, False), "dest-queue": (binary, False),
    "dest-queue-args": (table, False),
    "dest-add-forward-headers": (boolean, False), "add-forward-headers": (boolean, False),
    "dest-add-timestamp-header": (boolean, False), "add-timestamp-header": (boolean, False),
    "dest-publish-properties": (table, False), "publish-properties": (table, False),
    "reconnect-delay": (number, False), "ack-mode": (enum(*ACK_MODES), False),
}


@dataclass(frozen=True)
class ShovelConfig:
    src_uris: tuple[str, ...]
    dest_uris: tuple[str, ...]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None
    src_queue_args: dict
    dest_queue_args: dict
    src_predeclared: bool
    dest_predeclared: bool
    prefetch: int
    reconnect_delay: float
    ack_mode: str
    delete_after: object  # "never", "queue-length" or a count
    forward_headers: bool
    timestamp_header: bool
    publish_properties: dict


def _one_of(value: dict, a: str, b: str, zero: str | None) -> None:
    given = (a in value) + (b in value)
    if given == 2:
        raise ParameterError(f"Cannot specify '{a}' and '{b}'")
    if given == 0 and zero is not None:
        raise ParameterError(zero)


def parse(name: str, value) -> ShovelConfig:
    """The checked value (ParameterError with RabbitMQ's text otherwise)."""
    proplist(name, RULES, value)
    _one_of(value, "src-exchange", "src-queue", "Must specify 'src-exchange' or 'src-queue'")
    _one_of(value, "dest-exchange", "dest-queue", None)
    delete_after = value.get("src-delete-after", value.get("delete-after", "never"))
    ack_mode = value.get("ack-mode", "on-confirm")
    if isinstance(delete_after, int) and ack_mode == "no-ack":
        raise ParameterError("Cannot specify 'no-ack' and numerical 'delete-after'")

    def pick(new: str, old: str, default):
        return value.get(new, value.get(old, default))

    prefetch = pick("src-prefetch-count", "prefetch-count", 1000)
    return ShovelConfig(
        src_uris=tuple(uris.uri_list(value["src-uri"])), dest_uris=tuple(uris.uri_list(value["dest-uri"])),
        src_queue=value.get("src-queue"), src_exchange=value.get("src-exchange"),
        src_exchange_key=value.get("src-exchange-key", ""),
        dest_queue=value.get("dest-queue"), dest_exchange=value.get("dest-exchange"),
        dest_exchange_key=value.get("dest-exchange-key"),
        src_queue_args=value.get("src-queue-args", {}), dest_queue_args=value.get("dest-queue-args", {}),
        src_predeclared=value.get("src-predeclared", False), dest_predeclared=value.get("dest-predeclared", False),
        prefetch=max(int(prefetch), 0), reconnect_delay=float(value.get("reconnect-delay", 1)),
        ack_mode=ack_mode, delete_after=delete_after,
        forward_headers=pick("dest-add-forward-headers", "add-forward-headers", False),
        timestamp_header=pick("dest-add-timestamp-header", "add-timestamp-header", False),
        publish_properties=pick("dest-publish-properties", "publish-properties", {}))
