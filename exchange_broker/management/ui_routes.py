"""The management web UI: ``/`` serves its page, ``/ui/...`` its scripts and styles, all files of
this package (``management/ui/``), so the UI works without internet access and without a build
step. The page talks to the same API as every other client (HTTP Basic with the broker's users,
or a bearer token from single sign-on); nothing here needs a login, as nothing here holds data:
``/api/auth`` tells the login page whether to offer single sign-on (RabbitMQ's field names)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parent / "ui"
_NO_CACHE = {"Cache-Control": "no-cache"}  # a new broker version serves new files at once


def mount(app: FastAPI) -> None:
    app.mount("/ui", StaticFiles(directory=UI_DIR), name="ui")

    @app.get("/api/auth", tags=["overview"])
    async def auth_settings(request: Request) -> dict:
        """The web UI's sign-in settings (no login needed): ``oauth_enabled`` and, when it is, the
        OAuth 2.0 client id, provider URL and scopes of --management-oauth-*."""
        return getattr(request.app.state.admin, "ui_oauth", None) or {"oauth_enabled": False}

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=_NO_CACHE)
