"""Which vhost an MQTT connection opens, as RabbitMQ's plugin chooses it (without client
certificate logins): the ``vhost:user`` form of the user name (split at its last colon, unless
``mqtt.ignore_colons_in_username``), else the listener port's vhost in the port-to-vhost mapping
(RabbitMQ's ``mqtt_port_to_vhost_mapping`` global parameter: ``{"1883": "vhost1", ...}``), else
the default (``mqtt.vhost``)."""

from __future__ import annotations

import json


def parse_port_mapping(text: str | None) -> dict[int, str]:
    """``{"1883": "vhost1", "8883": "vhost2"}`` -> {1883: "vhost1", ...}; a ValueError saying
    what is wrong otherwise (None or empty: no mapping)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ValueError(f"is not JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(raw, dict):
        raise ValueError('must be a JSON object of port -> vhost, e.g. {"1883": "vhost1"}')
    out: dict[int, str] = {}
    for port, vhost in raw.items():
        if not (port.isdigit() and 0 < int(port) <= 65535):
            raise ValueError(f"has {port!r} where a port number (1-65535) belongs")
        if not isinstance(vhost, str) or not vhost:
            raise ValueError(f"maps port {port} to {vhost!r}, not to a vhost name")
        out[int(port)] = vhost
    return out


def choose(user: str | None, port: int, settings) -> tuple[str, str | None]:
    """(vhost, user name without the vhost) for a CONNECT's user name on listener ``port``."""
    if user and ":" in user and not settings.ignore_colons_in_username:
        vhost, name = user.rsplit(":", 1)
        return vhost, name
    return settings.port_vhosts.get(port, settings.vhost), user
