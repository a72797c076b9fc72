"""``amqps://`` URIs for shovels and federation upstreams: RabbitMQ's TLS query parameters
(cacertfile, certfile, keyfile, verify, server_name_indication) against this project's own TLS
listener with a client certificate required, a throwaway CA made here (cryptography)."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from admin_helpers import Api

from eb_support import close_quietly, pika_connect, wait_until
from exchange_broker.server.tls import TLSConfig
from exchange_broker.testing import ThreadedBroker
from mover_support import depth, publish

pytest.importorskip("cryptography")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))
from sec_helpers import make_pki  # noqa: E402

SHOVEL = "/api/parameters/shovel/%2F/"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("mover-pki"))


@pytest.fixture
def tls_there(pki):
    """A broker whose TLS listener requires a client certificate from the test CA."""
    tls = TLSConfig(str(pki.server_cert), str(pki.server_key), str(pki.ca), verify_peer=True,
                    fail_if_no_peer_cert=True, port=0)
    with ThreadedBroker(tls=tls) as tb:
        yield tb


def amqps(tb, **query: str) -> str:
    q = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in query.items())
    return f"amqps://guest:guest@localhost:{tb.server.tls_port}?{q}"


def shovel_state(api: Api, name: str) -> dict:
    code, body = api.get(f"/api/shovels/vhost/%2F/{name}")
    return body if code == 200 else {}


def test_shovel_over_tls_with_a_client_certificate(pki, tls_there, here):
    publish(here.port, "tls-out", 200)
    good = amqps(tls_there, cacertfile=pki.ca, certfile=pki.client_cert, keyfile=pki.client_key,
                 verify="verify_peer", server_name_indication="localhost")
    value = {"src-uri": "amqp://", "src-queue": "tls-out", "dest-uri": good, "dest-queue": "tls-in"}
    assert here.api.put(SHOVEL + "tls", {"value": value})[0] == 201
    assert wait_until(lambda: depth(tls_there.port, "tls-in") == 200, 20), shovel_state(here.api, "tls")
    info = shovel_state(here.api, "tls")
    assert info["state"] == "running" and info["forwarded"] == 200
    assert info["dest_uri"].startswith("amqps://guest@localhost:")  # no password
    # and back: the TLS broker as the source
    value = {"src-uri": good, "src-queue": "tls-in", "dest-uri": "amqp://", "dest-queue": "tls-back"}
    assert here.api.delete(SHOVEL + "tls")[0] == 204
    assert here.api.put(SHOVEL + "back", {"value": value})[0] == 201
    assert wait_until(lambda: depth(here.port, "tls-back") == 200, 20), shovel_state(here.api, "back")
    assert here.api.delete(SHOVEL + "back")[0] == 204


@pytest.mark.parametrize("query, why", [
    ({"certfile": "CLIENT", "keyfile": "KEY"}, "CERTIFICATE_VERIFY_FAILED"),  # no CA: the system's
    ({"cacertfile": "CA", "certfile": "CLIENT", "keyfile": "KEY", "server_name_indication": "elsewhere"},
     "CERTIFICATE_VERIFY_FAILED"),  # the certificate is not for that name
    ({"cacertfile": "CA"}, "closed by the broker"),  # no client certificate: refused (TLS 1.3: after)
    ({"cacertfile": "/nonexistent/ca.pem"}, "No such file"),
], ids=["untrusted", "wrong-name", "no-client-cert", "missing-file"])
def test_refused_tls_shows_as_a_state(pki, tls_there, here, query, why):
    files = {"CA": pki.ca, "CLIENT": pki.client_cert, "KEY": pki.client_key}
    query = {k: files.get(v, v) for k, v in query.items()}
    value = {"src-uri": "amqp://", "src-queue": "q", "dest-uri": amqps(tls_there, **query), "dest-queue": "q",
             "reconnect-delay": 0.2}
    assert here.api.put(SHOVEL + "bad", {"value": value})[0] == 201
    assert wait_until(lambda: shovel_state(here.api, "bad").get("state") == "terminated", 15)
    reason = shovel_state(here.api, "bad")["reason"]
    assert why in reason and "\n" not in reason, reason
    assert here.api.delete(SHOVEL + "bad")[0] == 204


def test_verify_none_and_bad_verify_value(tls_there, here, pki):
    publish(here.port, "vn-out", 5)
    uri = amqps(tls_there, verify="verify_none", certfile=pki.client_cert, keyfile=pki.client_key)
    value = {"src-uri": "amqp://", "src-queue": "vn-out", "dest-uri": uri, "dest-queue": "vn-in"}
    assert here.api.put(SHOVEL + "vn", {"value": value})[0] == 201
    assert wait_until(lambda: depth(tls_there.port, "vn-in") == 5, 20), shovel_state(here.api, "vn")
    value["dest-uri"] = amqps(tls_there, verify="maybe")
    code, body = here.api.put(SHOVEL + "vn", {"value": value})
    assert code == 400 and "verify='maybe'" in body["reason"], body


def test_federation_upstream_over_tls(pki, tls_there, here):
    uri = amqps(tls_there, cacertfile=pki.ca, certfile=pki.client_cert, keyfile=pki.client_key)
    assert here.api.put("/api/parameters/federation-upstream/%2F/up", {"value": {"uri": uri}})[0] == 201
    assert here.api.put("/api/policies/%2F/fed", {"pattern": "^fed-q$", "apply-to": "queues",
                                                  "definition": {"federation-upstream": "up"}})[0] == 201
    publish(tls_there.port, "fed-q", 20)
    conn = pika_connect(here.port)
    try:
        ch = conn.channel()
        ch.queue_declare("fed-q", durable=True)
        got = []
        ch.basic_consume("fed-q", lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
        assert wait_until(lambda: (conn.process_data_events(0.1), len(got) == 20)[1], 20), \
            here.api.get("/api/federation-links")[1]
        link, = here.api.ok("GET", "/api/federation-links")
        assert link["status"] == "running" and link["uri"].startswith("amqps://guest@localhost:")
    finally:
        close_quietly(conn)
