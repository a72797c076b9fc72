"""rabbitmq_auth_backend_ldap's queries, written in JSON, evaluated purely against what the LDAP
backend read about the user when it logged in (``LdapView``).

RabbitMQ writes its queries as Erlang terms; here a query is the same term as a JSON array,
its first element the query's name (strings stand for atoms and binaries alike):

=====================================  ====================================================
RabbitMQ                               here
=====================================  ====================================================
``{constant, true}``                   ``["constant", true]``
``{in_group, "cn=g,ou=G,dc=x"}``        ``["in_group", "cn=g,ou=G,dc=x"]`` (attribute ``member``)
``{in_group, Dn, "uniqueMember"}``     ``["in_group", Dn, "uniqueMember"]``
``{in_group_nested, Dn}``              ``["in_group_nested", Dn]`` (optional attribute)
``{exists, Dn}``                       ``["exists", Dn]``
``{match, S, Regex}``                  ``["match", S, Regex]`` (unanchored, as re:run)
``{equals, S1, S2}``                   ``["equals", S1, S2]``
``{for, [{permission, configure, Q}]}`` ``["for", [["permission", "configure", Q], ...]]``
``{'and', [Q1, Q2]}`` / ``'or'``       ``["and", [Q1, Q2]]`` / ``["or", [...]]``
``{'not', Q}``                         ``["not", Q]``
=====================================  ====================================================

A string operand S is a plain string, ``["string", "..."]`` or ``["attribute", Dn, "attr"]``
(the values of an attribute of an entry). ``${username}``, ``${user_dn}``, ``${vhost}``,
``${resource}`` (exchange/queue/topic), ``${name}``, ``${permission}`` and ``${routing_key}``
are substituted as in RabbitMQ. Tag queries are a JSON object: ``{"administrator": Q, ...}``.

What a query needs from the directory is read at login (``needs``): groups and entries whose DN
is known then (it names only ``${username}``/``${user_dn}``) are read directly; a group DN that
names the vhost or the resource is looked up in the user's group memberships found under
``--auth-ldap-group-lookup-base``. So group membership is as of the login (like RabbitMQ with
its cache backend); a connection does not see later changes to the directory.
"""

from __future__ import annotations

import json
import re

LOGIN_VARS = ("username", "user_dn")
_VAR = re.compile(r"\$\{([a-z_]+)\}")
NAMES = {"constant", "in_group", "in_group_nested", "exists", "match", "equals", "for", "and", "or", "not"}


class QueryError(ValueError):
    pass


def parse(text: str, what: str):
    """A query from its JSON text; raises QueryError with a one-line reason."""
    try:
        q = json.loads(text)
    except ValueError as exc:
        raise QueryError(f"{what} is not JSON: {exc}") from None
    check(q, what)
    return q


def parse_tags(text: str) -> dict:
    try:
        tags = json.loads(text)
    except ValueError as exc:
        raise QueryError(f"--auth-ldap-tag-queries is not JSON: {exc}") from None
    if not isinstance(tags, dict):
        raise QueryError('--auth-ldap-tag-queries must be a JSON object: {"tag": query, ...}')
    for tag, q in tags.items():
        check(q, f"the tag query of '{tag}'")
    return tags


def check(q, what: str) -> None:
    if not isinstance(q, list) or not q or q[0] not in NAMES:
        raise QueryError(f"{what}: {json.dumps(q)} is not a query (one of {', '.join(sorted(NAMES))})")
    name = q[0]
    if name in ("and", "or"):
        if len(q) != 2 or not isinstance(q[1], list):
            raise QueryError(f"{what}: {name} takes a list of queries")
        for sub in q[1]:
            check(sub, what)
    elif name == "not":
        check(q[1] if len(q) == 2 else None, what)
    elif name == "for":
        if len(q) != 2 or not isinstance(q[1], list) or not all(isinstance(c, list) and len(c) == 3 for c in q[1]):
            raise QueryError(f"{what}: for takes a list of [variable, value, query]")
        for c in q[1]:
            check(c[2], what)
    elif name == "constant" and (len(q) != 2 or not isinstance(q[1], bool)):
        raise QueryError(f"{what}: constant takes true or false")
    elif name in ("in_group", "in_group_nested", "exists") and not (2 <= len(q) <= 4 and isinstance(q[1], str)):
        raise QueryError(f"{what}: {name} takes a DN pattern (and an attribute)")
    elif name in ("match", "equals") and len(q) != 3:
        raise QueryError(f"{what}: {name} takes two strings")


def fill(pattern: str, variables: dict) -> str:
    return _VAR.sub(lambda m: str(variables.get(m.group(1), m.group(0))), pattern)


def norm_dn(dn: str) -> str:
    return ",".join(part.strip() for part in dn.split(",")).lower()


