"""The dashboard in a real browser: Debian's chromium driven by Playwright over real HTTP.

The server is the usual test app (real SQLite, real files, e-mail to the SMTP sink) on the
test's event loop; Playwright's async API shares that loop, so the server answers while the
test awaits the browser. Never ``playwright install``: the browser is /usr/bin/chromium.

Screenshots (files grid, API keys, the upload queue waiting out a 429, the file view, the mobile
Activity page) go to the directory named by MEDIASRV_TEST_ARTIFACTS, else to the test's tmp_path:
never into the checkout, so a test run leaves every tracked file as it was.
"""
from __future__ import annotations

import asyncio
import atexit
import io
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import tornado.ioloop
from PIL import Image, ImageDraw

from mediasrv.assembly.app import Runtime
from mediasrv.base.settings import Settings
from mediasrv.core.invites import InviteService
from tests.conftest import Api, ShiftableClock, body
from tests.dnsserver import LocalDns

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (/usr/bin/chromium); .ci/run installs it",
                allow_module_level=True)

from playwright.async_api import (  # noqa: E402
    Browser,
    ConsoleMessage,
    Page,
    Playwright,
    Route,
    async_playwright,
    expect,
)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 15_000
PASSWORD = "s3cret-pass"
OVERFLOW = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
"""How far the page is wider than the screen (0: nothing to scroll sideways)."""

# Slow (a browser): scheduled first (tests/conftest.py). On one worker, so the module's loop and
# Playwright driver start once per run, not once per worker that takes one of its tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser-dashboard")]


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: $MEDIASRV_TEST_ARTIFACTS, else this test's tmp_path (outside the checkout)."""
    where = Path(os.environ["MEDIASRV_TEST_ARTIFACTS"]) if os.environ.get("MEDIASRV_TEST_ARTIFACTS") \
        else tmp_path / "artifacts"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
def app_env(request: pytest.FixtureRequest, local_dns: LocalDns) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100", "MEDIASRV_DNS_NAMESERVERS": local_dns.nameserver,
            **getattr(request, "param", {})}


class SharedChromium:
    """One chromium per test process, which each test's Playwright drives over CDP in a context
    of its own (cookies, storage and permissions apart): a launch costs 1.4 s of CPU, and the
    browser tests of one run made about thirty. Started at the first use, started again if it
    died, stopped when the process exits."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._profile = ""
        self.endpoint = ""
        atexit.register(self.stop)

    def ensure(self) -> str:
        if self._proc is None or self._proc.poll() is not None:
            self.stop()
            self._start()
        return self.endpoint

    def _start(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="mediasrv-chromium-")
        self._proc = subprocess.Popen([str(CHROMIUM), *ARGS, "--remote-debugging-port=0",
                                       f"--user-data-dir={self._profile}", "about:blank"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        active = Path(self._profile) / "DevToolsActivePort"  # the port chromium chose, when it listens
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._proc.poll() is None:
            lines = active.read_text().splitlines() if active.exists() else []
            if len(lines) >= 2:
                self.endpoint = f"http://127.0.0.1:{lines[0]}"
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("chromium did not open its DevTools port within 30 s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = ""


CHROMIUM_PROCESS = SharedChromium()
DRIVERS: dict[asyncio.AbstractEventLoop, Playwright] = {}
"""The Playwright driver started for a module's event loop (``playwright_driver``)."""


@pytest.fixture(scope="module")
def io_loop() -> Iterator[tornado.ioloop.IOLoop]:
    """One event loop for a browser module's tests (pytest-tornasync makes one per test), so
    they share one Playwright driver: a node process that costs 1.6 s of CPU to start, and the
    browser tests of one run started 28. Each test's server, stores and page are its own and
    stopped at its end, as with a loop of its own."""
    loop = tornado.ioloop.IOLoop()
    loop.make_current()
    yield loop
    loop.clear_current()
    loop.close(all_fds=True)


@pytest.fixture(scope="module", autouse=True)
def playwright_driver(io_loop: tornado.ioloop.IOLoop) -> Iterator[None]:
    """The module's Playwright driver, started on its loop and found there by ``browser_page``."""
    driver = io_loop.run_sync(async_playwright().start)
    DRIVERS[io_loop.asyncio_loop] = driver  # type: ignore[attr-defined]
    yield
    del DRIVERS[io_loop.asyncio_loop]  # type: ignore[attr-defined]
    io_loop.run_sync(driver.stop)


@asynccontextmanager
async def _driver() -> AsyncIterator[Playwright]:
    """This loop's shared driver, else one for the caller alone."""
    shared = DRIVERS.get(asyncio.get_running_loop())
    if shared is not None:
        yield shared
        return
    async with async_playwright() as pw:
        yield pw


@asynccontextmanager
async def browser_page(base: str, viewport: tuple[int, int] = (1280, 860), fake_clock: bool = False,
                       own_browser: bool = False) -> AsyncIterator[tuple[Page, list[str]]]:
    """A fresh browser context and page with clipboard access; yields (page, console problems).

    ``fake_clock``: the page's timers and Date run on Playwright's clock (``page.clock``), which
    flows on its own until a test jumps it forward (``fast_forward``) past a wait.

    ``own_browser``: a chromium launched for this page alone, not the shared one over CDP (a
    file given to ``set_input_files`` is read by a browser Playwright launched, but has to be
    streamed to one it connected to: slow for a few MB, stalling above that).
    """
    problems: list[str] = []
    async with _driver() as pw:
        if own_browser:
            browser: Browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        else:
            browser = await pw.chromium.connect_over_cdp(await asyncio.to_thread(CHROMIUM_PROCESS.ensure))
        try:
            context = await browser.new_context(viewport={"width": viewport[0], "height": viewport[1]},
                                                base_url=base)
            await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
            page = await context.new_page()
            if fake_clock:
                await page.clock.install()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)

            def on_console(msg: ConsoleMessage) -> None:
                # Failed requests the app handles (the 401 before a refresh) log as errors too.
                # An upload refused with 429 is an expected answer the queue waits out.
                if msg.type == "error" and "status of 401" not in msg.text and "status of 429" not in msg.text:
                    problems.append(msg.text)

            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            yield page, problems
        finally:
            await browser.close()  # over CDP: its contexts close, the shared chromium stays


