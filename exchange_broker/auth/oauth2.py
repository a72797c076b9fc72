"""The OAuth 2.0 backend (RabbitMQ's ``rabbitmq_auth_backend_oauth2``): a JWT access token as the
password, any user name (or none).

The token's signature is checked with PyJWT against the issuer's keys: a JWKS document fetched
from ``--auth-oauth2-jwks-url`` (kept, and fetched again when a token names a key id not in it,
so that a rotated key works at once; the new document replaces the old, so a key the issuer
dropped stops working then), or PEM public keys from ``--auth-oauth2-signing-key``
files. Algorithms: RS256/384/512, PS256/384/512, ES256/384/512, EdDSA (never ``none``, never
HMAC with a public key). ``exp`` is required and checked, ``nbf`` and ``iat`` when present;
``iss`` when ``--auth-oauth2-issuer`` is set; ``aud`` must name the resource server id (or
``--auth-oauth2-audience``) unless ``--auth-oauth2-verify-aud false``.

The user's name is the first string claim of ``--auth-oauth2-preferred-username-claims``, then
``sub``, then ``client_id``; its tags and permissions come from its scopes
(``core/oauth2_scopes.py``).

Only a token whose key is not known yet needs the network (``needs_io``): the chain then runs
``login`` off the event loop, with its timeout.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import jwt
from jwt import PyJWK, PyJWKClient

from exchange_broker.core.auth_backends import AuthenticatedUser, BackendRefusal
from exchange_broker.core.oauth2_scopes import ScopeAuthz, token_scopes, username_from

log = logging.getLogger("exchange_broker.auth.oauth2")

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY = 0  # seconds of clock skew tolerated on exp/nbf (RabbitMQ: none)


@dataclass
class OAuth2Settings:
    resource_server_id: str
    jwks_url: str = ""
    signing_keys: dict[str, str] = field(default_factory=dict)  # key id -> PEM text
    default_key: str = ""
    issuer: str = ""
    audience: str = ""           # empty: the resource server id
    verify_aud: bool = True
    additional_scopes_key: str = ""
    preferred_username_claims: list[str] = field(default_factory=list)
    scope_prefix: str | None = None
    timeout: float = 5.0


def looks_like_jwt(password: str | None) -> bool:
    return bool(password) and password.count(".") == 2 and password[:2] in ("ey", "eY")


class OAuth2Backend:
    name = "oauth2"

    def __init__(self, settings: OAuth2Settings) -> None:
        self.s = settings
        self._file_keys = {kid: _pem_key(pem) for kid, pem in settings.signing_keys.items()}
        self._keys: dict[str, PyJWK | object] = dict(self._file_keys)
        self._lock = threading.Lock()
        self._client = PyJWKClient(settings.jwks_url, cache_jwk_set=False, cache_keys=False,
                                   timeout=settings.timeout) if settings.jwks_url else None

    # -- the chain's questions ---------------------------------------------------------------
    def needs_io(self, username: str, password: str | None) -> bool:
        if self._client is None or not looks_like_jwt(password):
            return False
        try:
            kid = jwt.get_unverified_header(password).get("kid")
        except jwt.PyJWTError:
            return False
        return self._key_for(kid) is None

    def login(self, username: str, password: str | None, peer_host: str) -> AuthenticatedUser | None:
        if not looks_like_jwt(password):
            return None  # not a token: another backend's password
        claims = self.verify(password)
        return self.user_from(claims)

    # -- verification --------------------------------------------------------------------------
    def _key_for(self, kid: str | None):
        if kid is not None:
            return self._keys.get(kid)
        if self.s.default_key:
            return self._keys.get(self.s.default_key)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    def _refresh(self, kid: str | None) -> None:
        """Fetch the JWKS document (blocking: called off the event loop). Logins waiting for the
        same new key share one fetch: the first brings it, the others find it."""
        with self._lock:  # the new document replaces the old one: a key the issuer dropped goes
            if self._key_for(kid) is not None:
                return
            jwks = self._client.get_jwk_set(refresh=True)
            self._keys = {**self._file_keys, **{k.key_id: k for k in jwks.keys if k.key_id}}
        log.info("fetched the JWKS of %s: key ids %s", self.s.jwks_url,
                 ", ".join(sorted(k for k in self._keys)) or "none")

    def verify(self, token: str) -> dict:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise BackendRefusal(f"provided token is invalid: {exc}") from None
        kid = header.get("kid")
        key = self._key_for(kid)
        if key is None and self._client is not None:
            try:
                self._refresh(kid)
            except Exception as exc:  # the issuer is down: refused, said once in the log
                raise BackendRefusal(f"cannot fetch the signing keys from {self.s.jwks_url}: {exc}") from None
            key = self._key_for(kid)
        if key is None:
            raise BackendRefusal(f"no signing key with id '{kid}'" if kid else "the token names no key id")
        if header.get("alg") not in ALGORITHMS:
            raise BackendRefusal(f"token algorithm '{header.get('alg')}' is not accepted")
        audience = self.s.audience or self.s.resource_server_id
        options = {"require": ["exp"], "verify_aud": self.s.verify_aud}
        try:
            return jwt.decode(token, key.key if isinstance(key, PyJWK) else key, algorithms=ALGORITHMS,
                              audience=audience if self.s.verify_aud else None,
                              issuer=self.s.issuer or None, options=options, leeway=LEEWAY)
        except jwt.ExpiredSignatureError:
            raise BackendRefusal("provided JWT token has expired") from None
        except jwt.PyJWTError as exc:
            raise BackendRefusal(f"provided token is invalid: {exc}") from None

    def user_from(self, claims: dict) -> AuthenticatedUser:
        scopes = token_scopes(claims, self.s.resource_server_id, self.s.additional_scopes_key,
                              self.s.scope_prefix)
        authz = ScopeAuthz(scopes, claims)
        exp = claims.get("exp")
        return AuthenticatedUser(username_from(claims, self.s.preferred_username_claims), authz.tags,
                                 self.name, authz, float(exp) if isinstance(exp, (int, float)) else None,
                                 claims)


def _pem_key(pem: str):
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from cryptography.x509 import load_pem_x509_certificate
    data = pem.encode()
    if b"CERTIFICATE" in data:
        return load_pem_x509_certificate(data).public_key()
    return load_pem_public_key(data)


def load_signing_keys(spec: str) -> dict[str, str]:
    """``--auth-oauth2-signing-key``: ``kid=FILE`` entries separated by commas (a bare FILE is
    key id ``default``); each file a PEM public key or certificate."""
    keys: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        kid, sep, path = item.partition("=")
        if not sep:
            kid, path = "default", item
        try:
            with open(path, encoding="ascii") as f:
                keys[kid] = f.read()
        except OSError as exc:
            raise ValueError(f"--auth-oauth2-signing-key: cannot read {path}: {exc.strerror}") from None
        try:
            _pem_key(keys[kid])
        except ValueError as exc:
            raise ValueError(f"--auth-oauth2-signing-key: {path} is not a PEM public key: {exc}") from None
    return keys
