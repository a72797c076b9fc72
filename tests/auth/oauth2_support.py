"""An identity provider's part in the OAuth 2.0 tests: signing keys made here (cryptography), a
JWKS document served over HTTP on a free port, tokens signed with PyJWT, and a broker using
them (in-process, with the admin API)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from exchange_broker.app import build_broker
from exchange_broker.config import Config
from exchange_broker.server.clock import LoopClock
from exchange_broker.testing import ThreadedBroker

RSID = "rabbitmq"
ISSUER = "https://idp.test/"


class SigningKey:
    def __init__(self, kid: str, kind: str = "rsa") -> None:
        self.kid = kid
        if kind == "rsa":
            self.private, self.alg = rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"
        elif kind == "ec":
            self.private, self.alg = ec.generate_private_key(ec.SECP256R1()), "ES256"
        else:
            self.private, self.alg = ed25519.Ed25519PrivateKey.generate(), "EdDSA"
        self.public = self.private.public_key()

    def jwk(self) -> dict:
        algo = jwt.get_algorithm_by_name(self.alg)
        d = json.loads(algo.to_jwk(self.public))
        d.update(kid=self.kid, use="sig", alg=self.alg)
        return d

    def pem(self) -> str:
        from cryptography.hazmat.primitives import serialization
        return self.public.public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def token(self, scopes=(), *, sub: str = "alice", aud=RSID, iss: str = ISSUER, ttl: float = 300,
              kid: str | None = "self", **claims) -> str:
        now = int(time.time())
        body = {"sub": sub, "aud": aud, "iss": iss, "iat": now, "exp": now + int(ttl),
                "scope": " ".join(scopes), **claims}
        body = {k: v for k, v in body.items() if v is not None}
        headers = {"kid": self.kid if kid == "self" else kid} if kid is not None else {}
        return jwt.encode(body, self.private, algorithm=self.alg, headers=headers)


class JwksServer:
    """GET /jwks -> the keys in ``self.keys``; counts the fetches."""

    def __init__(self, *keys: SigningKey) -> None:
        self.keys = list(keys)
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.fetches += 1
                body = json.dumps({"keys": [k.jwk() for k in outer.keys]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "JwksServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def auth_broker(**settings) -> ThreadedBroker:
    """An in-process broker (admin API on) with the Config ``settings`` (auth_* fields)."""
    settings.setdefault("auth_backends", "internal,oauth2")
    if "oauth2" in settings["auth_backends"]:
        settings.setdefault("auth_oauth2_issuer", ISSUER)
    settings.setdefault("auth_timeout", 3.0)
    config = Config(**settings)
    loop = asyncio.new_event_loop()
    broker = build_broker(LoopClock(loop), config=config)
    return ThreadedBroker(broker, loop=loop, admin=True)