def picture(color: tuple[int, int, int], label: str) -> bytes:
    """A 640x480 PNG with a shape and a label, so thumbnails are recognisable in screenshots."""
    image = Image.new("RGB", (640, 480), color)
    draw = ImageDraw.Draw(image)
    draw.ellipse((180, 100, 460, 380), fill=(255, 255, 255))
    draw.rectangle((40, 40, 200, 120), fill=tuple(c // 2 for c in color))
    draw.text((60, 70), label, fill=(255, 255, 255))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


async def clipboard(page: Page) -> str:
    return await page.evaluate("() => navigator.clipboard.readText()")


async def assert_accessible(page: Page) -> None:
    """Every control of the current view has a label (inputs) or a name (buttons)."""
    unlabelled = await page.evaluate("""() => [...document.querySelectorAll('input, select, textarea')]
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
        .map(e => e.outerHTML)""")
    assert unlabelled == []
    nameless = await page.evaluate("""() => [...document.querySelectorAll('button')]
        .filter(b => !(b.getAttribute('aria-label') || b.textContent).trim()).map(b => b.outerHTML)""")
    assert nameless == []


async def tab_to(page: Page, selector: str) -> None:
    """Press Tab until the element matching ``selector`` has the focus (keyboard only)."""
    for _ in range(60):
        await page.keyboard.press("Tab")
        if await page.evaluate("s => document.activeElement && document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"Tab never reached {selector}")


async def register_and_confirm(page: Page, api: Api, email: str) -> str:
    """Register through the pages and open the e-mailed link; the link."""
    await page.goto("/")
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    await assert_logged_out_header(page)
    await page.get_by_role("link", name="Create an account").click()
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(PASSWORD)
    await page.get_by_role("button", name="Create account").click()
    await expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    await expect(page.get_by_text(email)).to_be_visible()
    link = await api.mail_link(email, "/auth/confirm")
    await page.goto(link)
    await expect(page.get_by_text("Your e-mail address is confirmed")).to_be_visible()
    assert page.url.endswith("/#/confirmed")
    return link


async def assert_logged_out_header(page: Page) -> None:
    """No "Log out", no e-mail and no navigation while nobody is logged in."""
    await expect(page.get_by_role("button", name="Log out")).to_be_hidden()
    await expect(page.locator("#who")).to_be_hidden()
    await expect(page.get_by_role("navigation", name="Dashboard")).to_be_hidden()


async def log_in(page: Page, email: str, password: str = PASSWORD) -> None:
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Files")).to_be_visible()


async def test_register_confirm_login_upload_copy_key_settings_logout(api: Api, settings: Settings,
                                                                   local_dns: LocalDns, artifacts: Path) -> None:
    email = "browser-journey@example.com"
    async with browser_page(settings.public_url) as (page, problems):
        response = await page.goto("/")
        assert response is not None
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp

        link = await register_and_confirm(page, api, email)
        # The link opened a second time lands on a page that says so, not on raw JSON.
        await page.goto(link)
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        await expect(page.get_by_role("status").filter(has_text="already used")).to_contain_text(
            "already confirmed: log in below")
        assert page.url.endswith("/#/confirm-used")
        await assert_logged_out_header(page)
        await log_in(page, email)
        await expect(page.locator("#who-email")).to_have_text(email)
        await expect(page.get_by_role("button", name="Log out")).to_be_visible()

        # Upload three pictures and a text file through the file input; per-file progress.
        uploads = [{"name": f"{name}.png", "mimeType": "image/png", "buffer": picture(color, name)}
                   for name, color in (("sunset", (220, 90, 40)), ("forest", (40, 130, 70)),
                                       ("ocean", (30, 90, 190)))]
        uploads.append({"name": "notes & ideas.txt", "mimeType": "text/plain", "buffer": b"hello from a browser\n"})
        await page.get_by_label("Choose files to upload").set_input_files(uploads)
        await expect(page.locator("ul.uploads li[data-state=done]")).to_have_count(4)
        progress = page.get_by_label("Upload progress of sunset.png")
        assert await progress.get_attribute("value") == "100" or await progress.evaluate("p => p.value") == 100
        await expect(page.locator("ul.grid li.file")).to_have_count(4)
        # A private upload: its thumbnail is fetched with the session token and shown as a blob.
        await page.get_by_label("Upload as public").uncheck()
        await page.get_by_label("Choose files to upload").set_input_files(
            [{"name": "private.png", "mimeType": "image/png", "buffer": picture((120, 60, 150), "private")}])
        await expect(page.locator("ul.uploads li[data-state=done]")).to_have_count(5)
        await expect(page.locator("ul.grid li.file")).to_have_count(5)
        # Every image thumbnail really loaded (decoded pixels), through /m/<id>?width=.
        await page.wait_for_function(
            "() => { const imgs = [...document.querySelectorAll('ul.grid img.thumb')];"
            " return imgs.length === 4 && imgs.every(i => i.complete && i.naturalWidth > 0); }")
        src = await page.get_by_role("img", name="ocean.png").get_attribute("src")
        assert src is not None and src.startswith("/m/") and "?width=320" in src
        private_src = await page.get_by_role("img", name="private.png").get_attribute("src")
        assert private_src is not None and private_src.startswith("blob:")
        await expect(page.locator("li.file", has_text="private.png")).to_contain_text("Private")
        await assert_accessible(page)
        await expect(page.get_by_role("img", name="ocean.png")).to_be_visible()
        listed = body(await api.call("GET", "/files?q=ocean", token=await _token(api, email)))["files"]
        assert [f["name"] for f in listed] == ["ocean.png"]
        await page.screenshot(path=str(artifacts / "dashboard-files.png"), full_page=True)

        # Copy the public URL of one file; the clipboard holds exactly the API's URL.
        card = page.locator("li.file", has_text="ocean.png")
        await card.get_by_role("button", name="Actions for ocean.png").click()
        await page.get_by_role("menuitem", name="Copy public URL").click()
        await expect(page.get_by_role("status").first).to_contain_text("Copied the public URL of ocean.png")
        assert await clipboard(page) == listed[0]["public_url"]
        await card.get_by_role("button", name="Actions for ocean.png").click()
        await page.get_by_role("menuitem", name="Copy signed URL").click()
        signed = await _wait_clipboard(page, "signature=")
        assert signed.startswith(listed[0]["public_url"] + "?expires=")

        # Search filters the grid.
        await page.get_by_label("Search").fill("forest")
        await page.get_by_role("button", name="Search", exact=True).click()
        await expect(page.locator("ul.grid li.file")).to_have_count(1)
        await page.get_by_role("button", name="Clear filters").click()
        await expect(page.locator("ul.grid li.file")).to_have_count(5)

        # API key: created, shown once with a copy button, works, listed, revoked.
        await page.get_by_role("link", name="API keys").click()
        await expect(page.get_by_role("heading", name="API keys")).to_be_visible()
        await page.get_by_label("Key name").fill("CI uploads")
        await page.get_by_role("button", name="Create API key").click()
        key_input = page.get_by_label("New API key")
        await expect(key_input).to_be_visible()
        key = await key_input.input_value()
        await page.get_by_role("button", name="Copy API key").click()
        assert await _wait_clipboard(page, key) == key
        assert (await api.call("GET", "/files", headers={"X-Api-Key": key})).code == 200
        await expect(page.get_by_role("cell", name="CI uploads", exact=True)).to_be_visible()
        await assert_accessible(page)
        await page.screenshot(path=str(artifacts / "dashboard-api-keys.png"), full_page=True)
        await page.get_by_role("button", name="Done, hide the key").click()
        await expect(page.get_by_label("New API key")).to_have_count(0)
        await page.get_by_role("button", name="Revoke API key CI uploads").click()
        await page.get_by_role("dialog").get_by_role("button", name="Revoke").click()
        await expect(page.get_by_role("cell", name="CI uploads", exact=True)).to_have_count(0)
        assert (await api.call("GET", "/files", headers={"X-Api-Key": key})).code == 401

        # Settings: upload cap and custom domain with its status.
        await page.get_by_role("link", name="Settings").click()
        await page.get_by_label("Maximum upload size (MB)").fill("1")
        await page.get_by_role("button", name="Save upload limit").click()
        await expect(page.get_by_text("Uploads larger than 1 MB are refused.")).to_be_visible()
        await page.get_by_role("textbox", name="Custom domain").fill("media.example.com")
        await page.get_by_role("button", name="Save custom domain").click()
        await expect(page.locator("dl.facts")).to_contain_text("pending")
        # The owner proves control with the TXT record the page shows, then checks again.
        await expect(page.locator("dl.facts")).to_contain_text("_mediasrv-challenge.media.example.com")
        pending = body(await api.call("GET", "/settings", token=await _token(api, email)))["custom_domain"]
        await expect(page.locator("dl.facts")).to_contain_text(pending["verification_record"]["value"])
        size = page.viewport_size
        await page.set_viewport_size({"width": 360, "height": 740})  # a phone: the long record wraps
        assert await page.evaluate(OVERFLOW) == 0
        await page.set_viewport_size(size)
        local_dns.txt["_mediasrv-challenge.media.example.com"] = [pending["verification_record"]["value"]]
        await page.get_by_role("button", name="Check domain status").click()
        await expect(page.locator("dl.facts dd.ok").first).to_have_text("active")
        await assert_accessible(page)
        s = body(await api.call("GET", "/settings", token=await _token(api, email)))
        assert s["max_upload_size_bytes"] == 1024 * 1024
        assert s["custom_domain"]["hostname"] == "media.example.com"

        # Usage chart and activity log.
        await page.get_by_role("link", name="Usage").click()
        await expect(page.locator("svg.chart rect.bar")).to_have_count(14)
        await expect(page.locator(".stat", has_text="Files")).to_contain_text("5")
        await assert_accessible(page)
        await page.get_by_role("link", name="Activity").click()
        await expect(page.get_by_role("cell", name="/files").first).to_be_visible()

        # Delete one file, then bulk-delete the rest.
        await page.get_by_role("link", name="Files").click()
        await page.get_by_role("button", name="Actions for sunset.png").click()
        await page.get_by_role("menuitem", name="Delete").click()
        await page.get_by_role("dialog").get_by_role("button", name="Delete").click()
        await expect(page.locator("ul.grid li.file")).to_have_count(4)
        await page.get_by_label("Select all on this page").check()
        await page.get_by_role("button", name="Delete selected (4)").click()
        await page.get_by_role("dialog").get_by_role("button", name="Delete").click()
        await expect(page.get_by_text("No files yet")).to_be_visible()

        # Log out: the refresh token is gone from the tab and dead on the server.
        refresh_token = await page.evaluate("() => sessionStorage.getItem('mediasrv.refresh_token')")
        assert refresh_token
        await page.get_by_role("button", name="Log out").click()
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        await expect(page.locator("#status")).to_have_text("You are logged out.")
        await assert_logged_out_header(page)
        assert await page.evaluate("() => sessionStorage.length") == 0
        r = await api.call("POST", "/auth/refresh", json={"refresh_token": refresh_token})
        assert r.code == 401
        await page.goto("/#/files")
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        assert problems == []


async def test_password_reset_from_the_emailed_link(api: Api, settings: Settings) -> None:
    email = "browser-reset@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await page.get_by_role("link", name="Forgot your password?").click()
        await page.get_by_label("Email").fill(email)
        await page.get_by_role("button", name="Send reset link").click()
        await expect(page.get_by_text("If an account exists")).to_be_visible()
        link = await api.mail_link(email, "/auth/reset-password", after=1)

        await page.goto(link)  # today's e-mail link: GET shows the form
        await expect(page.get_by_role("heading", name="Choose a new password")).to_be_visible()
        assert "token=" not in page.url  # dropped from the address bar and history
        await page.get_by_label("New password", exact=True).fill("new-pass-123")
        await page.get_by_label("Repeat new password").fill("new-pass-123")
        await page.get_by_role("button", name="Set new password").click()
        await expect(page.get_by_text("Your password has been changed")).to_be_visible()
        await page.get_by_role("link", name="Log in").click()
        await log_in(page, email, "new-pass-123")

        await page.goto(link)  # the link works once
        await page.get_by_label("New password", exact=True).fill("other-pass-456")
        await page.get_by_label("Repeat new password").fill("other-pass-456")
        await page.get_by_role("button", name="Set new password").click()
        await expect(page.get_by_role("alert")).to_contain_text("invalid, used or expired")
        assert problems == [m for m in problems if "status of 400" in m]


async def test_keyboard_only_login_upload_and_cancelled_delete(api: Api, settings: Settings) -> None:
    email = "browser-keyboard@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        await assert_accessible(page)
        await tab_to(page, "input[type=email]")
        await page.keyboard.type(email)
        await page.keyboard.press("Tab")
        await page.keyboard.type(PASSWORD)
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("heading", name="Files")).to_be_visible()
        await tab_to(page, "#upload-input")  # the file chooser is reachable by keyboard
        token = await _token(api, email)
        r = await api.call("POST", "/files", body=picture((90, 90, 90), "kbd"),
                           headers={"Content-Type": "image/png", "x-file-name": "kbd.png"}, token=token)
        assert r.code == 201
        await page.get_by_label("Search").focus()
        await page.keyboard.press("Enter")  # submits the filter form: the grid reloads
        await expect(page.locator("ul.grid li.file")).to_have_count(1)
        await tab_to(page, "li.file button.menu-button")
        await page.keyboard.press("Enter")  # opens the card's menu on its first item
        await expect(page.get_by_role("menuitem", name="Open details")).to_be_focused()
        await page.keyboard.press("End")
        await expect(page.get_by_role("menuitem", name="Delete")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("dialog")).to_be_visible()
        await page.keyboard.press("Escape")  # cancels: nothing is deleted
        await expect(page.get_by_role("dialog")).to_be_hidden()
        await expect(page.locator("ul.grid li.file")).to_have_count(1)
        assert body(await api.call("GET", "/files", token=token))["total"] == 1
        assert problems == []


async def test_expired_access_token_is_refreshed_silently(api: Api, settings: Settings, clock: ShiftableClock) -> None:
    email = "browser-refresh@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        async with page.expect_response("**/auth/login") as login_info:
            await log_in(page, email)
        expires_at = (await (await login_info.value).json())["session"]["expires_at"]
        seen: list[tuple[str, int]] = []
        page.on("response", lambda r: seen.append((r.request.method + " " + r.url.split("?")[0]
                                                   .replace(settings.public_url, ""), r.status)))
        clock.advance(expires_at - clock() + 10)  # the access token is now past exp + leeway
        await page.get_by_role("link", name="API keys").click()
        await expect(page.get_by_role("heading", name="API keys")).to_be_visible()
        await expect(page.get_by_text("No API keys yet.")).to_be_visible()
        calls = [c for c in seen if c[0].startswith(("GET /auth/api-keys", "POST /auth/refresh"))]
        assert calls[:3] == [("GET /auth/api-keys", 401), ("POST /auth/refresh", 200), ("GET /auth/api-keys", 200)]
        assert await page.evaluate("() => sessionStorage.getItem('mediasrv.refresh_token')")
        assert problems == []


async def _token(api: Api, email: str) -> str:
    r = await api.call("POST", "/auth/login", json={"email": email, "password": PASSWORD})
    assert r.code == 200, r.body
    return body(r)["session"]["access_token"]


async def _wait_clipboard(page: Page, needle: str) -> str:
    text = ""
    for _ in range(100):
        text = await clipboard(page)
        if needle in text:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"clipboard never held {needle!r}: {text!r}")



# --- the upload queue ------------------------------------------------------------------------

def text_files(prefix: str, count: int) -> list[dict[str, object]]:
    """``count`` small text files with distinct contents, for set_input_files."""
    return [{"name": f"{prefix}-{i:02d}.txt", "mimeType": "text/plain", "buffer": f"{prefix} file {i}\n".encode()}
            for i in range(count)]


async def all_names(api: Api, token: str) -> list[str]:
    names: list[str] = []
    for page_no in range(1, 20):
        listed = body(await api.call("GET", f"/files?page={page_no}&limit=100", token=token))
        names += [f["name"] for f in listed["files"]]
        if len(listed["files"]) < 100:
            return names
    raise AssertionError("more files than expected")


QUEUE_SETTLED = """n => !document.querySelector('ul.uploads li[data-state=uploading]')
    && (document.querySelector('ul.uploads li[data-state=waiting]')
        || document.querySelectorAll('ul.uploads li[data-state=done]').length === n)"""


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "1"}], indirect=True)
async def test_queue_waits_out_429s_and_every_file_arrives_once(api: Api, settings: Settings, clock: ShiftableClock,
                                                                  artifacts: Path) -> None:
    """60 files against the interface's 30 uploads per user per minute, on injected clocks.

    The server's rate-limit clock starts one second into a window and moves a whole window at
    a time; the page's clock (Playwright's) jumps over each wait instead of waiting a minute.
    """
    email = "browser-queue@example.com"
    await api.user(email)
    clock.advance(61 - clock() % 60)  # one second into a window
    statuses: list[int] = []
    async with browser_page(settings.public_url, fake_clock=True) as (page, problems):
        page.on("response", lambda r: statuses.append(r.status)
                if r.request.method == "POST" and r.url.split("?")[0].endswith("/files") else None)
        await page.goto("/#/login")
        await log_in(page, email)
        await page.get_by_label("Choose files to upload").set_input_files(text_files("drop", 60))
        done = page.locator("ul.uploads li[data-state=done]")
        rounds = 0
        while await done.count() < 60:
            # A round is up to 30 uploads through the browser: on a machine running two suites
            # that took longer than the page's default 15 s.
            await page.wait_for_function(QUEUE_SETTLED, arg=60, polling=100, timeout=4 * TIMEOUT_MS)
            if await done.count() == 60:
                break
            rounds += 1
            assert rounds <= 3, "the queue should need two windows, three at most"
            waiting = page.locator("ul.uploads li[data-state=waiting]").first
            note = waiting.locator(".upload-note")
            match = re.fullmatch(r"waiting (\d+) s: rate limit", await note.inner_text())
            assert match, await note.inner_text()
            # Each finished file is already in the grid (its first page), not after the batch.
            await expect(page.locator("ul.grid li.file")).to_have_count(min(48, await done.count()))
            if rounds == 1:
                await expect(page.locator(".upload-pause")).to_contain_text("resuming by itself in")
                # The countdown follows the page's clock.
                seconds = int(match.group(1))
                assert 20 <= seconds <= 60, seconds
                await page.clock.fast_forward(5_000)
                await expect(note).to_have_text(re.compile(r"waiting (\d+) s: rate limit"))
                assert int(re.findall(r"\d+", await note.inner_text())[0]) <= seconds - 5
                await waiting.scroll_into_view_if_needed()
                await page.screenshot(path=str(artifacts / "dashboard-queue-waiting.png"))
            clock.advance(60)  # the server's next window...
            await page.clock.fast_forward(61_000)  # ...and the page's wait is over: it resumes by itself
        await expect(page.locator(".upload-summary")).to_have_text("60 of 60 uploaded")
        assert rounds >= 1 and 429 in statuses
        assert statuses.count(201) == 60
        names = await all_names(api, await _token(api, email))
        assert sorted(names) == [f"drop-{i:02d}.txt" for i in range(60)]  # all arrived, none twice
        await expect(page.locator("ul.grid li.file")).to_have_count(48)
        assert problems == []


