"""`/api/docs` works without internet: the page and every script, stylesheet and icon it loads
come from the broker itself (Swagger UI's files are installed with it), none from a CDN."""

from __future__ import annotations

import json
import re
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from exchange_broker.testing import ThreadedBroker


class Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.urls.append(a["src"])
        elif tag == "link" and a.get("href"):
            self.urls.append(a["href"])
        elif tag in ("img", "iframe") and a.get("src"):
            self.urls.append(a["src"])


def fetch(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.headers.get("content-type", ""), resp.read()


def test_api_docs_loads_only_from_the_broker():
    with ThreadedBroker(admin=True) as tb:
        page_url = tb.admin_url + "/api/docs"
        status, ctype, body = fetch(page_url)
        assert status == 200 and ctype.startswith("text/html")
        html = body.decode()
        assert "SwaggerUIBundle" in html
        assert not re.search(r"https?://|//cdn", html), "an absolute URL in the docs page"
        parser = Assets()
        parser.feed(html)
        assert len(parser.urls) >= 2  # the script and the stylesheet at least
        kinds = set()
        for ref in parser.urls:
            parts = urlsplit(ref)
            assert not parts.scheme and not parts.netloc, ref  # relative to the broker
            status, ctype, asset = fetch(urljoin(page_url, ref))
            assert status == 200 and asset, ref
            kinds.add(ctype.split(";")[0])
        assert {"text/javascript", "text/css"} <= kinds or {"application/javascript", "text/css"} <= kinds
        # the OpenAPI document the page loads (url: 'openapi.json', relative to the page) answers
        spec_ref = re.search(r"url: '([^']+)'", html).group(1)
        status, _ctype, spec = fetch(urljoin(page_url, spec_ref))
        assert status == 200 and json.loads(spec)["openapi"].startswith("3.")


def test_swagger_ui_bundle_renders_openapi_3_1():
    """FastAPI writes OpenAPI 3.1, which Swagger UI renders from version 5 on."""
    with ThreadedBroker(admin=True) as tb:
        _s, _c, bundle = fetch(tb.admin_url + "/api/docs/static/swagger-ui-bundle.js")
        _s, _c, spec = fetch(tb.admin_url + "/api/openapi.json")
    assert json.loads(spec)["openapi"].startswith("3.1")
    version = re.search(rb'PACKAGE_VERSION:"(\d+)\.(\d+)\.(\d+)"', bundle)
    assert version, "no Swagger UI version in the bundle"
    assert int(version.group(1)) >= 5, version.group(0)
