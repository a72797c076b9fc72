"""Authentication backends that reach the network (OAuth 2.0's JWKS, LDAP) and the chain that
``--auth-backends`` builds from them; the pure parts are in ``core/`` (``auth_backends.py``,
``oauth2_scopes.py``, ``ldap_queries.py``)."""