RECORD_FLAKY_NOTES = """() => {
    window.flakyNotes = [];
    new MutationObserver(() => {
        for (const row of document.querySelectorAll('ul.uploads li')) {
            const note = row.querySelector('.upload-note');
            if (!row.textContent.includes('flaky.txt') || !note) continue;
            if (window.flakyNotes[window.flakyNotes.length - 1] !== note.textContent) {
                window.flakyNotes.push(note.textContent);
            }
        }
    }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
"""Every text the flaky.txt row's note shows, in order, as the page changes it."""


async def test_queue_retries_network_errors_and_lets_a_person_cancel_retry_remove(
        api: Api, settings: Settings) -> None:
    email = "browser-queue-rows@example.com"
    await api.user(email)
    tries: dict[str, int] = {}

    async def flaky_network(route: Route) -> None:
        name = route.request.headers.get("x-file-name", "")
        tries[name] = tries.get(name, 0) + 1
        if name == "flaky.txt" and tries[name] <= 2:
            await route.abort("connectionreset")  # the connection drops before the server sees it
        else:
            await route.continue_()

    async def tried(times: int) -> None:
        for _ in range(TIMEOUT_MS // 50):
            if tries.get("flaky.txt", 0) >= times:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"flaky.txt was tried {tries.get('flaky.txt', 0)} times, not {times}")

    # Its own browser: the 3.6 MB file below is handed over slowly to a shared one over CDP
    # (set_input_files timed out at 15 s with two suites running at once).
    async with browser_page(settings.public_url, fake_clock=True, own_browser=True) as (page, problems):
        await page.route(re.compile(r"/files\?isPublic="), flaky_network)
        await page.goto("/#/login")
        await log_in(page, email)
        await page.evaluate(RECORD_FLAKY_NOTES)
        await page.get_by_label("Choose files to upload").set_input_files([
            {"name": "flaky.txt", "mimeType": "text/plain", "buffer": b"flaky\n"},
            {"name": "tool.exe", "mimeType": "application/x-msdownload", "buffer": b"MZ\x90\x00"}])
        rows = page.locator("ul.uploads li")
        flaky, tool, big = (rows.filter(has_text=name) for name in ("flaky.txt", "tool.exe", "big.txt"))

        # A refused type fails at once with the server's reason; Remove takes the row away.
        await expect(tool).to_have_attribute("data-state", "failed")
        # ...said for a person, with the list of what is accepted, on the same columns as the others.
        await expect(tool.locator(".upload-note")).to_contain_text(
            "This file's type (application/x-msdownload) is not accepted; allowed types are images (JPEG, PNG")
        await expect(tool.locator(".upload-note")).to_contain_text("documents (PDF, DOCX, XLSX, PPTX, ODT, …)")
        assert await tool.locator(".upload-note").evaluate("n => n.getBoundingClientRect().left") == \
            await flaky.locator(".upload-note").evaluate("n => n.getBoundingClientRect().left")
        await expect(tool.get_by_role("button", name="Retry upload of tool.exe")).to_be_visible()
        await tool.get_by_role("button", name="Remove tool.exe from the uploads").click()
        await expect(tool).to_have_count(0)

        # Network errors: waits with backoff (1 s, then 2 s), then goes through by itself. The
        # page's clock also runs in real time, so on a loaded machine a wait can end before a
        # check reads it: each try is awaited, and what the row said is read from the record.
        await tried(1)
        await page.clock.fast_forward(2_000)
        await tried(2)
        await page.clock.fast_forward(3_000)
        await expect(flaky).to_have_attribute("data-state", "done")
        assert tries["flaky.txt"] == 3
        notes = await page.evaluate("() => window.flakyNotes")
        shown = [n for n in notes if n.startswith(("Uploading", "waiting", "Done"))]
        runs = [n for i, n in enumerate(shown) if i == 0 or n[0] != shown[i - 1][0]]  # each change of state
        assert [n[0] for n in runs] == list("UwUwUD"), notes
        first, second = (int(re.fullmatch(r"waiting (\d+) s: network error", n)[1]) for n in runs if n[0] == "w")
        assert first in (1, 2) and second in (2, 3), notes  # 1 s, then 2 s, each +-20%
        await page.unroute(re.compile(r"/files\?isPublic="))

        # A slow upload (the browser's upload throttled to 256 KiB/s) shows its size, speed and
        # time left; the person cancels it while it runs, then retries it at full speed.
        cdp = await page.context.new_cdp_session(page)
        await cdp.send("Network.enable")
        await cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                            "downloadThroughput": -1, "uploadThroughput": 256 * 1024})
        await page.get_by_label("Choose files to upload").set_input_files(
            [{"name": "big.txt", "mimeType": "text/plain", "buffer": b"big text\n" * 400_000}])
        note = re.compile(r"Uploading · [\d.]+ KB/s · \d+ (s|min).* left")
        await expect(big.locator(".upload-note")).to_have_text(note)
        await expect(big.locator(".upload-size")).to_have_text(re.compile(r"[\d.]+ (B|KB|MB) of 3.4 MB"))
        await big.get_by_role("button", name="Cancel upload of big.txt").click()
        await expect(big).to_have_attribute("data-state", "cancelled")
        await cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                            "downloadThroughput": -1, "uploadThroughput": -1})
        await big.get_by_role("button", name="Retry upload of big.txt").click()
        await expect(big).to_have_attribute("data-state", "done")
        await expect(page.locator(".upload-summary")).to_have_text("2 of 2 uploaded")
        await expect(page.locator("ul.grid li.file")).to_have_count(2)
        assert sorted(await all_names(api, await _token(api, email))) == ["big.txt", "flaky.txt"]
        # Logged by the browser: the dropped connections, the refused type and the cancelled upload.
        assert [p for p in problems if "ERR_" not in p and "status of 400" not in p] == []


