"""RabbitMQ's mapping of MQTT topics onto ``amq.topic`` routing keys: ``/`` and ``.`` swap places,
the single-level wildcard ``+`` is AMQP's ``*`` and ``#`` stays ``#``; and the rules MQTT sets for
topic names (publish) and topic filters (subscribe)."""

from __future__ import annotations

EXCHANGE = "amq.topic"
_TO_AMQP = str.maketrans({"/": ".", ".": "/", "+": "*"})
_TO_MQTT = str.maketrans({".": "/", "/": ".", "*": "+"})


def to_routing_key(topic: str) -> str:
    return topic.translate(_TO_AMQP)


def to_topic(routing_key: str) -> str:
    return routing_key.translate(_TO_MQTT)


def valid_name(topic: str) -> bool:
    """A PUBLISH topic: not empty, no wildcard."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE filter: ``+`` fills a whole level, ``#`` only the whole last level."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def matches(topic_filter: str, topic: str) -> bool:
    """Does a topic name match a filter (MQTT's rules: ``$`` topics only match filters naming
    their first level)?"""
    f, t = topic_filter.split("/"), topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def shared(topic_filter: str) -> tuple[str, str] | None:
    """``$share/group/filter`` -> (group, filter); None for an ordinary filter."""
    if not topic_filter.startswith("$share/"):
        return None
    parts = topic_filter.split("/", 2)
    if len(parts) < 3 or not parts[1] or "+" in parts[1] or "#" in parts[1]:
        return ("", "")  # malformed: the caller refuses it
    return parts[1], parts[2]
