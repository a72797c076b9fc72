"""/api/health/checks/certificate-expiration/{n}/{unit} and the TLS protocol listeners, with real
amqps and HTTPS listeners whose certificates are made here with known validity periods."""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from sec_helpers import wait_for

from exchange_broker.server.tls import TLSConfig
from exchange_broker.testing import ThreadedBroker
from eb_support import free_port

pytest.importorskip("cryptography")

REPO = Path(__file__).resolve().parents[2]
NODE = "exchange-broker@localhost"
AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()


def _write_pki(directory: Path, *, leaf_days: float, ca_days: float, leaf_starts_in_days: float = 0) -> dict:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_end = now + dt.timedelta(days=ca_days)
    ca = (x509.CertificateBuilder().subject_name(name("health CA")).issuer_name(name("health CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(ca_end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    leaf_start = now + dt.timedelta(days=leaf_starts_in_days) - dt.timedelta(hours=1)
    leaf_end = now + dt.timedelta(days=leaf_days)
    leaf = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(leaf_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(leaf_start).not_valid_after(leaf_end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    paths["leaf_end"], paths["ca_end"] = leaf_end, ca_end
    return paths


def _rabbit_date(when: dt.datetime) -> str:
    """RabbitMQ's format for an expiry date: ``2025-01-02 3:04:05`` (UTC; the hour not padded)."""
    return f"{when.year}-{when.month:02d}-{when.day:02d} {when.hour}:{when.minute:02d}:{when.second:02d}"


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": AUTH})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def tls_broker(tmp_path):
    pki = _write_pki(tmp_path / "pki", leaf_days=10, ca_days=400)
    tls = TLSConfig(str(pki["cert"]), str(pki["key"]), str(pki["ca"]), port=0)
    with ThreadedBroker(admin=True, tls=tls) as tb:
        yield tb, pki


def test_certificate_expiration_of_the_amqps_listener(tls_broker):
    tb, pki = tls_broker
    base = f"{tb.admin_url}/api/health/checks/certificate-expiration"
    assert _get(f"{base}/1/weeks") == (200, {"status": "ok"})
    assert _get(f"{base}/9/days") == (200, {"status": "ok"})
    status, body = _get(f"{base}/2/weeks")
    assert status == 503
    assert body == {"status": "failed", "reason": "Certificates expiring", "expired": [{
        "node": NODE, "protocol": "amqp/ssl", "interface": "127.0.0.1", "port": tb.server.tls_port,
        "certfile": str(pki["cert"]), "cacertfile": str(pki["ca"]),
        "certfile_expires_on": [_rabbit_date(pki["leaf_end"])], "cacertfile_expires_on": []}]}
    status, body = _get(f"{base}/2/years")  # now the CA too
    assert status == 503
    assert body["expired"][0]["cacertfile_expires_on"] == [_rabbit_date(pki["ca_end"])]
    status, body = _get(f"{base}/1/years")  # 365 days: the leaf, not the CA (400 days)
    assert status == 503 and body["expired"][0]["cacertfile_expires_on"] == []
    assert _get(f"{base}/1/months")[0] == 503 and _get(f"{base}/0/days") == (200, {"status": "ok"})


def test_tls_protocol_listeners(tls_broker):
    tb, _pki = tls_broker
    checks = f"{tb.admin_url}/api/health/checks"
    for name in ("amqps", "amqp%2Fssl", "amqp/ssl", "AMQPS"):
        assert _get(f"{checks}/protocol-listener/{name}") == (200, {"status": "ok", "protocol": "amqp/ssl"})
    assert _get(f"{checks}/port-listener/{tb.server.tls_port}") == (
        200, {"status": "ok", "port": tb.server.tls_port})
    status, body = _get(f"{checks}/protocol-listener/https")
    assert status == 503 and body["protocols"] == ["amqp", "amqp/ssl", "http"]


def test_a_certificate_not_yet_valid_is_reported(tmp_path):
    pki = _write_pki(tmp_path / "pki", leaf_days=30, ca_days=400, leaf_starts_in_days=2)
    tls = TLSConfig(str(pki["cert"]), str(pki["key"]), str(pki["ca"]), port=0)
    with ThreadedBroker(admin=True, tls=tls) as tb:
        status, body = _get(f"{tb.admin_url}/api/health/checks/certificate-expiration/1/days")
    assert status == 503
    assert body["expired"][0]["certfile_expires_on"] == ["error: Certificate is not yet valid"]


def test_https_admin_listener_of_exchange_broker_serve(tmp_path):
    """`exchange-broker serve` with a certificate: the admin API is HTTPS and its listener is
    checked with the same certificate files."""
    pki = _write_pki(tmp_path / "pki", leaf_days=20, ca_days=400)
    tls_port, admin_port = free_port(), free_port()
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "exchange_broker", "serve", "--in-memory", "--host", "127.0.0.1",
           "--port", "0", "--port-file", str(port_file), "--tls-cert", str(pki["cert"]),
           "--tls-key", str(pki["key"]), "--tls-ca", str(pki["ca"]), "--tls-port", str(tls_port),
           "--admin-port", str(admin_port), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    checks = f"https://localhost:{admin_port}/api/health/checks"
    try:
        assert wait_for(lambda: port_file.exists() and port_file.read_text().strip(), timeout=20)

        def admin_up() -> bool:
            try:
                return _get(f"{checks}/alarms", ctx)[0] == 200
            except OSError:
                return False
        assert wait_for(admin_up, timeout=20)
        assert _get(f"{checks}/protocol-listener/https", ctx) == (200, {"status": "ok", "protocol": "https"})
        assert _get(f"{checks}/protocol-listener/http", ctx)[0] == 503
        assert _get(f"{checks}/port-listener/{admin_port}", ctx)[0] == 200
        status, body = _get(f"{checks}/certificate-expiration/3/weeks", ctx)
        assert status == 503
        assert sorted(item["protocol"] for item in body["expired"]) == ["amqp/ssl", "https"]
        assert {item["port"] for item in body["expired"]} == {tls_port, admin_port}
        assert _get(f"{checks}/certificate-expiration/2/weeks", ctx) == (200, {"status": "ok"})
    finally:
        proc.terminate()
        try:
            _out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