async def test_a_large_file_goes_up_resumably_and_a_page_reload_resumes_it(api: Api, settings: Settings,
                                                                           tmp_path: Path) -> None:
    """Above 8 MiB the dashboard uploads over tus (tus-js-client, vendored): 8 MiB chunks. The
    third chunk is held on its way and the page reloaded; the same file given again goes on
    from the offset the server acknowledged (no new upload, no chunk sent twice) and arrives
    byte-exact, once."""
    email = "browser-resumable@example.com"
    await api.user(email)
    big = tmp_path / "holiday film.zip"
    data = b"PK\x03\x04" + os.urandom(20 * 1024 * 1024)
    big.write_bytes(data)
    sent: list[tuple[str, str, str | None]] = []
    held = asyncio.Event()

    holding = [True]

    async def hold_the_third_chunk(route: Route) -> None:
        if holding[0] and route.request.method == "PATCH" and sum(m == "PATCH" for m, _, _ in sent) >= 3:
            held.set()  # never answered: the page is reloaded while it hangs
            return
        await route.continue_()

    async with browser_page(settings.public_url, own_browser=True) as (page, problems):
        page.on("request", lambda r: sent.append((r.method, r.url, r.headers.get("upload-offset")))
                if "/uploads" in r.url else None)
        await page.route(re.compile(r"/uploads"), hold_the_third_chunk)
        await page.goto("/#/login")
        await log_in(page, email)
        await page.get_by_label("Choose files to upload").set_input_files([str(big)])
        await asyncio.wait_for(held.wait(), 90)  # 16 MiB through the browser, on a loaded machine too
        upload_url = next(url for method, url, _ in sent if method == "PATCH")
        token = await _token(api, email)
        r = await api.call("HEAD", upload_url.replace(settings.public_url, ""), token=token)
        assert r.headers["Upload-Offset"] == str(16 * 1024 * 1024)

        before = len(sent)
        await page.reload()  # the held chunk dies with the page
        holding[0] = False
        await expect(page.get_by_role("heading", name="Files")).to_be_visible()  # still logged in
        assert (await api.call("HEAD", upload_url.replace(settings.public_url, ""), token=token)).headers[
            "Upload-Offset"] == str(16 * 1024 * 1024)
        await page.get_by_label("Choose files to upload").set_input_files([str(big)])
        row = page.locator("ul.uploads li").filter(has_text="holiday film.zip")
        await expect(row).to_have_attribute("data-state", "done", timeout=60_000)
        after = sent[before:]
        assert [m for m, _, _ in after if m == "POST"] == []  # the same upload, resumed
        assert [(m, offset) for m, _, offset in after if m in ("HEAD", "PATCH")] == [
            ("HEAD", None), ("PATCH", str(16 * 1024 * 1024))]
        file_id = upload_url.rsplit("/", 1)[1]
        r = await api.call("GET", f"/d/{file_id}")
        assert r.code == 200 and r.body == data
        assert await all_names(api, token) == ["holiday film.zip"]
        assert [p for p in problems if "ERR_" not in p] == []


