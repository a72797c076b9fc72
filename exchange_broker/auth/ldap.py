"""The LDAP backend (RabbitMQ's ``rabbitmq_auth_backend_ldap``), with ldap3 (pure Python).

A login binds to the directory as the user: its DN is ``--auth-ldap-user-dn-pattern`` with
``${username}`` filled in, or, with ``--auth-ldap-dn-lookup-attribute``, the entry found (with
an anonymous search) under ``--auth-ldap-dn-lookup-base`` whose attribute is the user name. A
wrong password refuses the login; an unknown user is "not mine" (the next backend is asked).
Then, still bound as the user (RabbitMQ's default ``other_bind = as_user``), the entries and
group memberships the queries need are read (``core/ldap_queries.needs``) and the tags, vhost,
resource and topic queries are answered from them for the rest of the connection.

Connections are kept in a pool (``--auth-ldap-pool-size`` idle ones) and rebound for each
login. ``--auth-ldap-use-ssl`` (LDAPS) or ``--auth-ldap-use-starttls`` with
``--auth-ldap-ssl-ca-file`` verify the server's certificate. Every socket operation has
``--auth-ldap-timeout``; the chain's own timeout (``--auth-timeout``) bounds the whole login.
Several ``--auth-ldap-servers`` are tried in order.
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
from dataclasses import dataclass, field

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars

from exchange_broker.core.auth_backends import AuthenticatedUser, BackendRefusal
from exchange_broker.core.ldap_queries import (LdapAuthz, LdapView, evaluate, fill, needs, norm_dn,
                                               parse, parse_tags)

log = logging.getLogger("exchange_broker.auth.ldap")
NESTING_MAX = 10  # levels of groups in groups followed by in_group_nested


@dataclass
class LdapSettings:
    servers: list[str]
    port: int = 389
    use_ssl: bool = False
    use_starttls: bool = False
    ca_file: str = ""
    user_dn_pattern: str = "${username}"
    dn_lookup_attribute: str = ""
    dn_lookup_base: str = ""
    group_lookup_base: str = ""
    vhost_access_query: list = field(default_factory=lambda: ["constant", True])
    resource_access_query: list = field(default_factory=lambda: ["constant", True])
    topic_access_query: list = field(default_factory=lambda: ["constant", True])
    tag_queries: dict = field(default_factory=lambda: {"administrator": ["constant", False]})
    pool_size: int = 64
    timeout: float = 5.0

    def queries(self) -> list:
        return [self.vhost_access_query, self.resource_access_query, self.topic_access_query,
                *self.tag_queries.values()]


def settings_from(config) -> LdapSettings:
    servers = [s.strip() for s in config.auth_ldap_servers.split(",") if s.strip()]
    if not servers:
        raise ValueError("--auth-backends ldap needs --auth-ldap-servers")
    s = LdapSettings(
        servers, config.auth_ldap_port, config.auth_ldap_use_ssl, config.auth_ldap_use_starttls,
        config.auth_ldap_ssl_ca_file, config.auth_ldap_user_dn_pattern, config.auth_ldap_dn_lookup_attribute,
        config.auth_ldap_dn_lookup_base, config.auth_ldap_group_lookup_base or config.auth_ldap_dn_lookup_base,
        parse(config.auth_ldap_vhost_access_query, "--auth-ldap-vhost-access-query"),
        parse(config.auth_ldap_resource_access_query, "--auth-ldap-resource-access-query"),
        parse(config.auth_ldap_topic_access_query, "--auth-ldap-topic-access-query"),
        parse_tags(config.auth_ldap_tag_queries), config.auth_ldap_pool_size, config.auth_ldap_timeout)
    need = needs(s.queries())
    if (need["member_of"] or need["nested"]) and not s.group_lookup_base:
        raise ValueError("queries with in_group_nested, or in_group on a DN naming the vhost or resource, "
                         "need --auth-ldap-group-lookup-base (or --auth-ldap-dn-lookup-base)")
    if s.dn_lookup_attribute and not s.dn_lookup_base:
        raise ValueError("--auth-ldap-dn-lookup-attribute needs --auth-ldap-dn-lookup-base")
    return s


class LdapBackend:
    name = "ldap"

    def __init__(self, settings: LdapSettings) -> None:
        self.s = settings
        self.need = needs(settings.queries())
        tls = None
        if settings.use_ssl or settings.use_starttls:
            tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=settings.ca_file or None)
        self.servers = [ldap3.Server(host, port=settings.port, use_ssl=settings.use_ssl, tls=tls,
                                     connect_timeout=settings.timeout, get_info=ldap3.NONE)
                        for host in settings.servers]
        self._idle: list = []
        self._lock = threading.Lock()
        self.opened = 0  # connections opened so far (the pool's reuse shows in it)

    def needs_io(self, username: str, password: str | None) -> bool:
        return True

    # -- connections -----------------------------------------------------------------------------
    def _acquire(self):
        with self._lock:
            if self._idle:
                return self._idle.pop()
        errors = []
        for server in self.servers:  # in order: the first that answers
            conn = ldap3.Connection(server, receive_timeout=max(1, math.ceil(self.s.timeout)),
                                    raise_exceptions=False, read_only=True)
            try:
                conn.open()
                if self.s.use_starttls and not conn.start_tls():
                    raise LDAPException(f"StartTLS refused: {conn.result.get('description')}")
            except (LDAPException, OSError) as exc:
                errors.append(f"{server.host}:{server.port}: {exc}")
                continue
            self.opened += 1
            return conn
        raise ConnectionError(f"LDAP server unreachable: {'; '.join(errors)}")

    def _release(self, conn, ok: bool) -> None:
        with self._lock:
            if ok and len(self._idle) < self.s.pool_size:
                self._idle.append(conn)
                return
        try:
            conn.unbind()
        except (LDAPException, OSError):
            pass

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            self._release(conn, False)

    # -- a login ----------------------------------------------------------------------------------
    def login(self, username: str, password: str | None, peer_host: str) -> AuthenticatedUser | None:
        if not password:
            raise BackendRefusal("empty passwords are refused (an LDAP anonymous bind)")
        conn = self._acquire()
        ok = False
        try:
            user_dn = self._user_dn(conn, username)
            if user_dn is None:
                ok = True
                return None
            if not conn.rebind(user_dn, password):
                ok = conn.result.get("result") == 49  # invalidCredentials: the connection is fine
                if ok:
                    raise BackendRefusal(f"LDAP bind as '{user_dn}' refused: invalid credentials")
                raise ConnectionError(f"LDAP bind as '{user_dn}' failed: {conn.result.get('description')}")
            view = self._read_view(conn, username, user_dn)
            ok = True
        except LDAPException as exc:
            raise ConnectionError(f"LDAP: {exc}") from None
        finally:
            self._release(conn, ok)
        base = {"username": username, "user_dn": user_dn}
        tags = [tag for tag, q in self.s.tag_queries.items() if evaluate(q, base, view)]
        authz = LdapAuthz(view, self.s.vhost_access_query, self.s.resource_access_query,
                          self.s.topic_access_query)
        return AuthenticatedUser(username, tags, self.name, authz)

    def _user_dn(self, conn, username: str) -> str | None:
        if not self.s.dn_lookup_attribute:
            return fill(self.s.user_dn_pattern, {"username": username})
        if not conn.rebind():  # the lookup is anonymous
            raise ConnectionError(f"LDAP anonymous bind failed: {conn.result.get('description')}")
        attr = self.s.dn_lookup_attribute
        conn.search(self.s.dn_lookup_base, f"({attr}={escape_filter_chars(username)})", ldap3.SUBTREE,
                    attributes=[], size_limit=2)
        found = [e.entry_dn for e in conn.entries]
        return found[0] if len(found) == 1 else None

    def _read_view(self, conn, username: str, user_dn: str) -> LdapView:
        view = LdapView(username, user_dn)
        base = {"username": username, "user_dn": user_dn}
        me = escape_filter_chars(user_dn)
        for pattern in self.need["entries"] | {"${user_dn}"}:
            dn = fill(pattern, base)
            if conn.search(dn, "(objectClass=*)", ldap3.BASE, attributes=["*"]) and conn.entries:
                attrs = conn.entries[0].entry_attributes_as_dict
                view.entries[norm_dn(dn)] = {k.lower(): [str(v) for v in vs] for k, vs in attrs.items()}
        for pattern, attr in self.need["groups"]:
            dn = fill(pattern, base)
            conn.search(dn, f"({attr}={me})", ldap3.BASE, attributes=[])
            view.group_attrs[(norm_dn(dn), attr.lower())] = bool(conn.entries)
        for attr in self.need["member_of"] | self.need["nested"]:
            conn.search(self.s.group_lookup_base, f"({attr}={me})", ldap3.SUBTREE, attributes=[])
            view.member_of[attr.lower()] = {norm_dn(e.entry_dn) for e in conn.entries}
        for attr in self.need["nested"]:
            seen = set(view.member_of[attr.lower()])
            frontier = list(seen)
            for _ in range(NESTING_MAX):
                if not frontier:
                    break
                f = "(|" + "".join(f"({attr}={escape_filter_chars(g)})" for g in frontier) + ")"
                conn.search(self.s.group_lookup_base, f, ldap3.SUBTREE, attributes=[])
                frontier = [norm_dn(e.entry_dn) for e in conn.entries if norm_dn(e.entry_dn) not in seen]
                seen.update(frontier)
            view.nested_of[attr.lower()] = seen
        return view
