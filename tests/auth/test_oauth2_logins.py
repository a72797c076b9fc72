"""OAuth 2.0 tokens as passwords (rabbitmq_auth_backend_oauth2), end to end: keys made by the
test, a JWKS endpoint served by the test, pika logins, scopes as permissions, expiry,
connection.update-secret and the admin API's bearer tokens."""

from __future__ import annotations

import logging
import time

import pika
import pytest
import requests
from eb_support import pika_connect, wait_until
from oauth2_support import RSID, JwksServer, SigningKey, auth_broker

ALL = (f"{RSID}.configure:*/*", f"{RSID}.write:*/*", f"{RSID}.read:*/*")


@pytest.fixture(scope="module")
def keys():
    return {"rsa": SigningKey("k-rsa"), "ec": SigningKey("k-ec", "ec"), "ed": SigningKey("k-ed", "ed")}


@pytest.fixture
def idp(keys):
    with JwksServer(keys["rsa"]) as server:
        yield server


@pytest.fixture(autouse=True)
def info_logs(caplog):
    caplog.set_level(logging.INFO, logger="exchange_broker")


@pytest.fixture
def tb(idp):
    with auth_broker(auth_oauth2_jwks_url=idp.url) as b:
        yield b


def connect(tb, token, user="", vhost="/"):
    return pika_connect(tb.port, user=user, password=token, vhost=vhost)


def test_a_token_logs_in_with_any_user_name_and_its_subject_is_the_user(tb, keys):
    for user in ("", "whoever"):
        conn = connect(tb, keys["rsa"].token(ALL, sub="svc-orders"), user=user)
        ch = conn.channel()
        ch.queue_declare("q-token")
        assert tb.call(lambda: sorted(s.user for s in tb.broker.sessions)) == ["svc-orders"]
        conn.close()
    conn = pika_connect(tb.port)  # the broker's own users still log in (internal first)
    conn.close()


@pytest.mark.parametrize("why, make", [
    ("a key the issuer never published", lambda k: SigningKey("k-rsa").token(ALL)),
    ("another audience", lambda k: k["rsa"].token(ALL, aud="another-api")),
    ("another issuer", lambda k: k["rsa"].token(ALL, iss="https://evil.test/")),
    ("expired", lambda k: k["rsa"].token(ALL, ttl=-5)),
    ("not yet valid", lambda k: k["rsa"].token(ALL, nbf=int(time.time()) + 600)),
    ("no exp", lambda k: k["rsa"].token(ALL, exp=None)),
    ("unknown key id", lambda k: k["rsa"].token(ALL, kid="nobody")),
])
def test_bad_tokens_are_refused(tb, keys, why, make, caplog):
    token = make(keys)
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        connect(tb, token)
    assert "ACCESS_REFUSED" in str(info.value)
    refusals = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert refusals and "oauth2:" in refusals[-1]  # the backend that refused it


