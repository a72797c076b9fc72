"""The LDAP backend (rabbitmq_auth_backend_ldap) against a real OpenLDAP (slapd started by the
test): binds, DN lookup, the JSON queries (in_group, in_group_nested, match, for, ...) as tags
and permissions, the connection pool, LDAPS and StartTLS, a server down or hung; then pika and
the admin API through the broker's chain."""

from __future__ import annotations

import logging
import time

import pika
import pytest
import requests
from eb_support import free_port, pika_connect
from oauth2_support import auth_broker
from slapd_support import BASE, QUERIES, Slapd

from exchange_broker.auth.ldap import LdapBackend, LdapSettings
from exchange_broker.core.auth_backends import BackendRefusal

@pytest.fixture(scope="module")
def slapd():
    with Slapd() as server:
        yield server


def backend(slapd, **over) -> LdapBackend:
    from exchange_broker.auth.ldap import settings_from
    from exchange_broker.config import Config
    settings = {"auth_backends": "ldap", "auth_ldap_servers": "127.0.0.1", "auth_ldap_port": slapd.port,
                "auth_ldap_timeout": 2.0, **QUERIES, **over}
    return LdapBackend(settings_from(Config(**settings)))


def test_binds_as_the_user_and_tags_come_from_groups_nested_groups_and_attributes(slapd):
    b = backend(slapd)
    alice = b.login("alice", "alice-pw", "127.0.0.1")
    assert alice.backend == "ldap" and sorted(alice.tags) == ["administrator", "management", "policymaker"]
    assert b.login("bob", "bob-pw", "").tags == ["management"]          # staff directly
    assert b.login("carol", "carol-pw", "").tags == ["monitoring"]      # uniqueMember
    with pytest.raises(BackendRefusal, match="invalid credentials"):
        b.login("alice", "wrong", "")
    with pytest.raises(BackendRefusal, match="invalid credentials"):  # no such entry: the bind fails
        b.login("nobody", "x", "")
    with pytest.raises(BackendRefusal, match="empty password"):
        b.login("alice", "", "")
    assert b.opened == 1  # one pooled connection, rebound for every login


def test_queries_give_vhost_resource_and_topic_access(slapd):
    bob = backend(slapd).login("bob", "bob-pw", "").authz
    assert bob.vhost_access("/") and bob.vhost_access("prod") and not bob.vhost_access("dev")
    assert bob.resource_access("/", "queue", "bob-jobs", "configure")
    assert not bob.resource_access("/", "queue", "alice-jobs", "configure")
    assert bob.resource_access("/", "exchange", "amq.topic", "write")
    assert not bob.resource_access("/", "exchange", "amq.direct", "write")
    assert bob.resource_access("/", "queue", "anything", "read")
    assert bob.topic_access("/", "amq.topic", "bob.orders", "write")
    assert not bob.topic_access("/", "amq.topic", "alice.orders", "write")


def test_the_user_dn_can_be_looked_up_by_attribute(slapd):
    b = backend(slapd, auth_ldap_user_dn_pattern="${username}", auth_ldap_dn_lookup_attribute="uid",
                auth_ldap_dn_lookup_base=f"ou=people,{BASE}")
    assert "administrator" in b.login("alice", "alice-pw", "").tags
    assert b.login("nobody", "x", "") is None  # not found: not mine, the next backend is asked


@pytest.mark.parametrize("mode", ["ldaps", "starttls"])
def test_ldaps_and_starttls_verify_the_servers_certificate(slapd, mode):
    over = {"auth_ldap_use_ssl": True, "auth_ldap_port": slapd.tls_port} if mode == "ldaps" else \
        {"auth_ldap_use_starttls": True}
    good = backend(slapd, auth_ldap_ssl_ca_file=str(slapd.pki.ca), **over)
    assert "management" in good.login("bob", "bob-pw", "").tags
    rogue = backend(slapd, auth_ldap_ssl_ca_file=str(slapd.pki.rogue_cert), **over)
    with pytest.raises(ConnectionError):
        rogue.login("bob", "bob-pw", "")


def test_bad_queries_are_refused_at_start_in_one_line(slapd):
    with pytest.raises(ValueError, match="resource-access-query is not JSON"):
        backend(slapd, auth_ldap_resource_access_query="{in_group, x}")
    with pytest.raises(ValueError, match="is not a query"):
        backend(slapd, auth_ldap_vhost_access_query='["in_grop", "x"]')
    with pytest.raises(ValueError, match="group-lookup-base"):
        backend(slapd, auth_ldap_group_lookup_base="")


# -- through the broker --------------------------------------------------------------------------

@pytest.fixture
def tb(slapd):
    with auth_broker(auth_backends="internal,ldap", auth_ldap_servers="127.0.0.1",
                     auth_ldap_port=slapd.port, **QUERIES) as b:
        r = requests.put(f"{b.admin_url}/api/vhosts/prod", auth=("guest", "guest"), timeout=10)
        assert r.status_code in (201, 204)
        yield b


def test_pika_logins_permissions_and_topics_from_ldap(tb):
    conn = pika_connect(tb.port, user="bob", password="bob-pw")
    ch = conn.channel()
    ch.queue_declare("bob-jobs")
    ch.basic_publish("amq.topic", "bob.orders", b"ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("alice-jobs")
    assert info.value.reply_code == 403
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("amq.topic", "alice.orders", b"no")
        ch.queue_declare("bob-more")
    assert info.value.reply_code == 403 and "topic 'alice.orders'" in info.value.reply_text
    conn.close()
    pika_connect(tb.port, user="bob", password="bob-pw", vhost="prod").close()
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        pika_connect(tb.port, user="carol", password="carol-pw", vhost="prod")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika_connect(tb.port, user="bob", password="wrong")
    pika_connect(tb.port).close()  # guest: the internal backend, first in the chain


def test_the_admin_api_logs_ldap_users_in_with_their_group_tags(tb):
    who = requests.get(f"{tb.admin_url}/api/whoami", auth=("alice", "alice-pw"), timeout=10)
    assert who.status_code == 200 and "administrator" in str(who.json()["tags"])
    assert requests.get(f"{tb.admin_url}/api/overview", auth=("carol", "carol-pw"), timeout=10).status_code == 200
    assert requests.get(f"{tb.admin_url}/api/whoami", auth=("alice", "nope"), timeout=10).status_code == 401


def test_a_server_down_refuses_the_login_with_one_log_line(caplog):
    caplog.set_level(logging.INFO, logger="exchange_broker")
    with auth_broker(auth_backends="ldap", auth_ldap_servers="127.0.0.1", auth_ldap_port=free_port(),
                     **QUERIES) as b:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika_connect(b.port, user="bob", password="bob-pw")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("exchange_broker")
             and ("ldap" in r.getMessage().lower())]
    assert len(lines) == 1 and "login refused" in lines[0] and "unreachable" in lines[0], lines


def test_a_hung_server_never_hangs_a_connection(caplog):
    caplog.set_level(logging.INFO, logger="exchange_broker")
    with Slapd() as hung:
        with auth_broker(auth_backends="internal,ldap", auth_ldap_servers="127.0.0.1",
                         auth_ldap_port=hung.port, auth_ldap_timeout=1.0, auth_timeout=3.0, **QUERIES) as b:
            hung.pause()
            t0 = time.monotonic()
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika_connect(b.port, user="bob", password="bob-pw")
            assert time.monotonic() - t0 < 8
            pika_connect(b.port).close()  # the broker serves everyone else meanwhile
            hung.resume()
