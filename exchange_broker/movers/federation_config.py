"""Federation upstreams and upstream sets (components ``federation-upstream`` and
``federation-upstream-set``): RabbitMQ's keys, checks and defaults
(``rabbit_federation_parameters``), as :class:`Upstream`."""

from __future__ import annotations

from dataclasses import dataclass

from exchange_broker.movers import uris
from exchange_broker.movers.validation import ParameterError, binary, boolean, enum, erl, number, proplist, uri

SHARED = {
    "exchange": (binary, False), "queue": (binary, False), "consumer-tag": (binary, False),
    "prefetch-count": (number, False), "reconnect-delay": (number, False), "max-hops": (number, False),
    "expires": (number, False), "message-ttl": (number, False), "trust-user-id": (boolean, False),
    "ack-mode": (enum("no-ack", "on-publish", "on-confirm"), False),
    "resource-cleanup-mode": (enum("default", "never"), False), "queue-type": (enum("classic", "quorum"), False),
    "ha-policy": (binary, False), "bind-nowait": (boolean, False),
    "channel-use-mode": (enum("multiple", "single"), False),
}
UPSTREAM = {"uri": (uri, True), **SHARED}
SET_MEMBER = {"upstream": (binary, True), **SHARED}


@dataclass(frozen=True)
class Upstream:
    name: str
    uris: tuple[str, ...]
    exchange: str | None
    queue: str | None
    prefetch: int
    reconnect_delay: float
    max_hops: int
    expires: int | None
    message_ttl: int | None
    ack_mode: str
    trust_user_id: bool


def parse_upstream(name: str, value) -> dict:
    proplist(name, UPSTREAM, value)
    return value


def parse_set(name: str, value) -> list:
    if not isinstance(value, list):
        raise ParameterError(f"{name} should be a list, actually was {erl(value)}")
    for member in value:
        proplist(name, SET_MEMBER, member)
    return value


def upstream(name: str, value: dict, overrides: dict | None = None) -> Upstream:
    """The upstream ``name`` (its checked value), with a set member's overrides."""
    v = {**value, **(overrides or {})}
    return Upstream(name=name, uris=tuple(uris.uri_list(v["uri"])), exchange=v.get("exchange"),
                    queue=v.get("queue"), prefetch=int(v.get("prefetch-count", 1000)),
                    reconnect_delay=float(v.get("reconnect-delay", 5)), max_hops=int(v.get("max-hops", 1)),
                    expires=v.get("expires"), message_ttl=v.get("message-ttl"),
                    ack_mode=v.get("ack-mode", "on-confirm"), trust_user_id=v.get("trust-user-id", False))
