"""Helpers for the web UI tests: a plain HTTP call to the admin API, and image checks."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def http(base: str, method: str, path: str, body: Any = None, *, user: str = "guest",
         password: str = "guest", headers: dict | None = None, answer_headers: dict | None = None
         ) -> tuple[int, Any]:
    """(status, parsed JSON or text or None) of one admin API call with HTTP Basic; the answer's
    headers go into ``answer_headers`` when given."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            status, payload, got = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        status, payload, got = exc.code, exc.read(), exc.headers
    if answer_headers is not None:
        answer_headers.update({k.lower(): v for k, v in got.items()})
    ctype = got.get("content-type", "")
    if not payload:
        return status, None
    return status, json.loads(payload) if "json" in ctype else payload.decode("utf-8", "replace")


def distinct_colours(png: Path) -> int:
    """How many distinct colours a PNG file holds (decoded by Pillow, not guessed from its size)."""
    from PIL import Image
    with Image.open(io.BytesIO(png.read_bytes())) as img:
        img.load()
        assert img.format == "PNG"
        colours = img.convert("RGB").getcolors(maxcolors=1 << 24)
    return len(colours or [])


def login(page, base: str, user: str = "guest", password: str = "guest") -> None:
    """Log in with the keyboard only: type, Tab, type, Enter."""
    page.goto(base + "/")
    page.get_by_label("Username").fill(user)
    page.keyboard.press("Tab")
    page.keyboard.type(password)
    page.keyboard.press("Enter")
