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
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exchange_broker.server.listener import BrokerServer

log = logging.getLogger("exchange_broker.tls")

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
        """An SSLContext for a listening socket (raises OSError/ssl.SSLError on bad files)."""
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


def from_args(args) -> TLSConfig | None:
    """The TLS settings of ``exchange-broker serve`` (None: no certificate, no TLS)."""
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if not cert and not key:
        return None
    if not (cert and key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    port = getattr(args, "tls_port", None)
    return TLSConfig(cert, key, getattr(args, "tls_ca", None),
                     bool(getattr(args, "tls_verify_peer", False)),
                     bool(getattr(args, "tls_fail_if_no_peer_cert", False)),
                     getattr(args, "tls_key_password", None),
                     DEFAULT_TLS_PORT if port is None else port)


def add_arguments(p) -> None:
    """``serve`` options for TLS (env EXCHANGE_BROKER_TLS_*)."""
    import os
    env = os.environ.get
    p.add_argument("--tls-port", type=int, default=int(env("EXCHANGE_BROKER_TLS_PORT", DEFAULT_TLS_PORT)),
                   help="amqps port, when --tls-cert and --tls-key are given (default 5671; 0 picks a "
                        "free port)")
    p.add_argument("--tls-cert", default=env("EXCHANGE_BROKER_TLS_CERT"),
                   help="server certificate (PEM; may hold the chain); turns on amqps and admin HTTPS")
    p.add_argument("--tls-key", default=env("EXCHANGE_BROKER_TLS_KEY"), help="private key (PEM)")
    p.add_argument("--tls-key-password", default=env("EXCHANGE_BROKER_TLS_KEY_PASSWORD"),
                   help="password of an encrypted private key")
    p.add_argument("--tls-ca", default=env("EXCHANGE_BROKER_TLS_CA"),
                   help="CA bundle (PEM) client certificates are verified against")
    p.add_argument("--tls-verify-peer", action="store_true",
                   default=env("EXCHANGE_BROKER_TLS_VERIFY_PEER", "") in ("1", "true", "yes"),
                   help="verify client certificates (RabbitMQ's verify_peer); needs --tls-ca")
    p.add_argument("--tls-fail-if-no-peer-cert", action="store_true",
                   default=env("EXCHANGE_BROKER_TLS_FAIL_IF_NO_PEER_CERT", "") in ("1", "true", "yes"),
                   help="refuse clients that send no certificate (implies --tls-verify-peer)")
    p.add_argument("--no-admin-tls", action="store_true", default=False,
                   help="serve the admin API over plain HTTP even when TLS is configured")


async def start_listener(server: "BrokerServer", tls: TLSConfig) -> asyncio.base_events.Server:
    """Open the amqps listener of ``server`` (same protocol, sessions and limits as plain AMQP)."""
    from exchange_broker.server.listener import AMQPProtocol
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: AMQPProtocol(server), server.host, tls.port,
                                        ssl=tls.server_context(), reuse_address=True, backlog=1024,
                                        ssl_handshake_timeout=max(1.0, float(server.handshake_timeout)))
    tls.port = listener.sockets[0].getsockname()[1]
    log.info("AMQPS listener on %s:%d (client certificates: %s)", server.host, tls.port,
             {ssl.CERT_NONE: "not requested", ssl.CERT_OPTIONAL: "verified when sent",
              ssl.CERT_REQUIRED: "required"}[tls.cert_reqs])
    return listener


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
