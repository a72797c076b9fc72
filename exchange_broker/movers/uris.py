"""AMQP URIs of shovels and federation upstreams: parsing (RabbitMQ's ``amqp_uri`` rules, the
subset this broker's client supports) and redaction for listings.

``amqp://`` with no host means this broker (the parameter's own vhost unless the URI names one).
``amqps://`` is TLS (port 5671 by default), set by RabbitMQ's query parameters: ``cacertfile``,
``certfile``, ``keyfile``, ``verify`` (``verify_peer``, the default, or ``verify_none``),
``server_name_indication`` (the name to ask for and check, ``disable``: none). Hostless
``amqps://`` is this broker too (over loopback, without TLS).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

DEFAULT_PORT = 5672
DEFAULT_TLS_PORT = 5671
TLS_KEYS = ("cacertfile", "certfile", "keyfile", "verify", "server_name_indication")
VERIFY = ("verify_peer", "verify_none")


class UriError(ValueError):
    pass


@dataclass(frozen=True)
class Endpoint:
    uri: str            # as given (listings show it redacted)
    host: str           # "" : this broker
    port: int
    user: str
    password: str
    vhost: str | None   # None: the parameter's vhost (``amqp://`` / ``amqp://host``)
    heartbeat: float
    tls: dict | None = None   # amqps: the TLS query parameters given (TLS_KEYS)
    timeout: float = 10.0     # connection_timeout, in seconds

    @property
    def local(self) -> bool:
        return not self.host


def parse(uri: str) -> Endpoint:
    """One URI, or UriError with a one-line reason."""
    if not isinstance(uri, str):
        raise UriError(f"{uri!r} is not a string")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError as exc:
        raise UriError(str(exc)) from None
    if parts.scheme not in ("amqp", "amqps"):
        raise UriError("bad_scheme")
    host = parts.hostname or ""
    user = unquote(parts.username) if parts.username is not None else "guest"
    password = unquote(parts.password) if parts.password is not None else "guest"
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise UriError("bad_vhost (a '/' in a vhost name is written %2F)")
    vhost = unquote(path) if parts.path else None
    heartbeat, timeout = 10.0, 10.0
    tls = {} if parts.scheme == "amqps" else None
    for item in filter(None, parts.query.split("&")):
        key, _, value = item.partition("=")
        value = unquote(value)
        if key in ("heartbeat", "connection_timeout"):
            try:
                number = float(value)
            except ValueError:
                raise UriError(f"{key}={value!r} is not a number") from None
            if key == "heartbeat":
                heartbeat = number
            else:
                timeout = number / 1000  # milliseconds, as RabbitMQ's
        elif key in TLS_KEYS and tls is not None:
            if key == "verify" and value not in VERIFY:
                raise UriError(f"verify={value!r}: should be one of {', '.join(VERIFY)}")
            tls[key] = value
    return Endpoint(uri, host, port or (DEFAULT_TLS_PORT if tls is not None else DEFAULT_PORT), user, password,
                    vhost, heartbeat, tls, timeout)


def uri_list(value) -> list[str]:
    """``src-uri`` / ``dest-uri`` / ``uri``: a string or a list of them."""
    return [value] if isinstance(value, str) else list(value)


def redact(uri: str) -> str:
    """The URI with its password hidden (RabbitMQ's listings: ``amqp://user@host``)."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit((parts.scheme, f"{user}@{netloc[1]}", parts.path, parts.query, parts.fragment))
