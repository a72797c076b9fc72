"""TLS: the amqps listener (default port 5671) and HTTPS for the admin API, from PEM files.

RabbitMQ's options map as follows:

=================================  ==========================================================
RabbitMQ (``ssl_options.*``)       here
=================================  ==========================================================
``listeners.ssl.default = 5671``   ``--tls-port`` (5671 when a certificate and key are given)
``certfile`` / ``keyfile``         ``--tls-cert`` / ``--tls-key`` (``--tls-key-password``)
``cacertfile``                     ``--tls-ca``: the CAs client certificates are checked against
``verify = verify_peer``           ``--tls-verify-peer``: a client certificate, when sent,
                                   must chain to ``--tls-ca``
``fail_if_no_peer_cert = true``    ``--tls-fail-if-no-peer-cert``: a client without a
                                   certificate is refused during the TLS handshake
=================================  ==========================================================

TLS 1.2 is the minimum version. The TLS handshake is bounded by the same handshake timeout as the
AMQP handshake, so a socket that connects and never speaks is dropped.

This module only turns the settings (``config.Config.tls``) into an SSL context for the amqps
listener (opened by ``listener.py``) and into uvicorn's options for the admin API's HTTPS.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

DEFAULT_TLS_PORT = 5671


@dataclass
class TLSConfig:
    certfile: str
    keyfile: str
    cafile: str | None = None
    verify_peer: bool = False
    fail_if_no_peer_cert: bool = False
    key_password: str | None = None
    port: int = DEFAULT_TLS_PORT

    def __post_init__(self) -> None:
        if self.fail_if_no_peer_cert:
            self.verify_peer = True
        if self.verify_peer and not self.cafile:
            raise ValueError("--tls-verify-peer needs --tls-ca (the CAs client certificates must chain to)")

    @property
    def cert_reqs(self) -> ssl.VerifyMode:
        if not self.verify_peer:
            return ssl.CERT_NONE
        return ssl.CERT_REQUIRED if self.fail_if_no_peer_cert else ssl.CERT_OPTIONAL

    def server_context(self) -> ssl.SSLContext:
        """An SSLContext for a listening socket (a ValueError naming the file when one cannot be loaded)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.certfile, self.keyfile, self.key_password)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the TLS certificate {self.certfile!r} with key "
                             f"{self.keyfile!r}: {exc}") from None
        if self.cafile:
            try:
                ctx.load_verify_locations(cafile=self.cafile)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load the CA bundle {self.cafile!r}: {exc}") from None
        ctx.verify_mode = self.cert_reqs
        return ctx

    def uvicorn_options(self) -> dict:
        """The same certificate for the admin API's HTTPS (uvicorn.Config keyword arguments)."""
        opts = {"ssl_certfile": self.certfile, "ssl_keyfile": self.keyfile,
                "ssl_cert_reqs": int(self.cert_reqs)}
        if self.key_password:
            opts["ssl_keyfile_password"] = self.key_password
        if self.cafile:
            opts["ssl_ca_certs"] = self.cafile
        return opts

    def describe(self) -> str:
        """What the listener asks of clients, for the log."""
        return {ssl.CERT_NONE: "not requested", ssl.CERT_OPTIONAL: "verified when sent",
                ssl.CERT_REQUIRED: "required"}[self.cert_reqs]


def peer_certificate_subject(transport) -> str | None:
    """The verified client certificate's subject as ``CN=...,O=...`` (None: no certificate)."""
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    parts = []
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
                     "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST"}.get(key, key)
            parts.append(f"{short}={value}")
    return ",".join(parts)
