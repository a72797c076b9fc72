"""``exchange-broker serve --config FILE``: settings from a file, so a container starts configured.

Two formats, chosen by the file name:

* ``*.toml``: a flat TOML table whose keys are :class:`~exchange_broker.config.Config`'s settings,
  named as their flags without the dashes (``frame_max = 131072``, ``load_definitions = "d.json"``;
  ``frame-max`` is accepted too). An unknown key is an error naming it.
* anything else: RabbitMQ's ``rabbitmq.conf`` (sysctl style: ``key = value`` lines, ``#`` comments).
  The keys that map onto a setting are in :data:`RABBITMQ_KEYS`; any other key is reported back
  (``serve`` logs a warning naming it) and ignored, so a RabbitMQ file with settings this broker
  has no use for (``cluster_formation.*``, ``log.file``) still starts it.

A value is checked and converted like its flag (a one-line :class:`ConfigFileError` naming the file,
the line and the key). Precedence: a flag on the command line, then its ``EXCHANGE_BROKER_*``
variable, then the file, then the default.
"""
from __future__ import annotations

import tomllib
from dataclasses import fields
from typing import Any, Callable

from exchange_broker.config import Config


class ConfigFileError(ValueError):
    """The file cannot be read or holds a bad key or value (one line)."""


def _tcp_listener(value: str) -> dict:
    """``listeners.tcp.default``: a port, or ``host:port`` (``[::1]:5672`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        return {"port": value}
    return {"host": host.strip("[]"), "port": port}


def _ms_to_seconds(value: str) -> float:
    return int(value) / 1000


def _verify(value: str) -> bool:
    if value not in ("verify_peer", "verify_none"):
        raise ValueError("expected verify_peer or verify_none")
    return value == "verify_peer"


def _log_level(value: str) -> str:
    return {"warn": "WARNING", "warning": "WARNING", "critical": "ERROR", "none": "ERROR"}.get(
        value.lower(), value.upper())


# rabbitmq.conf key -> Config field, or a function of the raw text giving {field: value}
RABBITMQ_KEYS: dict[str, str | Callable[[str], dict]] = {
    "listeners.tcp.default": _tcp_listener,
    "listeners.ssl.default": "tls_port",
    "ssl_options.certfile": "tls_cert",
    "ssl_options.keyfile": "tls_key",
    "ssl_options.cacertfile": "tls_ca",
    "ssl_options.password": "tls_key_password",
    "ssl_options.verify": lambda v: {"tls_verify_peer": _verify(v)},
    "ssl_options.fail_if_no_peer_cert": "tls_fail_if_no_peer_cert",
    "default_user": "default_user",
    "default_pass": "default_pass",
    "vm_memory_high_watermark.relative": "memory_high_watermark",
    "vm_memory_high_watermark.absolute": "memory_high_watermark",
    "disk_free_limit.absolute": "disk_free_limit",
    "heartbeat": "heartbeat",
    "frame_max": "frame_max",
    "channel_max": "channel_max",
    "max_message_size": "max_message_size",
    "connection_max": lambda v: {"max_connections": 0 if v == "infinity" else v},
    "consumer_timeout": "consumer_timeout",
    "handshake_timeout": lambda v: {"handshake_timeout": _ms_to_seconds(v)},
    "load_definitions": "load_definitions",
    "management.tcp.port": "admin_port",
    "management.tcp.ip": "admin_host",
    "management.load_definitions": "load_definitions",
    "log.console.level": lambda v: {"log_level": _log_level(v)},
    "log.default.level": lambda v: {"log_level": _log_level(v)},
    "queue_leader_locator": "queue_leader_locator",
    "mqtt.vhost": "mqtt_vhost",
    "mqtt.ignore_colons_in_username": "mqtt_ignore_colons_in_username",
}

_FIELDS = {f.name: f for f in fields(Config)}
_NOT_FROM_A_FILE = ("config",)


def load(path: str) -> tuple[dict[str, Any], list[str]]:
    """The settings of the file at ``path`` ({field: value}, each checked) and the rabbitmq.conf
    keys it ignored."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: {exc.strerror or exc}") from None
    if path.endswith(".toml"):
        return _from_toml(path, data), []
    return _from_rabbitmq_conf(path, data)


def _from_toml(path: str, data: bytes) -> dict[str, Any]:
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"--config {path}: not valid TOML: {exc}") from None
    out = {}
    for key, value in doc.items():
        name = key.replace("-", "_")
        if name not in _FIELDS or name in _NOT_FROM_A_FILE:
            raise ConfigFileError(f"--config {path}: unknown setting '{key}' (the settings are the "
                                  f"flags of 'exchange-broker serve', e.g. frame_max)")
        out[name] = _convert(path, key, name, value)
    return out


def _from_rabbitmq_conf(path: str, data: bytes) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    ignored = []
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.split(" #", 1)[0].strip()
        where = f"line {number}"
        if not sep or not key:
            raise ConfigFileError(f"--config {path}: {where}: expected 'key = value', got {line!r}")
        target = RABBITMQ_KEYS.get(key)
        if target is None:
            ignored.append(key)
            continue
        try:
            pairs = {target: value} if isinstance(target, str) else target(value)
        except ValueError as exc:
            raise ConfigFileError(f"--config {path}: {where}: bad value for '{key}': {exc}") from None
        for name, v in pairs.items():
            out[name] = _convert(path, key, name, v, where)
    return out, ignored


def _convert(path: str, key: str, name: str, value: Any, where: str = "") -> Any:
    """``value`` as the field's type (text is converted as its flag would be)."""
    kind = _FIELDS[name].metadata["type"]
    at = f"{where}: " if where else ""
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("true", "false"):
                return str(value).lower() == "true"
            raise ValueError("expected true or false")
        if isinstance(value, bool) or (kind is int and isinstance(value, float)) or \
                (kind in (int, float) and not isinstance(value, (int, float, str))):
            raise ValueError(f"expected {kind.__name__}")
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigFileError(f"--config {path}: {at}bad value for '{key}': {value!r} ({exc})") from None
