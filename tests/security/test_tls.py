"""TLS: amqps with pika (SSLOptions) and aio-pika (amqps URL), client-certificate verification,
HTTPS for the admin API, and the command line; all against a throwaway CA made here."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pika
import pytest
from sec_helpers import PROTOCOL_HEADER, make_pki, roundtrip, wait_for

from exchange_broker.testing import ThreadedBroker
from exchange_broker.server.tls import TLSConfig
from eb_support import free_port

pytest.importorskip("cryptography")

REPO = Path(__file__).resolve().parents[2]
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, OSError)  # pika raises either


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_context(pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def tls_params(tb, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", tb.server.tls_port, heartbeat=0, socket_timeout=5,
                                     ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     connection_attempts=1)


def tls_roundtrip(tb, ctx: ssl.SSLContext, body: bytes = b"over tls") -> None:
    conn = pika.BlockingConnection(tls_params(tb, ctx))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
        method, _props, got = ch.basic_get(q, auto_ack=True)
        assert got == body
    finally:
        conn.close()


@pytest.fixture
def tls_broker(pki):
    with ThreadedBroker(tls=TLSConfig(str(pki.server_cert), str(pki.server_key), port=0)) as tb:
        yield tb


def test_amqps_with_pika_and_plain_port_side_by_side(tls_broker, pki):
    assert tls_broker.server.tls_port and tls_broker.server.tls_port != tls_broker.port
    tls_roundtrip(tls_broker, client_context(pki))
    roundtrip(tls_broker.port)  # the plain listener still serves
    # TLS connections are ordinary sessions: the same broker state, loopback guest allowed
    conn = pika.BlockingConnection(tls_params(tls_broker, client_context(pki)))
    try:
        ch = conn.channel()
        ch.queue_declare("tls-q")
        plain = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_broker.port, heartbeat=0))
        plain.channel().basic_publish("", "tls-q", b"from plain")
        plain.close()
        assert wait_for(lambda: ch.queue_declare("tls-q", passive=True).method.message_count == 1)
        assert ch.basic_get("tls-q", auto_ack=True)[2] == b"from plain"
    finally:
        conn.close()


def test_amqps_with_aio_pika_url(tls_broker, pki):
    aio_pika = pytest.importorskip("aio_pika")

    async def main():
        url = f"amqps://guest:guest@localhost:{tls_broker.server.tls_port}/?cafile={pki.ca}"
        conn = await aio_pika.connect(url, timeout=10)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(b"aio over tls"), routing_key=q.name)
            msg = await q.get(timeout=5)
            await msg.ack()
            return msg.body

    assert asyncio.run(main()) == b"aio over tls"


def test_untrusted_server_certificate_is_rejected_by_the_client(tls_broker):
    ctx = ssl.create_default_context()  # system CAs only: our throwaway CA is unknown
    with pytest.raises(REFUSED):
        pika.BlockingConnection(tls_params(tls_broker, ctx))
    roundtrip(tls_broker.port)


def test_plain_amqp_on_the_tls_port_and_garbage_are_dropped(tls_broker, pki):
    for payload in (PROTOCOL_HEADER, b"\x16\x03\x01\x00\x05hello", os.urandom(512)):
        s = socket.create_connection(("127.0.0.1", tls_broker.server.tls_port), timeout=5)
        s.sendall(payload)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass  # a TLS alert at most, then EOF
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    tls_roundtrip(tls_broker, client_context(pki))
    assert wait_for(lambda: len(tls_broker.server.protocols) == 0)


def test_tls_handshake_timeout_drops_a_silent_socket(pki):
    tls = TLSConfig(str(pki.server_cert), str(pki.server_key), port=0)
    with ThreadedBroker(tls=tls, handshake_timeout=1) as tb:
        s = socket.create_connection(("127.0.0.1", tb.server.tls_port), timeout=10)
        t0 = time.monotonic()
        s.settimeout(10)
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass
        assert time.monotonic() - t0 < 5
        s.close()
        tls_roundtrip(tb, client_context(pki))


@pytest.mark.parametrize("fail_if_no_peer_cert", [True, False], ids=["cert-required", "cert-optional"])
def test_client_certificate_verification(pki, fail_if_no_peer_cert):
    tls = TLSConfig(str(pki.server_cert), str(pki.server_key), str(pki.ca), verify_peer=True,
                    fail_if_no_peer_cert=fail_if_no_peer_cert, port=0)
    with ThreadedBroker(tls=tls) as tb:
        # a certificate signed by the trusted CA: accepted
        tls_roundtrip(tb, client_context(pki, pki.client_cert, pki.client_key))
        # a certificate from an unknown CA: refused in the TLS handshake, either way
        with pytest.raises(REFUSED):
            tls_roundtrip(tb, client_context(pki, pki.rogue_cert, pki.rogue_key))
        # no certificate at all: refused only with fail_if_no_peer_cert
        if fail_if_no_peer_cert:
            with pytest.raises(REFUSED):
                tls_roundtrip(tb, client_context(pki))
        else:
            tls_roundtrip(tb, client_context(pki))
        roundtrip(tb.port)
        assert wait_for(lambda: len(tb.server.protocols) == 0)


def test_verify_peer_needs_a_ca(pki):
    with pytest.raises(ValueError, match="--tls-ca"):
        TLSConfig(str(pki.server_cert), str(pki.server_key), verify_peer=True)


def test_admin_api_over_https(pki):
    pytest.importorskip("uvicorn")
    from exchange_broker.management.server import AdminServer

    tls = TLSConfig(str(pki.server_cert), str(pki.server_key), port=0)
    with ThreadedBroker(tls=tls) as tb:
        admin = AdminServer(tb.broker, "127.0.0.1", 0, amqp_server=tb.server, ssl_options=tls.uvicorn_options())
        asyncio.run_coroutine_threadsafe(admin.start(), tb.loop).result(10)
        try:
            assert admin.url.startswith("https://")
            req = urllib.request.Request(f"https://localhost:{admin.port}/api/whoami")
            req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
            with urllib.request.urlopen(req, context=client_context(pki), timeout=10) as resp:
                assert json.loads(resp.read())["name"] == "guest"
            with pytest.raises(Exception):  # plain HTTP to the HTTPS port gets nothing useful
                urllib.request.urlopen(f"http://127.0.0.1:{admin.port}/api/whoami", timeout=5)
        finally:
            asyncio.run_coroutine_threadsafe(admin.stop(), tb.loop).result(10)


def test_command_line_tls_and_https(pki, tmp_path):
    """`exchange-broker serve --tls-cert/--tls-key/--tls-port` serves amqps and the admin API
    over HTTPS with the same certificate."""
    tls_port, admin_port = free_port(), free_port()
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--host", "127.0.0.1",
           "--port", "0", "--port-file", str(port_file), "--tls-cert", str(pki.server_cert),
           "--tls-key", str(pki.server_key), "--tls-port", str(tls_port), "--admin-port", str(admin_port),
           "--max-connections", "5", "--handshake-timeout", "3", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: port_file.exists() and port_file.read_text().strip(), timeout=20)

        def admin_up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", admin_port), timeout=1):
                    return True
            except OSError:
                return False
        assert wait_for(admin_up, timeout=20)
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", tls_port, heartbeat=0, ssl_options=pika.SSLOptions(client_context(pki), "localhost")))
        ch = conn.channel()
        ch.queue_declare("cli-tls")
        ch.basic_publish("", "cli-tls", b"x")
        conn.close()
        req = urllib.request.Request(f"https://localhost:{admin_port}/api/queues/%2F/cli-tls")
        req.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(req, context=client_context(pki), timeout=10) as resp:
            assert json.loads(resp.read())["name"] == "cli-tls"
    finally:
        proc.terminate()
        try:
            _out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
