"""``--auth-backends`` -> the broker's backend chain (``core/auth_backends.AuthChain``)."""

from __future__ import annotations

import asyncio

from exchange_broker.auth.offload import Offload
from exchange_broker.core.auth_backends import AuthChain, InternalBackend


def oauth2_backend(config):
    from exchange_broker.auth.oauth2 import OAuth2Backend, OAuth2Settings, load_signing_keys
    if not config.auth_oauth2_jwks_url and not config.auth_oauth2_signing_key:
        raise ValueError("--auth-backends oauth2 needs --auth-oauth2-jwks-url or --auth-oauth2-signing-key")
    return OAuth2Backend(OAuth2Settings(
        resource_server_id=config.auth_oauth2_resource_server_id,
        jwks_url=config.auth_oauth2_jwks_url,
        signing_keys=load_signing_keys(config.auth_oauth2_signing_key),
        default_key=config.auth_oauth2_default_key,
        issuer=config.auth_oauth2_issuer,
        audience=config.auth_oauth2_audience,
        verify_aud=config.auth_oauth2_verify_aud == "true",
        additional_scopes_key=config.auth_oauth2_additional_scopes_key,
        preferred_username_claims=[c.strip() for c in config.auth_oauth2_preferred_username_claims.split(",")
                                   if c.strip()],
        scope_prefix=config.auth_oauth2_scope_prefix,
        timeout=config.auth_timeout))


def ldap_backend(config):
    from exchange_broker.auth.ldap import LdapBackend, settings_from
    return LdapBackend(settings_from(config))


def make_chain(broker, config, loop: asyncio.AbstractEventLoop | None) -> AuthChain:
    """The backends of ``config`` in order; their network work runs on ``loop``'s executor."""
    makers = {"internal": lambda c: InternalBackend(broker), "oauth2": oauth2_backend, "ldap": ldap_backend}
    backends = [makers[name](config) for name in config.auth_backend_list]
    offload = Offload(loop, config.auth_timeout) if loop is not None else None
    return AuthChain(backends, offload)
