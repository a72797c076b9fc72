"""The web UI's single sign-on in a real headless Chromium: the login page offers the identity
provider (a small one run by the test: tests/oauth2_support.JwksServer), the authorization
code flow with PKCE goes through it and back, and the UI then works with the bearer token the
broker's oauth2 backend checks."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import requests

from eb_support import SubprocessBroker, free_port, wait_until
from oauth2_support import RSID, JwksServer, SigningKey

pytestmark = pytest.mark.timeout(120)
SCOPES = (f"{RSID}.tag:administrator", f"{RSID}.configure:*/*", f"{RSID}.write:*/*", f"{RSID}.read:*/*")


@pytest.fixture(scope="module")
def idp():
    with JwksServer(SigningKey("ui-key"), user="ops", scopes=SCOPES) as server:
        yield server


@pytest.fixture(scope="module")
def sso_broker(idp):
    workdir = Path(tempfile.mkdtemp(prefix="eb-ui-sso-"))
    admin_port = free_port()
    proc = SubprocessBroker(workdir, [
        "--data-dir", str(workdir / "data"), "--admin-host", "127.0.0.1", "--admin-port", str(admin_port),
        "--auth-backends", "internal,oauth2", "--auth-oauth2-jwks-url", idp.url,
        "--auth-oauth2-issuer", "https://idp.test/", "--management-oauth-client-id", "eb-ui",
        "--management-oauth-provider-url", idp.base, "--management-oauth-scopes", "openid rabbitmq.tag:administrator"])
    try:
        proc.start()
        assert wait_until(lambda: "admin API listening" in proc.log(), 15), proc.log()
        proc.admin_url = f"http://127.0.0.1:{admin_port}"
        yield proc
    finally:
        if proc.alive():
            proc.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


def test_auth_settings_tell_the_login_page_about_single_sign_on(sso_broker, idp):
    got = requests.get(f"{sso_broker.admin_url}/api/auth", timeout=10).json()
    assert got == {"oauth_enabled": True, "oauth_client_id": "eb-ui", "oauth_provider_url": idp.base,
                   "oauth_scopes": "openid rabbitmq.tag:administrator"}


def test_sign_in_with_the_identity_provider_then_use_and_leave_the_ui(browser, sso_broker, idp):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(sso_broker.admin_url + "/#/queues")
        page.get_by_role("button", name="Sign in with OAuth 2.0").click()
        page.wait_for_url(idp.base + "/authorize*")
        assert "Sign in to eb-ui as ops" in page.content()
        page.get_by_role("button", name="Approve").click()
        page.wait_for_selector("#whoami:has-text('ops')")
        assert "administrator" in page.locator("#whoami").inner_text()
        assert page.url.endswith("/#/queues") and "code=" not in page.url  # the code is gone from the URL
        [asked] = idp.token_requests
        assert asked["client_id"] == "eb-ui" and len(asked["code_verifier"]) >= 43  # PKCE, checked by the IdP
        page.get_by_role("link", name="Admin").click()  # an administrator's page, through the bearer token
        page.wait_for_selector("text=Users")
        page.get_by_role("button", name="Log out").click()
        page.get_by_role("button", name="Sign in with OAuth 2.0").wait_for()
        assert not errors, errors
    finally:
        context.close()


def test_a_tampered_answer_from_the_provider_is_refused(browser, sso_broker, idp):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        page.goto(sso_broker.admin_url + "/?code=forged&state=forged#/overview")
        page.wait_for_selector("#messages .msg")
        assert "does not match the request" in page.locator("#messages").inner_text()
        assert page.get_by_label("Username").is_visible()  # still logged out
    finally:
        context.close()
