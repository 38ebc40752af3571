"""The dashboard in a real browser: Debian's chromium driven by Playwright over real HTTP.

The server is the usual test app (real SQLite, real files, e-mail to the SMTP sink) on the
test's event loop; Playwright's async API shares that loop, so the server answers while the
test awaits the browser. Never ``playwright install``: the browser is /usr/bin/chromium.

Screenshots of the files grid and the API-keys page are written to tests/artifacts/.
"""
from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from mediasrv.core.settings import Settings
from tests.conftest import Api, ShiftableClock, body
from tests.dnsserver import LocalDns

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("Debian's chromium is not installed (/usr/bin/chromium); .ci/run installs it",
                allow_module_level=True)

from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright, expect  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).parent / "artifacts"
TIMEOUT_MS = 15_000
PASSWORD = "s3cret-pass"


@pytest.fixture
def local_dns() -> Iterator[LocalDns]:
    server = LocalDns().start()
    yield server
    server.stop()


@pytest.fixture
def app_env(request: pytest.FixtureRequest, local_dns: LocalDns) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100", "MEDIASRV_DNS_NAMESERVERS": local_dns.nameserver,
            **getattr(request, "param", {})}


@asynccontextmanager
async def browser_page(base: str) -> AsyncIterator[tuple[Page, list[str]]]:
    """A fresh browser and page with clipboard access; yields (page, console problems)."""
    problems: list[str] = []
    async with async_playwright() as pw:
        browser: Browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 860}, base_url=base)
            await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
            page = await context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)

            def on_console(msg: ConsoleMessage) -> None:
                # Failed requests the app handles (the 401 before a refresh) log as errors too.
                if msg.type == "error" and "status of 401" not in msg.text:
                    problems.append(msg.text)

            page.on("console", on_console)
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            yield page, problems
        finally:
            await browser.close()


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


async def register_and_confirm(page: Page, api: Api, email: str) -> None:
    await page.goto("/")
    await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
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


async def log_in(page: Page, email: str, password: str = PASSWORD) -> None:
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Files")).to_be_visible()


async def test_register_confirm_login_upload_copy_key_settings_logout(api: Api, settings: Settings,
                                                                   local_dns: LocalDns) -> None:
    email = "browser-journey@example.com"
    async with browser_page(settings.public_url) as (page, problems):
        response = await page.goto("/")
        assert response is not None
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp

        await register_and_confirm(page, api, email)
        await log_in(page, email)
        await expect(page.locator("#who-email")).to_have_text(email)

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
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "dashboard-files.png"), full_page=True)

        # Copy the public URL of one file; the clipboard holds exactly the API's URL.
        card = page.locator("li.file", has_text="ocean.png")
        await card.get_by_role("button", name="Copy public URL").click()
        await expect(page.get_by_role("status").first).to_contain_text("Copied the public URL of ocean.png")
        assert await clipboard(page) == listed[0]["public_url"]
        await card.get_by_role("button", name="Copy signed URL").click()
        signed = await _wait_clipboard(page, "signature=")
        assert signed.startswith(listed[0]["public_url"] + "?expires=")

        # Search filters the grid.
        await page.get_by_label("Search").fill("forest")
        await page.get_by_role("button", name="Apply filters").click()
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
        await page.screenshot(path=str(ARTIFACTS / "dashboard-api-keys.png"), full_page=True)
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
        await page.locator("li.file", has_text="sunset.png").get_by_role("button", name="Delete").click()
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
        await tab_to(page, "li.file button.danger")
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
        clock.advance(expires_at - time.time() + 10)  # the access token is now past exp + leeway
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