class LdapView:
    """What the backend read at login: the user's DN and entries/groups the queries need."""

    def __init__(self, username: str, user_dn: str) -> None:
        self.username = username
        self.user_dn = user_dn
        self.entries: dict[str, dict[str, list[str]]] = {}      # dn -> attribute (lower) -> values
        self.group_attrs: dict[tuple[str, str], bool] = {}       # (group dn, attr) -> user in it
        self.member_of: dict[str, set[str]] = {}                 # attr -> group DNs holding the user
        self.nested_of: dict[str, set[str]] = {}                 # attr -> groups, transitively


def needs(queries: list) -> dict:
    """What to read at login: ``groups`` {(dn pattern, attr)} with login-known DNs, ``entries``
    {dn pattern}, and the attributes needing the user's memberships (``member_of``/``nested``)."""
    out = {"groups": set(), "entries": set(), "member_of": set(), "nested": set()}

    def known(p: str) -> bool:
        return all(v in LOGIN_VARS for v in _VAR.findall(p))

    def string_needs(s) -> None:
        if isinstance(s, list) and len(s) == 3 and s[0] == "attribute" and known(s[1]):
            out["entries"].add(s[1])

    def walk(q) -> None:
        name = q[0]
        if name in ("and", "or"):
            for sub in q[1]:
                walk(sub)
        elif name == "not":
            walk(q[1])
        elif name == "for":
            for c in q[1]:
                walk(c[2])
        elif name == "in_group":
            attr = q[2] if len(q) > 2 else "member"
            if known(q[1]):
                out["groups"].add((q[1], attr))
            else:
                out["member_of"].add(attr)
        elif name == "in_group_nested":
            out["nested"].add(q[2] if len(q) > 2 else "member")
        elif name == "exists" and known(q[1]):
            out["entries"].add(q[1])
        elif name in ("match", "equals"):
            string_needs(q[1])
            string_needs(q[2])

    for q in queries:
        walk(q)
    return out


def _strings(s, variables: dict, view: LdapView) -> list[str]:
    if isinstance(s, str):
        return [fill(s, variables)]
    if isinstance(s, list) and len(s) == 2 and s[0] == "string":
        return [fill(s[1], variables)]
    if isinstance(s, list) and len(s) == 3 and s[0] == "attribute":
        entry = view.entries.get(norm_dn(fill(s[1], variables)), {})
        return list(entry.get(s[2].lower(), []))
    return []


def evaluate(q, variables: dict, view: LdapView) -> bool:
    """Does the query hold for ``variables`` (username, user_dn, vhost, resource, ...)?"""
    name = q[0]
    if name == "constant":
        return q[1]
    if name == "and":
        return all(evaluate(sub, variables, view) for sub in q[1])
    if name == "or":
        return any(evaluate(sub, variables, view) for sub in q[1])
    if name == "not":
        return not evaluate(q[1], variables, view)
    if name == "for":
        for var, value, sub in q[1]:
            if str(variables.get(var)) == str(value):
                return evaluate(sub, variables, view)
        return False
    if name == "in_group":
        dn, attr = norm_dn(fill(q[1], variables)), (q[2] if len(q) > 2 else "member").lower()
        if (dn, attr) in view.group_attrs:
            return view.group_attrs[(dn, attr)]
        return dn in view.member_of.get(attr, ())
    if name == "in_group_nested":
        dn, attr = norm_dn(fill(q[1], variables)), (q[2] if len(q) > 2 else "member").lower()
        return dn in view.nested_of.get(attr, ())
    if name == "exists":
        return norm_dn(fill(q[1], variables)) in view.entries
    if name == "equals":
        return bool(set(_strings(q[1], variables, view)) & set(_strings(q[2], variables, view)))
    if name == "match":
        regexes = _strings(q[2], variables, view)
        for value in _strings(q[1], variables, view):
            for rx in regexes:
                try:
                    if re.search(rx, value):
                        return True
                except re.error:
                    return False
        return False
    return False


class LdapAuthz:
    """The permissions of an LDAP user (``core/auth_backends.Authz``) from the three queries."""

    def __init__(self, view: LdapView, vhost_q, resource_q, topic_q) -> None:
        self.view = view
        self.vhost_q, self.resource_q, self.topic_q = vhost_q, resource_q, topic_q
        self.base = {"username": view.username, "user_dn": view.user_dn}

    def vhost_access(self, vhost: str) -> bool:
        return evaluate(self.vhost_q, {**self.base, "vhost": vhost}, self.view)

    def resource_access(self, vhost: str, kind: str, name: str, permission: str) -> bool:
        return evaluate(self.resource_q, {**self.base, "vhost": vhost, "resource": kind, "name": name,
                                          "permission": permission}, self.view)

    def topic_access(self, vhost: str, exchange: str, routing_key: str, permission: str) -> bool:
        return evaluate(self.topic_q, {**self.base, "vhost": vhost, "resource": "topic", "name": exchange,
                                       "permission": permission, "routing_key": routing_key}, self.view)
