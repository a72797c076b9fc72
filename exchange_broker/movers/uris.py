"""AMQP URIs of shovels and federation upstreams: parsing (RabbitMQ's ``amqp_uri`` rules, the
subset this broker's client supports) and redaction for listings.

``amqp://`` with no host means this broker (the parameter's own vhost unless the URI names one).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

DEFAULT_PORT = 5672


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
    if parts.scheme == "amqps":
        raise UriError("amqps is not supported by this broker's shovels yet")
    if parts.scheme != "amqp":
        raise UriError("bad_scheme")
    host = parts.hostname or ""
    user = unquote(parts.username) if parts.username is not None else "guest"
    password = unquote(parts.password) if parts.password is not None else "guest"
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if "/" in path:
        raise UriError("bad_vhost (a '/' in a vhost name is written %2F)")
    vhost = unquote(path) if parts.path else None
    heartbeat = 10.0
    for item in filter(None, parts.query.split("&")):
        key, _, value = item.partition("=")
        if key == "heartbeat":
            try:
                heartbeat = float(value)
            except ValueError:
                raise UriError(f"heartbeat={value!r} is not a number") from None
    return Endpoint(uri, host, port or DEFAULT_PORT, user, password, vhost, heartbeat)


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