# --- the file view ---------------------------------------------------------------------------

def pdf_document() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (300, 200), (200, 40, 40)).save(out, "PDF")
    return out.getvalue()


async def upload(api: Api, token: str, name: str, content_type: str, data: bytes, public: bool = True) -> dict:
    r = await api.call("POST", f"/files?isPublic={'true' if public else 'false'}", body=data, token=token,
                       headers={"Content-Type": content_type, "x-file-name": name})
    assert r.code == 201, r.body
    return body(r)["file"]


async def test_file_view_previews_an_image_and_a_pdf_with_links_and_delete(api: Api, settings: Settings,
                                                                            artifacts: Path) -> None:
    email = "browser-preview@example.com"
    await api.user(email)
    token = await _token(api, email)
    photo = await upload(api, token, "harbour.png", "image/png", picture((30, 120, 160), "harbour"))
    pdf = await upload(api, token, "report.pdf", "application/pdf", pdf_document(), public=False)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)

        # The file's name opens the file view: the image through /m/<id>?width=.
        await page.get_by_role("link", name="harbour.png", exact=True).click()
        await expect(page.get_by_role("heading", name="harbour.png")).to_be_visible()
        assert page.url.endswith(f"#/file/{photo['file_id']}")
        preview = page.get_by_role("img", name="Preview of harbour.png")
        await expect(preview).to_be_visible()
        src = await preview.get_attribute("src")
        assert src is not None and re.fullmatch(rf"/m/{photo['file_id']}\?width=\d+", src), src
        assert 320 <= int(src.rsplit("=", 1)[1]) <= 2048
        assert await preview.evaluate("i => i.complete && i.naturalWidth") == 640  # never enlarged
        facts = page.locator("dl.facts")
        for text in ("image/png", photo["file_id"], "Public"):
            await expect(facts).to_contain_text(text)

        await page.get_by_role("button", name="Copy public URL").click()
        assert await _wait_clipboard(page, "/m/") == photo["public_url"]
        await page.get_by_role("button", name="Copy download URL").click()
        assert await _wait_clipboard(page, "/d/") == photo["public_download_url"]
        await page.get_by_role("button", name="Copy signed URL", exact=True).click()
        signed = await _wait_clipboard(page, "signature=")
        assert signed.startswith(photo["public_url"] + "?expires=")
        await page.get_by_role("button", name="Copy as Markdown").click()
        assert await _wait_clipboard(page, "![") == f"![harbour.png]({photo['public_url']})"

        # The resized-link helper: its link answers an image of that size and format.
        await page.get_by_label("Width (px)").fill("200")
        await page.get_by_label("Format").select_option("webp")
        resized = page.get_by_label("Resized link")
        await expect(resized).to_have_value(photo["public_url"] + "?width=200&format=webp")
        await page.get_by_label("Width (px)").fill("0")
        await expect(page.get_by_role("alert")).to_contain_text("width must be a whole number")
        await expect(page.get_by_role("button", name="Copy resized link")).to_be_disabled()
        await page.get_by_label("Width (px)").fill("200")
        await page.get_by_role("button", name="Copy resized link").click()
        link = await _wait_clipboard(page, "format=webp")
        r = await api.call("GET", link.replace(api.base, ""))
        assert r.code == 200 and r.headers["Content-Type"] == "image/webp"
        assert Image.open(io.BytesIO(r.body)).size == (200, 150)

        # Fill and crop, the browser's best format and a quality: the link the API documents.
        await page.get_by_label("Height (px)").fill("200")
        await page.get_by_label("Fit", exact=True).select_option("cover")
        await page.get_by_label("Format").select_option("auto")
        await page.get_by_label("Quality (1-100)").fill("101")
        await expect(page.get_by_role("alert")).to_contain_text("quality must be a whole number from 1 to 100")
        await page.get_by_label("Quality (1-100)").fill("60")
        await expect(resized).to_have_value(
            photo["public_url"] + "?width=200&height=200&fit=cover&format=auto&quality=60")
        await page.get_by_role("button", name="Copy resized link").click()
        link = await _wait_clipboard(page, "fit=cover")
        r = await api.call("GET", link.replace(api.base, ""), headers={"Accept": "image/webp,*/*"})
        assert r.code == 200 and r.headers["Content-Type"] == "image/webp" and r.headers["Vary"] == "Accept"
        assert Image.open(io.BytesIO(r.body)).size == (200, 200)
        await page.get_by_label("Height (px)").fill("")
        await expect(page.get_by_role("alert")).to_contain_text("needs both a width and a height")
        await expect(page.get_by_role("button", name="Copy resized link")).to_be_disabled()
        await page.get_by_label("Fit", exact=True).select_option("contain")
        await expect(resized).to_have_value(photo["public_url"] + "?width=200&format=auto&quality=60")
        await assert_accessible(page)
        await page.screenshot(path=str(artifacts / "dashboard-file-view-image.png"), full_page=True)

        # The status line belongs to the view that wrote it.
        await expect(page.locator("#status")).to_contain_text("Copied the resized link")
        await page.get_by_role("link", name="API keys").click()
        await expect(page.get_by_role("heading", name="API keys")).to_be_visible()
        await expect(page.locator("#status")).to_have_text("")

        # A private PDF: shown in a frame from a signed /m URL (the session token stays out of URLs).
        async with page.expect_response(lambda r: f"/m/{pdf['file_id']}?" in r.url) as pdf_answer:
            await page.goto(f"/#/file/{pdf['file_id']}")
        answer = await pdf_answer.value
        assert answer.status == 200 and answer.headers["content-type"] == "application/pdf"
        frame = page.locator("iframe.preview-frame")
        await expect(frame).to_have_attribute("title", "Preview of report.pdf")
        src = await frame.get_attribute("src")
        assert src is not None and src.startswith(f"/m/{pdf['file_id']}?expires=") and "signature=" in src
        await expect(page.locator("dl.facts")).to_contain_text("Private")
        await expect(page.get_by_role("button", name="Copy public URL")).to_have_count(0)
        await page.get_by_role("button", name="Copy as HTML").click()  # a link, signed for the chosen time
        html = await _wait_clipboard(page, "<a href=")
        signed_link = rf'{re.escape(pdf["public_url"])}\?expires=\d+&amp;signature=[^"]+'
        assert re.fullmatch(rf'<a href="{signed_link}">report.pdf</a>', html), html
        download = page.get_by_role("link", name="Download report.pdf")
        assert "/d/" in (await download.get_attribute("href") or "")

        # Delete from the file view: back to Files, which says so.
        await page.get_by_role("button", name="Delete this file").click()
        await page.get_by_role("dialog").get_by_role("button", name="Delete").click()
        await expect(page.get_by_role("heading", name="Files")).to_be_visible()
        await expect(page.locator("#status")).to_have_text("Deleted report.pdf.")
        await expect(page.locator("ul.grid li.file")).to_have_count(1)
        assert (await api.call("GET", f"/files/{pdf['file_id']}", token=token)).code == 404
        assert problems == []