def test_a_rotated_key_is_fetched_when_a_token_names_it(tb, idp, keys):
    connect(tb, keys["rsa"].token(ALL)).close()
    fetches = idp.fetches
    connect(tb, keys["rsa"].token(ALL)).close()
    assert idp.fetches == fetches  # known key: no fetch
    idp.keys += [keys["ec"], keys["ed"]]  # the issuer rotates in ES256 and EdDSA keys
    for kind in ("ec", "ed"):
        conn = connect(tb, keys[kind].token(ALL))
        conn.channel().queue_declare(f"q-{kind}")
        conn.close()
    assert idp.fetches == fetches + 1  # one fetch brought both new keys
    idp.keys = [keys["ec"]]  # the issuer drops the other keys: the next fetch forgets them
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(tb, keys["rsa"].token(ALL, kid="k-unknown"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(tb, keys["ed"].token(ALL))
    connect(tb, keys["ec"].token(ALL)).close()


def test_scopes_are_permissions(tb, keys):
    scopes = (f"{RSID}.configure:*/app-*", f"{RSID}.read:*/app-*", f"{RSID}.write:*/amq.default")
    conn = connect(tb, keys["rsa"].token(scopes))
    ch = conn.channel()
    ch.queue_declare("app-1")
    ch.basic_publish("", "app-1", b"hi")
    assert wait_until(lambda: ch.basic_get("app-1", auto_ack=True)[2] == b"hi")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("other")
    assert info.value.reply_code == 403
    assert "access to queue 'other' in vhost '/' refused for user 'alice'" in info.value.reply_text
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:  # no write on amq.direct
        ch.basic_publish("amq.direct", "k", b"x")
        ch.queue_declare("app-2")  # the 403 arrives before this call returns
    assert info.value.reply_code == 403 and "exchange 'amq.direct'" in info.value.reply_text
    conn.close()


def test_a_vhost_without_a_matching_scope_is_refused(tb, keys):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(tb, keys["rsa"].token((f"{RSID}.read:dev/*",)))
    assert "530" in str(info.value)


def test_topic_scopes_narrow_routing_keys_on_topic_exchanges(tb, keys):
    scopes = (f"{RSID}.write:*/amq.topic/eu.*", f"{RSID}.configure:*/*", f"{RSID}.read:*/*")
    conn = connect(tb, keys["rsa"].token(scopes))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.topic", "eu.orders", b"ok")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("amq.topic", "us.orders", b"no")
    assert info.value.reply_code == 403
    assert "access to topic 'us.orders' in exchange 'amq.topic'" in info.value.reply_text
    conn.close()


def test_an_expired_token_closes_the_connection_with_320(tb, keys):
    conn = connect(tb, keys["rsa"].token(ALL, ttl=2))
    conn.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
    assert info.value.reply_code == 320 and info.value.reply_text == "CONNECTION_FORCED - credential expired"


def test_update_secret_refreshes_the_token_on_a_live_connection(tb, keys):
    conn = connect(tb, keys["rsa"].token(ALL, ttl=2))
    ch = conn.channel()
    conn.update_secret(keys["rsa"].token(ALL + (f"{RSID}.tag:monitoring",), ttl=120), "refresh")
    deadline = time.monotonic() + 3.5  # past the first token's expiry
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.2)
    ch.queue_declare("still-open")
    assert tb.call(lambda: [s.auth_user.tags for s in tb.broker.sessions]) == [["monitoring"]]
    conn.close()


@pytest.mark.parametrize("new", ["not-a-token", "other-user"])
def test_a_refused_new_secret_closes_the_connection_with_530(tb, keys, new):
    conn = connect(tb, keys["rsa"].token(ALL))
    conn.channel()
    secret = keys["rsa"].token(ALL, sub="mallory") if new == "other-user" else new
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.update_secret(secret, "refresh")
        conn.process_data_events(time_limit=1)
    assert info.value.reply_code == 530
    assert "New secret was refused by one of the backends" in info.value.reply_text


def test_the_admin_api_takes_bearer_tokens_and_their_tags(tb, keys):
    api = tb.admin_url
    admin = keys["rsa"].token(ALL + (f"{RSID}.tag:administrator",), sub="ops")
    r = requests.get(f"{api}/api/whoami", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert r.status_code == 200 and r.json()["name"] == "ops" and "administrator" in str(r.json()["tags"])
    r = requests.get(f"{api}/api/overview", auth=("anyone", admin), timeout=10)  # token as password
    assert r.status_code == 200
    plain = keys["rsa"].token(ALL)
    r = requests.get(f"{api}/api/whoami", headers={"Authorization": f"Bearer {plain}"}, timeout=10)
    assert r.status_code == 401 and "Not management user" in r.text
    expired = keys["rsa"].token(ALL + (f"{RSID}.tag:administrator",), ttl=-5)
    r = requests.get(f"{api}/api/whoami", headers={"Authorization": f"Bearer {expired}"}, timeout=10)
    assert r.status_code == 401
    # a management user sees and may act on what its scopes allow
    mgmt = keys["rsa"].token((f"{RSID}.tag:management", f"{RSID}.configure:*/mine-*",
                              f"{RSID}.read:*/mine-*"), sub="dev")
    h = {"Authorization": f"Bearer {mgmt}"}
    assert requests.put(f"{api}/api/queues/%2F/mine-1", json={}, headers=h, timeout=10).status_code in (201, 204)
    assert requests.put(f"{api}/api/queues/%2F/theirs", json={}, headers=h, timeout=10).status_code == 401


def test_the_issuer_down_refuses_the_login_quickly(keys, caplog):
    with JwksServer(keys["rsa"]) as idp:
        url = idp.url
    with auth_broker(auth_oauth2_jwks_url=url, auth_timeout=2.0) as tb:
        t0 = time.monotonic()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(tb, keys["rsa"].token(ALL))
        assert time.monotonic() - t0 < 10
        lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
        assert len(lines) == 1 and "cannot fetch the signing keys" in lines[0]
        pika_connect(tb.port).close()  # everyone else is still served


def test_serve_with_signing_key_files_from_the_command_line(spawn_broker, workdir, keys):
    """The flags as an operator gives them: PEM files per key id, no JWKS endpoint."""
    (workdir / "rsa.pem").write_text(keys["rsa"].pem())
    (workdir / "ed.pem").write_text(keys["ed"].pem())
    broker = spawn_broker("--auth-backends", "oauth2,internal", "--auth-oauth2-resource-server-id", RSID,
                          "--auth-oauth2-signing-key", f"k-rsa={workdir / 'rsa.pem'},k-ed={workdir / 'ed.pem'}",
                          "--auth-oauth2-issuer", "https://idp.test/")
    for kind in ("rsa", "ed"):
        conn = pika_connect(broker.port, user="", password=keys[kind].token(ALL))
        conn.channel().queue_declare(f"q-{kind}")
        conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika_connect(broker.port, user="", password=keys["ec"].token(ALL))
    assert "oauth2: no signing key with id 'k-ec'" in broker.log()
    pika_connect(broker.port).close()  # guest, from the internal backend after oauth2


def test_serve_refuses_bad_auth_settings_in_one_line(workdir):
    import subprocess
    import sys
    from eb_support import REPO, subprocess_env
    for args, says in ((["--auth-backends", "internal,kerberos"], "--auth-backends must list"),
                       (["--auth-backends", "oauth2"], "needs --auth-oauth2-jwks-url"),
                       (["--auth-backends", "oauth2", "--auth-oauth2-signing-key", "/nonexistent.pem"],
                        "cannot read /nonexistent.pem")):
        proc = subprocess.run([sys.executable, "-m", "exchange_broker", "serve", "--port", "0",
                               "--admin-port", "0", "--data-dir", str(workdir / "d"), *args],
                              capture_output=True, text=True, timeout=60, cwd=str(REPO), env=subprocess_env())
        assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_user_id_is_checked_against_the_token_user_and_its_impersonator_tag(tb, keys):
    conn = connect(tb, keys["rsa"].token(ALL))
    ch = conn.channel()
    ch.queue_declare("uid")
    ch.confirm_delivery()
    ch.basic_publish("", "uid", b"mine", pika.BasicProperties(user_id="alice"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("", "uid", b"forged", pika.BasicProperties(user_id="mallory"))
    assert info.value.reply_code == 406 and "authenticated user was 'alice'" in info.value.reply_text
    conn.close()
    relay = connect(tb, keys["rsa"].token(ALL + (f"{RSID}.tag:impersonator",), sub="relay"))
    ch = relay.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "uid", b"on behalf", pika.BasicProperties(user_id="mallory"))
    relay.close()


def test_logins_waiting_for_the_same_new_key_share_one_fetch(tb, idp, keys):
    import threading
    connect(tb, keys["rsa"].token(ALL)).close()
    fetches = idp.fetches
    idp.keys.append(keys["ec"])
    errors = []

    def login():
        try:
            connect(tb, keys["ec"].token(ALL)).close()
        except Exception as exc:  # reported below
            errors.append(exc)
    threads = [threading.Thread(target=login) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and idp.fetches == fetches + 1
