"""HTTP Basic authentication against the broker's own users (RabbitMQ's management rules)."""

from __future__ import annotations

import base64
import binascii

from fastapi import Depends, Request
from fastapi.security import HTTPBasic

from exchange_broker.core.auth import is_loopback
from exchange_broker.management.common import Principal, ServiceError

REALM = "exchange-broker Management"
MANAGEMENT_TAGS = ("administrator", "monitoring", "policymaker", "management")


class _DocumentedBasic(HTTPBasic):
    """Declares HTTP Basic in the OpenAPI document; the header is parsed by ``credentials`` so that
    a malformed one gets the same 401 body as a wrong password (and UTF-8 passwords work)."""

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        return None


basic_scheme = _DocumentedBasic(realm=REALM, auto_error=False)


def login_failed(reason: str = "Login failed") -> ServiceError:
    return ServiceError(401, "not_authorized", reason)


def credentials(request: Request) -> tuple[str, str]:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        raise login_failed()
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise login_failed() from None
    user, sep, password = decoded.partition(":")
    if not sep:
        raise login_failed()
    return user, password


async def require_user(request: Request, _doc: None = Depends(basic_scheme)) -> Principal:
    """FastAPI dependency: the authenticated management user, or a 401."""
    user, password = credentials(request)
    client = request.client
    broker = request.app.state.admin.broker
    return authenticate(broker, user, password, is_loopback(client.host if client else None))


def authenticate(broker, username: str, password: str, peer_is_loopback: bool = True) -> Principal:
    """RabbitMQ's management login: a known user, the right password, loopback-only users from
    localhost only, and a management tag."""
    user = broker.users.get(username)
    if user is None or not user.check(password):
        raise login_failed()
    if username in broker.loopback_users and not peer_is_loopback:
        raise login_failed("User can only log in via localhost")
    if not any(t in MANAGEMENT_TAGS for t in user.tags):
        raise login_failed("Not management user")
    vhosts = {vh for (u, vh) in broker.permissions if u == username}
    return Principal(username, user.tags, vhosts)
