"""Web UI fixtures: one broker subprocess (real `exchange-broker serve`, admin API on a free port,
statistics sampled every second so charts move within a test) and one headless Chromium per
module, driven by Playwright. The browser tests skip only when Debian's chromium is absent
(CI installs it: .ci/run)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from ui_support import CHROMIUM, CHROMIUM_ARGS, login

from eb_support import SubprocessBroker, free_port, wait_until


class UIBroker:
    def __init__(self, proc: SubprocessBroker, admin_port: int) -> None:
        self.proc = proc
        self.port = proc.port
        self.url = f"http://127.0.0.1:{admin_port}"


@pytest.fixture(scope="module")
def ui_broker():
    workdir = Path(tempfile.mkdtemp(prefix="eb-ui-"))
    admin_port = free_port()
    proc = SubprocessBroker(workdir, ["--data-dir", str(workdir / "data"), "--admin-host", "127.0.0.1",
                                      "--admin-port", str(admin_port), "--stats-sample-interval", "1"])
    try:
        proc.start()
        assert wait_until(lambda: "admin API listening" in proc.log(), 15), proc.log()
        yield UIBroker(proc, admin_port)
    finally:
        if proc.alive():
            proc.terminate()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install chromium) "
                    "to run the browser tests")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def page(browser, ui_broker):
    """One logged-in page for the module's tests (each test navigates where it needs)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    login(pg, ui_broker.url)
    pg.wait_for_selector("#totals .stat")
    pg.js_errors = errors
    yield pg
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"
