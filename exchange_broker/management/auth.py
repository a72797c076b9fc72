"""The admin API's login (RabbitMQ's management rules): HTTP Basic (a user name and password, or
an OAuth 2.0 token as the password) or ``Authorization: Bearer <token>``, both through the
broker's one login (``Broker.login``: the ``--auth-backends`` chain)."""

from __future__ import annotations

import base64
import binascii

from fastapi import Depends, Request
from fastapi.security import HTTPBasic

from exchange_broker.auth.offload import authenticate as login
from exchange_broker.core.auth_backends import LoginRefused
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
    if scheme.lower() == "bearer" and value.strip():
        return "", value.strip()  # a token: the oauth2 backend takes its user from it
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
    return await authenticate(broker, user, password, client.host if client else "")


async def authenticate(broker, username: str, password: str, peer_host: str = "") -> Principal:
    """RabbitMQ's management login: the backend chain allows the user (loopback-only users from
    localhost only), and it has a management tag."""
    try:
        found = await login(broker, username, password, peer_host, "PLAIN", "admin API")
    except LoginRefused as refused:
        if refused.reasons and refused.reasons[0][1] == "loopback-only user":
            raise login_failed("User can only log in via localhost") from None
        raise login_failed() from None
    if not any(t in MANAGEMENT_TAGS for t in found.tags):
        raise login_failed("Not management user")
    if found.authz is None:
        vhosts = {vh for (u, vh) in broker.permissions if u == found.name}
    else:
        vhosts = {vh for vh in broker.vhosts if found.authz.vhost_access(vh)}
    return Principal(found.name, found.tags, vhosts, found.authz)
