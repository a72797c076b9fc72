"""OAuth 2.0 scopes as permissions, as RabbitMQ's ``rabbit_oauth2_scope`` reads them. Pure.

A token's scopes (its ``scope`` claim, a space-separated string or a list, plus those found under
``--auth-oauth2-additional-scopes-key``) are kept when they start with the resource server id
and a dot (``rabbitmq.``), which is dropped. What remains:

* ``read:<vhost>/<resource>``, ``write:...``, ``configure:...``: the permission on matching
  resources (exchanges and queues alike) of matching vhosts; a third part
  ``/<routing_key>`` makes the scope grant topic access too (only such scopes do: on a topic
  exchange, RabbitMQ's oauth2 backend refuses a publish or bind that no scope with a routing key
  part allows);
* ``tag:<tag>``: a user tag (``tag:administrator``, ``tag:management`` ...).

Patterns are RabbitMQ's wildcards: ``*`` matches any run of characters, everything else matches
itself (percent-escapes such as ``%2F`` are decoded first); the whole name must match. Any scope
with a matching vhost pattern grants access to the vhost. In topic scopes ``{vhost}`` stands for
the vhost's name and ``{claim}`` for that string claim of the token (``{sub}``, ...).
"""

from __future__ import annotations

import re
from functools import lru_cache
from urllib.parse import unquote

PERMISSIONS = ("read", "write", "configure")
TAG_PREFIX = "tag:"


@lru_cache(maxsize=4096)
def _wildcard(pattern: str) -> re.Pattern:
    return re.compile("".join(".*" if part == "*" else re.escape(unquote(part))
                              for part in re.split(r"(\*)", pattern) if part), re.DOTALL)


def wildcard_match(value: str, pattern: str) -> bool:
    return _wildcard(pattern).fullmatch(value) is not None


def claim_at(claims: dict, path: str) -> list:
    """The values under a dotted claim path (``realm_access.roles``), following lists of maps."""
    values = [claims]
    for key in path.split("."):
        nxt = []
        for v in values:
            if isinstance(v, list):
                v = [x.get(key) for x in v if isinstance(x, dict) and key in x]
                nxt.extend(v)
            elif isinstance(v, dict) and key in v:
                nxt.append(v[key])
        values = nxt
    return values


def _as_scopes(value, rsid: str) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [str(v) for v in value if isinstance(v, str)]
    if isinstance(value, dict):  # a map keyed by resource server id: its scopes lack the prefix
        return [f"{rsid}.{s}" for s in _as_scopes(value.get(rsid), rsid)]
    return []


def token_scopes(claims: dict, rsid: str, additional_keys: str = "", prefix: str | None = None) -> list[str]:
    """The token's scopes with ``<rsid>.`` (or ``prefix``) required and dropped, sorted, unique."""
    raw = _as_scopes(claims.get("scope"), rsid)
    for key in additional_keys.split():
        for value in claim_at(claims, key):
            raw.extend(_as_scopes(value, rsid))
    prefix = f"{rsid}." if prefix is None else prefix
    return sorted({s[len(prefix):] for s in raw if s.startswith(prefix)})


def username_from(claims: dict, preferred: list[str]) -> str:
    """The first of the preferred claims that is a string (RabbitMQ adds ``sub``, ``client_id``)."""
    for claim in list(preferred) + ["sub", "client_id"]:
        value = claims.get(claim)
        if isinstance(value, str) and value:
            return value
    return "unknown"


def _parse(scope: str):
    perm, sep, rest = scope.partition(":")
    if not sep or perm not in PERMISSIONS:
        return None
    parts = rest.split("/")
    if len(parts) == 2:
        return perm, parts[0], parts[1], None
    if len(parts) == 3:
        return perm, parts[0], parts[1], parts[2]
    return None


class ScopeAuthz:
    """The grants of a token's scopes (``core/auth_backends.Authz``)."""

    def __init__(self, scopes: list[str], claims: dict | None = None) -> None:
        self.scopes = list(scopes)
        self.claims = claims or {}
        self.grants = [g for g in map(_parse, self.scopes) if g is not None]
        self.tags = sorted({s[len(TAG_PREFIX):] for s in self.scopes if s.startswith(TAG_PREFIX)})

    def vhost_access(self, vhost: str) -> bool:
        return any(wildcard_match(vhost, v) for _, v, _, _ in self.grants)

    def resource_access(self, vhost: str, kind: str, name: str, permission: str) -> bool:
        return any(p == permission and wildcard_match(vhost, v) and wildcard_match(name, n)
                   for p, v, n, _ in self.grants)

    def topic_access(self, vhost: str, exchange: str, routing_key: str, permission: str) -> bool:
        for p, v, n, rk in self.grants:
            if p != permission or rk is None:
                continue
            v, n, rk = (self._expand(x, vhost) for x in (v, n, rk))
            if wildcard_match(vhost, v) and wildcard_match(exchange, n) and wildcard_match(routing_key, rk):
                return True
        return False

    def _expand(self, pattern: str, vhost: str) -> str:
        if "{" not in pattern:
            return pattern

        def var(m: re.Match) -> str:
            name = m.group(1)
            if name == "vhost":
                return vhost
            value = self.claims.get(name)
            return value if isinstance(value, str) else name
        return re.sub(r"\{([^{}]*)\}", var, pattern)
