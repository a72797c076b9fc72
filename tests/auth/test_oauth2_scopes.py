"""RabbitMQ's OAuth 2.0 scope rules (rabbit_oauth2_scope), sans IO: a token's claims in,
permissions, topic access, tags and the user name out."""

from exchange_broker.core.oauth2_scopes import (ScopeAuthz, token_scopes, username_from,
                                                wildcard_match)


def test_wildcards_match_whole_names_and_decode_percent_escapes():
    assert wildcard_match("orders", "*") and wildcard_match("", "*")
    assert wildcard_match("orders.eu", "orders.*") and not wildcard_match("xorders.eu", "orders.*")
    assert wildcard_match("a.b", "a.b") and not wildcard_match("aXb", "a.b")  # a dot is a dot
    assert wildcard_match("/", "%2F") and not wildcard_match("vh", "%2F")
    assert wildcard_match("q-1-x", "q-*-x") and not wildcard_match("q-1-y", "q-*-x")


def test_scopes_need_the_resource_server_prefix_which_is_dropped():
    claims = {"scope": "rabbitmq.read:*/* other.write:*/* rabbitmq.tag:management openid"}
    assert token_scopes(claims, "rabbitmq") == ["read:*/*", "tag:management"]
    assert token_scopes({"scope": ["rabbitmq.write:v/x"]}, "rabbitmq") == ["write:v/x"]
    assert token_scopes(claims, "rabbitmq", prefix="other.") == ["write:*/*"]


def test_additional_scopes_key_reads_strings_lists_nested_paths_and_maps_by_resource_server():
    claims = {"roles": "rabbitmq.configure:*/q1", "realm": {"perms": ["rabbitmq.read:*/q2"]},
              "authz": [{"scopes": "rabbitmq.write:*/x"}, {"scopes": ["rabbitmq.tag:administrator"]}],
              "by_rs": {"rabbitmq": ["read:*/q3"], "other": ["read:*/nope"]}}
    got = token_scopes(claims, "rabbitmq", "roles realm.perms authz.scopes by_rs")
    assert got == ["configure:*/q1", "read:*/q2", "read:*/q3", "tag:administrator", "write:*/x"]


def test_permissions_vhosts_and_tags_from_scopes():
    a = ScopeAuthz(["read:prod/orders-*", "write:prod/amq.topic/eu.*", "configure:dev/*",
                    "tag:management", "tag:monitoring", "bogus", "read:too/many/parts/here"])
    assert a.tags == ["management", "monitoring"]
    assert a.vhost_access("prod") and a.vhost_access("dev") and not a.vhost_access("other")
    assert a.resource_access("prod", "queue", "orders-1", "read")
    assert not a.resource_access("prod", "queue", "orders-1", "write")
    assert not a.resource_access("dev", "queue", "orders-1", "read")
    assert a.resource_access("dev", "exchange", "anything", "configure")
    assert a.resource_access("prod", "exchange", "amq.topic", "write")  # the rk part does not narrow it


def test_topic_access_only_by_scopes_with_a_routing_key_part_and_variables():
    a = ScopeAuthz(["write:*/amq.topic/eu.*", "read:*/*", "write:{vhost}/x/{sub}.#"], {"sub": "alice"})
    assert a.topic_access("/", "amq.topic", "eu.orders", "write")
    assert not a.topic_access("/", "amq.topic", "us.orders", "write")
    assert not a.topic_access("/", "amq.topic", "eu.orders", "read")  # read:*/* has no rk part
    assert a.topic_access("v1", "x", "alice.#", "write") and not a.topic_access("v1", "x", "bob.#", "write")


def test_user_name_from_preferred_claims_then_sub_then_client_id():
    assert username_from({"sub": "s", "client_id": "c", "user_name": "u"}, ["user_name"]) == "u"
    assert username_from({"sub": "s", "client_id": "c"}, ["user_name"]) == "s"
    assert username_from({"client_id": "c"}, []) == "c"
    assert username_from({}, []) == "unknown"
