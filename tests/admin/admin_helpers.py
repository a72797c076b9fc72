"""Helpers for the admin API tests: plain HTTP calls against the admin API."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote


class Api:
    """Plain HTTP against the admin API: every call returns (status, parsed JSON or text or None)."""

    def __init__(self, base: str, user: str | None = "guest", password: str = "guest") -> None:
        self.base = base
        self.user = user
        self.password = password

    def as_user(self, user: str | None, password: str = "") -> "Api":
        return Api(self.base, user, password)

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             headers: dict | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if data is not None and raw is None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                status, payload, ctype = resp.status, resp.read(), resp.headers.get("content-type", "")
                self.last_headers = resp.headers
        except urllib.error.HTTPError as exc:
            status, payload, ctype = exc.code, exc.read(), exc.headers.get("content-type", "")
            self.last_headers = exc.headers
        if not payload:
            return status, None
        if "json" in ctype:
            return status, json.loads(payload)
        return status, payload.decode("utf-8", "replace")

    def get(self, path: str, **kw):
        return self.call("GET", path, **kw)

    def put(self, path: str, body: Any = None, **kw):
        return self.call("PUT", path, body if body is not None else {}, **kw)

    def post(self, path: str, body: Any = None, **kw):
        return self.call("POST", path, body if body is not None else {}, **kw)

    def delete(self, path: str, **kw):
        return self.call("DELETE", path, **kw)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.call(method, path, body)
        assert 200 <= status < 300, (method, path, status, data)
        return data


def q(name: str) -> str:
    return quote(name, safe="")
