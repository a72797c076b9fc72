"""An identity provider's part in the OAuth 2.0 tests: signing keys made here (cryptography), a
JWKS document served over HTTP on a free port, tokens signed with PyJWT, and a broker using
them (in-process, with the admin API)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

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
    """A small identity provider on a free port: GET /jwks (the keys in ``self.keys``, fetches
    counted), and for the web UI's single sign-on the authorization code flow with PKCE:
    /.well-known/openid-configuration, /authorize (a page with an Approve button), /approve
    (redirects back with a code), POST /token (checks the code, client, redirect URI and the
    S256 code verifier; answers a token signed with ``keys[0]`` for ``user`` and ``scopes``)."""

    def __init__(self, *keys: SigningKey, user: str = "ops", scopes: tuple = ()) -> None:
        self.keys = list(keys)
        self.fetches = 0
        self.user, self.scopes = user, tuple(scopes)
        self.codes: dict[str, dict] = {}
        self.token_requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status, body, ctype="application/json", headers=()):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Access-Control-Allow-Origin", "*")
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _form(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return {k: v[0] for k, v in parse_qs(self.rfile.read(n).decode()).items()}

            def do_GET(self):  # noqa: N802
                url = urlparse(self.path)
                if url.path == "/jwks":
                    outer.fetches += 1
                    return self._send(200, {"keys": [k.jwk() for k in outer.keys]})
                if url.path == "/.well-known/openid-configuration":
                    return self._send(200, {"issuer": ISSUER, "jwks_uri": outer.base + "/jwks",
                                            "authorization_endpoint": outer.base + "/authorize",
                                            "token_endpoint": outer.base + "/token"})
                if url.path == "/authorize":
                    q = {k: v[0] for k, v in parse_qs(url.query).items()}
                    fields = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                                     for k, v in q.items())
                    page = (f"<!DOCTYPE html><title>Test IdP</title><h1>Test identity provider</h1>"
                            f"<p>Sign in to {html.escape(q.get('client_id', ''))} as {html.escape(outer.user)}?</p>"
                            f'<form method="post" action="/approve">{fields}<button>Approve</button></form>')
                    return self._send(200, page.encode(), "text/html")
                self._send(404, {"error": "not_found"})

            def do_POST(self):  # noqa: N802
                form = self._form()
                if self.path == "/approve":
                    code = secrets.token_urlsafe(16)
                    outer.codes[code] = form
                    target = form["redirect_uri"] + "?" + urlencode({"code": code, "state": form.get("state", "")})
                    return self._send(302, b"", "text/plain", [("Location", target)])
                if self.path == "/token":
                    outer.token_requests.append(form)
                    asked = outer.codes.pop(form.get("code", ""), None)
                    verifier = form.get("code_verifier", "")
                    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
                    if asked is None or form.get("grant_type") != "authorization_code" \
                            or form.get("client_id") != asked.get("client_id") \
                            or form.get("redirect_uri") != asked.get("redirect_uri") \
                            or asked.get("code_challenge_method") != "S256" or challenge != asked.get("code_challenge"):
                        return self._send(400, {"error": "invalid_grant"})
                    token = outer.keys[0].token(outer.scopes, sub=outer.user)
                    return self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": 300})
                self._send(404, {"error": "not_found"})

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = self.base + "/jwks"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "JwksServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def auth_broker(*, mqtt: bool = False, **settings) -> ThreadedBroker:
    """An in-process broker (admin API on; an MQTT listener with ``mqtt``) with the Config
    ``settings`` (auth_* fields)."""
    settings.setdefault("auth_backends", "internal,oauth2")
    if "oauth2" in settings["auth_backends"]:
        settings.setdefault("auth_oauth2_issuer", ISSUER)
    settings.setdefault("auth_timeout", 3.0)
    config = Config(**settings)
    loop = asyncio.new_event_loop()
    broker = build_broker(LoopClock(loop), config=config)
    return ThreadedBroker(broker, loop=loop, admin=True, mqtt=mqtt)