async def test_a_file_is_renamed_and_made_private_or_public_from_its_page_and_the_gallery(
        api: Api, settings: Settings, artifacts: Path) -> None:
    """PATCH /files/{id} with name or is_public from the dashboard: the file view's "Name and
    visibility" card, then the gallery's menu (a Rename dialog, Make private / Make public) on a
    card and in the lightbox. The page follows each answer without a reload; a name the server
    refuses shows its message; nothing needs a mouse or overflows a 360 px screen."""
    email = "browser-rename@example.com"
    await api.user(email)
    token = await _token(api, email)
    photo = await upload(api, token, "IMG_0001.png", "image/png", picture((200, 120, 40), "rename"))
    fid = photo["file_id"]
    bad_name = "invoice\u202egnp.exe"  # reads as "invoiceexe.png": refused (INVALID_FILE_NAME)
    refusal = await api.call("PATCH", f"/files/{fid}", json={"name": bad_name}, token=token)
    assert refusal.code == 400 and body(refusal)["code"] == "INVALID_FILE_NAME"
    server_says = body(refusal)["error"]

    async def stored() -> dict:
        return body(await api.call("GET", f"/files/{fid}", token=token))

    async def anonymous_status() -> int:
        return (await api.call("GET", f"/m/{fid}")).code

    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await page.get_by_role("link", name="IMG_0001.png", exact=True).click()
        await expect(page.get_by_role("heading", name="IMG_0001.png")).to_be_visible()
        await page.evaluate("() => { window.notReloaded = true; }")
        manage = page.get_by_role("region", name="Name and visibility")
        name_input = manage.get_by_label("File name")
        save = manage.get_by_role("button", name="Save name")
        await expect(name_input).to_have_value("IMG_0001.png")
        await assert_accessible(page)

        # Rename: the API has the new name (the spaces around it dropped); the page shows it.
        await name_input.fill("  harbour at dawn.png ")
        await save.click()
        await expect(page.get_by_role("heading", name="harbour at dawn.png")).to_be_visible()
        await expect(page.locator("#status")).to_have_text("Renamed IMG_0001.png to harbour at dawn.png.")
        assert (await stored())["name"] == "harbour at dawn.png"
        await expect(name_input).to_have_value("harbour at dawn.png")
        await expect(page.locator("dl.facts")).to_contain_text("harbour at dawn.png")
        await expect(page.get_by_role("link", name="Download harbour at dawn.png")).to_have_attribute(
            "download", "harbour at dawn.png")
        await expect(page.get_by_role("img", name="Preview of harbour at dawn.png")).to_be_visible()
        assert await page.title() == "harbour at dawn.png · mediasrv"

        # A name the server refuses: its message under the field, the field marked and focused.
        await name_input.fill(bad_name)
        await save.click()
        await expect(manage.get_by_role("alert")).to_have_text(server_says)
        await expect(name_input).to_have_attribute("aria-invalid", "true")
        await expect(name_input).to_be_focused()
        assert (await stored())["name"] == "harbour at dawn.png"
        await expect(page.get_by_role("heading", name="harbour at dawn.png")).to_be_visible()
        # Emptied: no name (the API takes null), the file shown by its id; the error went on typing.
        await name_input.fill("")
        await expect(manage.get_by_role("alert")).to_be_hidden()
        await save.click()
        await expect(page.locator("#status")).to_have_text(
            f"Removed the name of harbour at dawn.png: it shows as {fid}.")
        await expect(page.get_by_role("heading", name=fid)).to_be_visible()
        await expect(page.locator("dl.facts")).to_contain_text("(no name)")
        assert (await stored())["name"] is None
        # Named again, sent with Enter.
        await name_input.fill("harbour.png")
        await name_input.press("Enter")
        await expect(page.get_by_role("heading", name="harbour.png")).to_be_visible()
        assert (await stored())["name"] == "harbour.png"
        await expect(name_input).not_to_have_attribute("aria-invalid", "true")

        # Private: the public links go, a badge says it, the preview and the variant link are signed.
        visibility = manage.get_by_role("group", name="Visibility")
        await expect(visibility).to_contain_text("Public: anyone with its link")
        await expect(page.get_by_role("button", name="Copy public URL")).to_be_visible()
        await expect(page.locator("p.file-badge")).to_be_hidden()
        await visibility.get_by_role("button", name="Make private").click()
        await expect(visibility.get_by_role("button", name="Make public")).to_be_focused()
        await expect(page.locator("#status")).to_have_text(
            "harbour.png is private: its public link no longer opens it; signed links still do.")
        assert (await stored())["is_public"] is False
        assert await anonymous_status() == 404
        await expect(page.locator("p.file-badge")).to_have_text("Private")
        await expect(page.locator("dl.facts")).to_contain_text("Private: you, or a signed link")
        await expect(page.locator("dl.facts")).not_to_contain_text("Public URL")
        await expect(page.get_by_role("button", name="Copy public URL")).to_have_count(0)
        preview = page.get_by_role("img", name="Preview of harbour.png")
        await expect(preview).to_have_attribute("src", re.compile(rf"^/m/{fid}\?expires=\d+&signature=.+&width=\d+$"))
        await page.wait_for_function("() => { const i = document.querySelector('img.preview-image');"
                                     " return i && i.src.includes('signature=') && i.complete && i.naturalWidth > 0; }")
        await expect(page.get_by_role("link", name="Download harbour.png")).to_have_attribute(
            "href", re.compile(r"/d/.+signature="))
        await expect(page.get_by_label("Resized link")).to_have_value(re.compile(r"\?expires=\d+&signature="))
        await page.get_by_role("button", name="Copy as Markdown").click()
        assert "signature=" in await _wait_clipboard(page, "![harbour.png](")
        await page.screenshot(path=str(artifacts / "dashboard-file-private.png"), full_page=True)

        # Public again, by keyboard: all back as it was, the focus still on the button.
        await visibility.get_by_role("button", name="Make public").press("Enter")
        await expect(visibility.get_by_role("button", name="Make private")).to_be_focused()
        await expect(page.locator("#status")).to_have_text("harbour.png is public: anyone with its link can open it.")
        assert (await stored())["is_public"] is True
        assert await anonymous_status() == 200
        await expect(page.locator("p.file-badge")).to_be_hidden()
        await expect(page.get_by_role("button", name="Copy public URL")).to_be_visible()
        await expect(preview).to_have_attribute("src", re.compile(rf"^/m/{fid}\?width=\d+$"))
        await expect(page.get_by_label("Resized link")).to_have_value(photo["public_url"])
        await page.get_by_role("button", name="Copy public URL").click()
        assert await _wait_clipboard(page, "/m/") == photo["public_url"]
        assert await page.evaluate("() => window.notReloaded") is True
        await assert_accessible(page)
        await page.set_viewport_size({"width": 360, "height": 740})
        assert await page.evaluate(OVERFLOW) == 0
        assert await name_input.evaluate("i => i.getBoundingClientRect().right") <= 360
        await page.screenshot(path=str(artifacts / "dashboard-file-rename-mobile.png"), full_page=True)
        await page.set_viewport_size({"width": 1280, "height": 860})

        # The gallery shows the new name; its menu renames in a dialog, by keyboard.
        await page.get_by_role("link", name="← All files").click()
        await expect(page.locator("ul.grid a.file-name")).to_have_text(["harbour.png"])
        menu_button = page.get_by_role("button", name="Actions for harbour.png")
        await menu_button.focus()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("menuitem", name="Open details")).to_be_focused()
        for _ in range(20):
            if await page.evaluate("() => document.activeElement.textContent") == "Rename…":
                break
            await page.keyboard.press("ArrowDown")
        await page.keyboard.press("Enter")
        dialog = page.get_by_role("dialog", name="Rename harbour.png")
        await expect(dialog).to_be_visible()
        field = dialog.get_by_label("File name")
        await expect(field).to_be_focused()
        await expect(field).to_have_value("harbour.png")
        assert await field.evaluate("i => [i.selectionStart, i.selectionEnd]") == [0, len("harbour")]
        await assert_accessible(page)
        await page.set_viewport_size({"width": 360, "height": 740})
        box = await dialog.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 360, box
        assert await page.evaluate(OVERFLOW) == 0
        await page.screenshot(path=str(artifacts / "dashboard-rename-dialog-mobile.png"))
        await page.set_viewport_size({"width": 1280, "height": 860})
        await field.fill(bad_name)
        await page.keyboard.press("Enter")
        await expect(dialog.get_by_role("alert")).to_have_text(server_says)  # stays open, to correct
        await expect(field).to_be_focused()
        assert (await stored())["name"] == "harbour.png"
        await page.keyboard.press("Escape")  # cancels: nothing changes
        await expect(dialog).to_have_count(0)
        await expect(page.locator("ul.grid a.file-name")).to_have_text(["harbour.png"])
        await expect(menu_button).to_be_focused()
        await page.keyboard.press("Enter")
        await page.get_by_role("menuitem", name="Rename…").click()
        await page.get_by_role("dialog", name="Rename harbour.png").get_by_label("File name").fill("quay.png")
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("dialog")).to_have_count(0)
        await expect(page.locator("ul.grid a.file-name")).to_have_text(["quay.png"])
        await expect(page.locator("#status")).to_have_text("Renamed harbour.png to quay.png.")
        assert (await stored())["name"] == "quay.png"
        quay_menu = page.get_by_role("button", name="Actions for quay.png")
        await expect(quay_menu).to_be_focused()  # on the card made anew

        # Make private, then public, from the card's menu: the card's badge and thumbnail follow.
        card = page.locator("li.file", has_text="quay.png")
        await quay_menu.click()
        await page.get_by_role("menuitem", name="Make private").click()
        await expect(card.locator(".lock")).to_have_text("Private")
        assert (await stored())["is_public"] is False
        assert await anonymous_status() == 404
        await expect(card.get_by_role("img", name="quay.png")).to_have_attribute("src", re.compile(r"^blob:"))
        await expect(quay_menu).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(page.get_by_role("menuitem", name="Make private")).to_have_count(0)
        await page.get_by_role("menuitem", name="Make public").click()
        await expect(card.locator(".lock")).to_have_count(0)
        await expect(page.locator("#status")).to_have_text("quay.png is public: anyone with its link can open it.")
        assert (await stored())["is_public"] is True
        assert await anonymous_status() == 200

        # In the lightbox: renamed over it (the dialog on top), its bar and the grid follow.
        await card.get_by_role("link", name="Preview quay.png").click()
        lightbox = page.locator("dialog.lightbox")
        await expect(lightbox.locator(".lightbox-title")).to_have_text("quay.png")
        await lightbox.get_by_role("button", name="Actions for quay.png").click()
        await page.get_by_role("menuitem", name="Rename…").click()
        await page.get_by_role("dialog", name="Rename quay.png").get_by_label("File name").fill("pier.png")
        await page.keyboard.press("Enter")
        await expect(lightbox.locator(".lightbox-title")).to_have_text("pier.png")
        await expect(lightbox.get_by_role("button", name="Actions for pier.png")).to_be_focused()
        await lightbox.get_by_role("button", name="Actions for pier.png").click()
        await page.get_by_role("menuitem", name="Make private").click()
        await expect(lightbox.locator(".lightbox-sub")).to_contain_text("Private")
        assert (await stored())["is_public"] is False
        await page.keyboard.press("Escape")
        await expect(lightbox).to_have_count(0)
        await expect(page.locator("ul.grid a.file-name")).to_have_text(["pier.png"])
        await expect(page.locator("li.file", has_text="pier.png").locator(".lock")).to_have_text("Private")
        assert (await stored())["name"] == "pier.png"
        # The browser logs the two refused names (400), the answers the page showed; nothing else.
        assert [p for p in problems if "status of 400" not in p] == []
        assert len(problems) == 2


