"""EXTERNAL authentication with a TLS client certificate (issue 12, §4).

As RabbitMQ's rabbitmq_auth_mechanism_ssl (ssl_cert_login_from = common_name): the user name is
the verified client certificate's subject CN, no password; EXTERNAL is offered in
connection.start only on a TLS connection whose client sent a certificate that was verified. A
throwaway CA and certificates are made here with ``cryptography``; the client is pika with
``ExternalCredentials``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from pamqp import commands as C
from pamqp import frame as pframe

from eb_support import PROTOCOL_HEADER, uniq

from exchange_broker.server.tls import TLSConfig
from exchange_broker.testing import ThreadedBroker

x509 = pytest.importorskip("cryptography.x509")


@dataclass
class Certs:
    ca: Path
    server: tuple[Path, Path]
    clients: dict[str, tuple[Path, Path]]  # CN -> (certificate, key)


def make_certs(directory: Path, client_cns: list[str]) -> Certs:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def subject(cn: str):
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "compat tests"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(cn: str, key, issuer_name, issuer_key, *, ca: bool = False, server: bool = False):
        b = (x509.CertificateBuilder().subject_name(subject(cn)).issuer_name(issuer_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
            b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def save(name: str, cert, key) -> tuple[Path, Path]:
        c, k = directory / f"{name}.pem", directory / f"{name}.key"
        c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
        return c, k

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("compat test CA", ca_key, subject("compat test CA"), ca_key, ca=True)
    ca_path, _ = save("ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = save("server", issue("localhost", server_key, ca.subject, ca_key, server=True), server_key)
    clients = {}
    for i, cn in enumerate(client_cns):
        key = ec.generate_private_key(ec.SECP256R1())
        clients[cn] = save(f"client{i}", issue(cn, key, ca.subject, ca_key), key)
    return Certs(ca_path, server, clients)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("pki"), ["cert-user", "nobody-here"])


@pytest.fixture
def tls_broker(certs):
    tls = TLSConfig(str(certs.server[0]), str(certs.server[1]), str(certs.ca), verify_peer=True, port=0)
    with ThreadedBroker(tls=tls) as tb:
        def setup():
            tb.broker.add_user("cert-user", None, [])  # no password: only EXTERNAL can log it in
            tb.broker.set_permissions("cert-user", "/", ".*", ".*", ".*")
        tb.call(setup)
        yield tb


def context(certs: Certs, cn: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cn is not None:
        cert, key = certs.clients[cn]
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def mechanisms(port: int, ctx: ssl.SSLContext | None) -> list[str]:
    """The mechanisms connection.start offers on a (TLS) connection."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock = ctx.wrap_socket(raw, server_hostname="localhost") if ctx is not None else raw
    try:
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        while not data.endswith(b"\xce"):
            data += sock.recv(65536)
        start = pframe.unmarshal(data)[2]
        assert isinstance(start, C.Connection.Start)
        return start.mechanisms.split()
    finally:
        sock.close()


def external_params(tb, ctx: ssl.SSLContext) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", tb.server.tls_port, heartbeat=0, socket_timeout=5,
                                     connection_attempts=1, ssl_options=pika.SSLOptions(ctx, "localhost"),
                                     credentials=pika.credentials.ExternalCredentials())


def test_external_offered_only_with_a_verified_client_certificate(tls_broker, certs):
    assert mechanisms(tls_broker.server.tls_port, context(certs, "cert-user")) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]
    assert mechanisms(tls_broker.server.tls_port, context(certs, None)) == ["PLAIN", "AMQPLAIN"]
    assert mechanisms(tls_broker.port, None) == ["PLAIN", "AMQPLAIN"]


def test_pika_external_logs_in_as_the_certificate_cn(tls_broker, certs):
    conn = pika.BlockingConnection(external_params(tls_broker, context(certs, "cert-user")))
    try:
        ch = conn.channel()
        q = ch.queue_declare(uniq("ext"), exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, b"vouched for by a certificate")
        assert ch.basic_get(q, auto_ack=True)[2] == b"vouched for by a certificate"
        users = tls_broker.call(lambda: [(s.user, s.auth_mechanism) for s in tls_broker.broker.sessions])
        assert users == [("cert-user", "EXTERNAL")]
    finally:
        conn.close()


def test_external_for_a_cn_that_is_no_user_is_refused(tls_broker, certs):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(external_params(tls_broker, context(certs, "nobody-here")))
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL" in str(info.value)


def test_external_without_a_certificate_is_not_a_mechanism(tls_broker, certs):
    with pytest.raises((pika.exceptions.AMQPConnectionError, pika.exceptions.AuthenticationError)):
        pika.BlockingConnection(external_params(tls_broker, context(certs, None)))
    # the PLAIN user of the same broker still logs in over the same listener
    params = external_params(tls_broker, context(certs, None))
    params.credentials = pika.PlainCredentials("guest", "guest")
    pika.BlockingConnection(params).close()


def test_external_mechanism_forced_on_a_plain_connection_is_403(broker):
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    try:
        sock.sendall(PROTOCOL_HEADER)
        data = b""
        while not data.endswith(b"\xce"):
            data += sock.recv(65536)
        caps = {"capabilities": {"authentication_failure_close": True}}  # else just a closed socket
        sock.sendall(pframe.marshal(C.Connection.StartOk(client_properties=caps, mechanism="EXTERNAL",
                                                         response=""), 0))
        data = b""
        while not data.endswith(b"\xce"):
            data += sock.recv(65536)
        close = pframe.unmarshal(data)[2]
        assert isinstance(close, C.Connection.Close) and close.reply_code == 403
        assert "unsupported authentication mechanism 'EXTERNAL'" in close.reply_text
    finally:
        sock.close()
