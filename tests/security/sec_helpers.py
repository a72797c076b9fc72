"""Helpers for the security tests: a throwaway PKI, a raw AMQP socket, small waits."""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pika
from pamqp import commands
from pamqp import exceptions as pexc
from pamqp import frame as pframe

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def connect(port: int, user: str = "guest", password: str = "guest", vhost: str = "/",
            **kw) -> pika.BlockingConnection:
    kw.setdefault("heartbeat", 0)
    kw.setdefault("blocked_connection_timeout", 30)
    kw.setdefault("socket_timeout", 10)
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), **kw))


def roundtrip(port: int, body: bytes = b"ping", **kw) -> None:
    """A fresh pika connection publishes to a fresh queue and gets the message back."""
    conn = connect(port, **kw)
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", q, body)
        method, _props, got = ch.basic_get(q, auto_ack=True)
        assert method is not None and got == body
    finally:
        conn.close()


def close_quietly(*conns) -> None:
    for c in conns:
        try:
            if c is not None and c.is_open:
                c.close()
        except Exception:
            pass


class Raw:
    """A plain socket speaking AMQP frames by hand (pamqp marshals them)."""

    def __init__(self, port: int, *, handshake: bool = True, user: str = "guest", password: str = "guest",
                 vhost: str = "/", channel_max: int = 0, frame_max: int = 131072, heartbeat: int = 0,
                 timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.tune = None
        self.opened = None
        if handshake:
            self.handshake(user, password, vhost, channel_max, frame_max, heartbeat)

    def handshake(self, user="guest", password="guest", vhost="/", channel_max=0, frame_max=131072,
                  heartbeat=0):
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.send(commands.Connection.StartOk(
            client_properties={"product": "security-test",
                               "capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN", response=f"\x00{user}\x00{password}"))
        got = self.read_frame()
        if got is None or not isinstance(got[1], commands.Connection.Tune):
            self.opened = got
            return got
        self.tune = got[1]
        self.send(commands.Connection.TuneOk(channel_max or self.tune.channel_max, frame_max, heartbeat))
        self.send(commands.Connection.Open(vhost))
        self.opened = self.read_frame()
        return self.opened

    def send(self, method, channel: int = 0) -> None:
        self.sock.sendall(pframe.marshal(method, channel))

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass

    def read_frame(self, timeout: float = 5.0):
        """Next (channel, frame); None once the broker closed the socket."""
        self.sock.settimeout(timeout)
        while True:
            try:
                n, channel, frame = pframe.unmarshal(self.buf)
                self.buf = self.buf[n:]
                return channel, frame
            except pexc.UnmarshalingException:
                pass
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not data:
                return None
            self.buf += data

    def expect(self, cls, timeout: float = 5.0):
        while True:
            got = self.read_frame(timeout)
            assert got is not None, f"socket closed while waiting for {cls.__name__}"
            if isinstance(got[1], cls):
                return got[1]

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes the socket within ``timeout`` (frames before EOF are read)."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return True
            if not data:
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# -- a throwaway PKI (cryptography) ----------------------------------------------------------------

@dataclass
class PKI:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path     # a client certificate from a CA the broker does not trust
    rogue_key: Path


def make_pki(directory: Path) -> PKI:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def key():
        return ec.generate_private_key(ec.SECP256R1())

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "exchange-broker tests")])

    def ca_cert(k, cn):
        return (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                .public_key(k.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(k, hashes.SHA256()))

    def leaf(k, cn, issuer_key, issuer_cert, server: bool):
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer_cert.subject)
             .public_key(k.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    def write(path: Path, cert=None, k=None) -> Path:
        if cert is not None:
            path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        else:
            path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))
        return path

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = key()
    ca = ca_cert(ca_key, "exchange-broker test CA")
    rogue_ca_key = key()
    rogue_ca = ca_cert(rogue_ca_key, "rogue CA")
    s_key, c_key, r_key = key(), key(), key()
    return PKI(
        directory,
        write(directory / "ca.pem", ca),
        write(directory / "server.pem", leaf(s_key, "localhost", ca_key, ca, True)),
        write(directory / "server.key", k=s_key),
        write(directory / "client.pem", leaf(c_key, "test-client", ca_key, ca, False)),
        write(directory / "client.key", k=c_key),
        write(directory / "rogue.pem", leaf(r_key, "rogue-client", rogue_ca_key, rogue_ca, False)),
        write(directory / "rogue.key", k=r_key),
    )