async def test_sort_and_filter_by_kind(api: Api, settings: Settings) -> None:
    email = "browser-sort@example.com"
    await api.user(email)
    token = await _token(api, email)
    uploaded = [("b-photo.png", "image/png", picture((10, 10, 10), "b")),
                ("a-notes.txt", "text/plain", b"x" * 10),
                ("c-archive.zip", "application/zip", b"PK\x03\x04" + b"z" * 3000),
                ("d-paper.pdf", "application/pdf", pdf_document())]
    for name, content_type, data in uploaded:
        await upload(api, token, name, content_type, data)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        page_names = page.locator("ul.grid li.file a.file-name")
        names = ["d-paper.pdf", "c-archive.zip", "a-notes.txt", "b-photo.png"]  # newest first
        await expect(page_names).to_have_text(names)
        await page.get_by_label("Sort by").select_option("Oldest first")
        await expect(page_names).to_have_text(names[::-1])
        await page.get_by_label("Sort by").select_option("Name, A to Z")
        await expect(page_names).to_have_text(sorted(names))
        await page.get_by_label("Sort by").select_option("Largest first")
        sizes = sorted(((len(d), n) for n, _, d in uploaded), reverse=True)
        await expect(page_names).to_have_text([n for _, n in sizes])
        await page.get_by_label("Images").check()
        await expect(page_names).to_have_text(["b-photo.png"])
        await page.get_by_label("Documents").check()
        await expect(page_names).to_have_text([n for _, n in sizes if n in ("d-paper.pdf", "a-notes.txt")])
        await page.get_by_label("Archives").check()
        await expect(page_names).to_have_text(["c-archive.zip"])
        await page.get_by_label("Video").check()
        await expect(page.get_by_text("No file matches these filters.")).to_be_visible()
        await page.get_by_role("button", name="Clear filters").click()
        await expect(page_names).to_have_text(names)

        # A text file's view shows its start as text.
        await page.get_by_role("link", name="a-notes.txt", exact=True).click()
        await expect(page.get_by_label("Preview of a-notes.txt").locator("pre")).to_have_text("x" * 10)
        assert problems == []


async def test_activity_fits_a_phone_screen(api: Api, settings: Settings, artifacts: Path) -> None:
    email = "browser-mobile@example.com"
    await api.user(email)
    token = await _token(api, email)
    await upload(api, token, "a-rather-long-file-name-for-a-small-screen.png", "image/png", picture((9, 9, 9), "m"))
    async with browser_page(settings.public_url, viewport=(375, 740)) as (page, problems):
        await page.goto("/#/login")
        await assert_logged_out_header(page)
        await log_in(page, email)
        overflow = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        await page.get_by_label("Choose files to upload").set_input_files(text_files("phone", 2))
        await expect(page.locator("ul.uploads li[data-state=done]")).to_have_count(2)
        assert await page.evaluate(overflow) == 0
        await page.get_by_role("img", name="a-rather-long-file-name-for-a-small-screen.png").click()
        preview = page.get_by_role("img", name="Preview of a-rather-long-file-name-for-a-small-screen.png")
        await expect(preview).to_be_visible()  # in the lightbox
        assert await page.evaluate(overflow) == 0
        await page.keyboard.press("Escape")
        await expect(page.locator("dialog.lightbox")).to_have_count(0)
        await page.get_by_role("link", name="Activity").click()
        await expect(page.get_by_role("heading", name="Activity")).to_be_visible()
        await expect(page.locator("td code", has_text="/files").first).to_be_visible()
        assert await page.evaluate(overflow) == 0
        assert await page.locator("table.table").evaluate("t => t.getBoundingClientRect().right") <= 375
        await page.screenshot(path=str(artifacts / "dashboard-activity-mobile.png"), full_page=True)
        await page.get_by_role("link", name="API keys").click()
        await page.get_by_label("Key name").fill("phone")
        await page.get_by_role("button", name="Create API key").click()
        await expect(page.get_by_label("New API key")).to_be_visible()
        assert await page.evaluate(overflow) == 0
        assert problems == []


INVITE_ONLY = {"MEDIASRV_REGISTRATION": "invite", "MEDIASRV_ADMIN_EMAILS": "browser-admin@example.com"}


@pytest.mark.parametrize("app_env", [INVITE_ONLY], indirect=True)
async def test_an_admin_invites_from_the_dashboard_and_the_link_registers(
        api: Api, settings: Settings, stores: tuple[object, object], artifacts: Path) -> None:
    """Issue 19 item 1: on an invite-only server an admin account (MEDIASRV_ADMIN_EMAILS) makes
    codes on the Invites page; the link it copies opens registration with the code filled in.
    Other accounts see no Invites link."""
    codes, _ = await InviteService(stores[0]).create(2, 1.0)  # what `mediasrv invites create` makes
    for email, code in (("browser-admin@example.com", codes[0]), ("browser-plain@example.com", codes[1])):
        r = await api.call("POST", "/auth/register", json={"email": email, "password": PASSWORD, "invite": code})
        assert r.code == 201, r.body
        link = await api.mail_link(email, "/auth/confirm")
        assert (await api.call("GET", link.replace(api.base, ""))).code == 303
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, "browser-plain@example.com")
        await expect(page.get_by_role("link", name="API keys")).to_be_visible()
        await expect(page.get_by_role("link", name="Invites")).to_be_hidden()
        await page.get_by_role("button", name="Log out").click()
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()

        await log_in(page, "browser-admin@example.com")
        await page.get_by_role("link", name="Invites").click()
        await expect(page.get_by_role("heading", name="Invites")).to_be_visible()
        await page.get_by_label("How many").fill("2")
        await page.get_by_role("button", name="Make invites").click()
        await expect(page.get_by_role("heading", name="2 invites made")).to_be_visible()
        await assert_accessible(page)
        links = await page.locator("ul.invite-links code").all_text_contents()
        assert len(links) == 2 and all("/#/register?invite=inv_" in link for link in links)
        await page.get_by_role("button", name="Copy links").click()
        assert (await _wait_clipboard(page, links[1])).split("\n") == links
        await expect(page.locator("tbody tr")).to_have_count(4)  # two used by the test, two new
        await page.screenshot(path=str(artifacts / "dashboard-invites.png"), full_page=True)
        await page.get_by_role("button", name="Log out").click()
        # Logging out ends on the login view once its request is answered: wait for it, or
        # that late navigation can land on top of the invite link's page.
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()

        await page.goto(links[0])
        await expect(page.get_by_role("heading", name="Create an account")).to_be_visible()
        code = links[0].split("invite=", 1)[1]
        await expect(page.get_by_label("Invite code")).to_have_value(code)
        await page.get_by_label("Email").fill("browser-invited@example.com")
        await page.get_by_label("Password").fill(PASSWORD)
        await page.get_by_role("button", name="Create account").click()
        await expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
        assert problems == []


@pytest.mark.parametrize("app_env", [{"MEDIASRV_WEBHOOK_ALLOW_PRIVATE": "true"}], indirect=True)
async def test_the_webhooks_page_adds_tests_disables_inspects_and_deletes(
        api: Api, settings: Settings, runtime: Runtime, artifacts: Path) -> None:
    """Issue 28: an endpoint added on the Webhooks page (its secret shown once and copied), a test
    event sent from it (verified with that secret by standardwebhooks), its deliveries read,
    then disabled, its secret rotated, and deleted."""
    import standardwebhooks

    from tests.webhook_receiver import Receiver

    runtime.relay.start()
    email = "browser-webhooks@example.com"
    await api.user(email)
    with Receiver() as receiver:
        async with browser_page(settings.public_url) as (page, problems):
            await page.goto("/#/login")
            await log_in(page, email)
            await page.get_by_role("link", name="Webhooks").click()
            await expect(page.get_by_role("heading", name="Webhooks")).to_be_visible()
            await expect(page.get_by_text("No webhook endpoints yet.")).to_be_visible()
            await page.get_by_label("Endpoint URL").fill("ftp://example.com/")
            await page.get_by_role("button", name="Add endpoint").click()
            await expect(page.get_by_role("alert")).to_contain_text("http or https")
            await page.get_by_label("Endpoint URL").fill(receiver.url)
            await page.get_by_label("Description").fill("search index")
            await page.get_by_label("File changed").uncheck()
            await page.get_by_role("button", name="Add endpoint").click()
            await expect(page.get_by_role("textbox", name="Signing secret")).to_be_visible()
            secret = await page.get_by_role("textbox", name="Signing secret").input_value()
            await page.get_by_role("button", name="Copy secret").click()
            assert await _wait_clipboard(page, "whsec_") == secret
            row = page.get_by_role("row", name=re.compile("search index"))
            await expect(row).to_contain_text("file.created, file.deleted")
            await expect(row).to_contain_text("Enabled")
            await assert_accessible(page)
            await page.screenshot(path=str(artifacts / "dashboard-webhooks.png"), full_page=True)

            await page.get_by_role("button", name="Send a test event to search index").click()
            [got] = await receiver.arrived(1)
            event = standardwebhooks.Webhook(secret).verify(got.body, got.headers)
            assert event["type"] == "webhook.test"
            await page.get_by_role("button", name="Deliveries of search index").click()
            deliveries = page.get_by_role("heading", name=re.compile("Deliveries to search index"))
            await expect(deliveries).to_be_visible()
            for _ in range(50):  # the delivery is recorded a moment after the receiver answered
                if await page.get_by_role("cell", name="succeeded").count():
                    break
                await page.get_by_role("button", name="Refresh").click()
                await asyncio.sleep(0.1)
            await expect(page.get_by_role("cell", name="webhook.test")).to_be_visible()
            await expect(page.get_by_role("cell", name="succeeded")).to_be_visible()
            await expect(page.get_by_role("cell", name="204")).to_be_visible()

            await page.get_by_role("button", name="Disable search index").click()
            await expect(row).to_contain_text("Disabled")
            await expect(page.get_by_role("button", name="Send a test event to search index")).to_be_disabled()
            await page.get_by_role("button", name="Rotate the signing secret of search index").click()
            await page.locator("#confirm-ok").click()
            await expect(page.get_by_role("heading", name="New signing secret")).to_be_visible()
            assert await page.get_by_role("textbox", name="Signing secret").input_value() not in ("", secret)
            await page.get_by_role("button", name="Delete the webhook search index").click()
            await page.locator("#confirm-ok").click()
            await expect(page.get_by_text("No webhook endpoints yet.")).to_be_visible()
            assert problems == ["Failed to load resource: the server responded with a status of 400 (Bad Request)"]
