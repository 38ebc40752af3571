"""Issue 31's dashboard in Debian's chromium: the gallery and its lightbox, dark mode, tabs that
share the session, the ShareX and shell uploader configurations, the daily usage chart.

Same harness as test_dashboard_browser.py (the test app on the test's loop, Playwright's async
API on the same loop). Screenshots go to $MEDIASRV_TEST_ARTIFACTS, else the test's tmp_path.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import random
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from mediasrv.base.settings import Settings
from tests.conftest import Api, ShiftableClock, body
from tests.web import test_dashboard_browser as dashboard
from tests.web.test_dashboard_browser import (
    OVERFLOW,
    _token,
    _wait_clipboard,
    assert_accessible,
    browser_page,
    expect,
    log_in,
    pdf_document,
    picture,
    upload,
)

# The browser tests' fixtures: screenshots outside the checkout, a local DNS, a rate-limit scale.
artifacts = dashboard.artifacts
io_loop = dashboard.io_loop  # one loop and one Playwright driver for the module's tests
playwright_driver = dashboard.playwright_driver
app_env = dashboard.app_env

COLORS = [(220, 90, 40), (40, 130, 70), (30, 90, 190), (200, 40, 120), (240, 200, 40), (90, 60, 160),
          (20, 160, 170), (120, 120, 120), (250, 120, 90), (60, 60, 60), (150, 200, 90), (10, 60, 110)]

# A ThumbHash made by evanw/thumbhash's reference encoder (rgbaToThumbHash) from a 40x30 image:
# the left half orange, the right half blue.
ORANGE_BLUE_HASH = "nRgKrZZ/dXlniHh3h3iHh4+H+JiI"
COLUMNS = "g => getComputedStyle(g).gridTemplateColumns.split(' ').length"


# Slow (a browser): scheduled first (tests/conftest.py). On one worker, so the module's loop and
# Playwright driver start once per run, not once per worker that takes one of its tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser-gallery")]


def landscape(seed: int) -> bytes:
    """A 640x480 picture of a sky, a sun and hills (its colours from ``seed``), so a gallery's
    screenshot looks like one: people judge the design from it."""
    rng = random.Random(seed)
    top, bottom = COLORS[seed % len(COLORS)], COLORS[(seed * 5 + 3) % len(COLORS)]
    image = Image.new("RGB", (640, 480))
    draw = ImageDraw.Draw(image)
    for y in range(480):
        t = y / 479
        draw.line([(0, y), (639, y)], fill=tuple(int(a + (b - a) * t) for a, b in zip(top, bottom, strict=True)))
    sx, sy, r = rng.randint(120, 520), rng.randint(90, 200), rng.randint(36, 70)
    draw.ellipse((sx - r, sy - r, sx + r, sy + r), fill=(255, 240, 200))
    for layer in range(3):
        base = 260 + layer * 70
        shade = tuple(max(0, int(c * (0.55 - layer * 0.15))) for c in bottom)
        points = [(0, 480)] + [(x, base - rng.randint(0, 90 - layer * 20)) for x in range(0, 700, 80)] + [(640, 480)]
        draw.polygon(points, fill=shade)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


async def gallery_files(api: Api, token: str) -> list[dict]:
    """Twelve pictures (one private), a PDF, a text file and an archive; newest last."""
    files = [await upload(api, token, f"photo-{i:02d}.png", "image/png", landscape(i), public=i != 3)
             for i in range(len(COLORS))]
    files.append(await upload(api, token, "report.pdf", "application/pdf", pdf_document()))
    files.append(await upload(api, token, "notes.txt", "text/plain", b"Shopping list\n- bread\n"))
    files.append(await upload(api, token, "backup.zip", "application/zip", b"PK\x03\x04" + b"z" * 300))
    return files


async def all_thumbnails_loaded(page: object, count: int) -> None:
    await page.wait_for_function(  # type: ignore[attr-defined]
        "n => { const imgs = [...document.querySelectorAll('ul.grid img.thumb')];"
        " return imgs.length === n && imgs.every(i => i.complete && i.naturalWidth > 0); }", arg=count)


async def test_gallery_lightbox_keyboard_navigation_copy_as_and_screenshots(api: Api, settings: Settings,
                                                                           artifacts: Path) -> None:
    email = "gallery@example.com"
    await api.user(email)
    token = await _token(api, email)
    files = await gallery_files(api, token)
    newest_first = [f["name"] for f in reversed(files)]
    async with browser_page(settings.public_url, viewport=(1440, 1000)) as (page, problems):
        await page.emulate_media(reduced_motion="reduce")  # no fades: screenshots show the end state
        await page.goto("/#/login")
        await log_in(page, email)
        names = page.locator("ul.grid li.file a.file-name")
        await expect(names).to_have_text(newest_first)
        # Dense: more than 4 columns on a wide screen.
        columns = await page.locator("ul.grid").evaluate(COLUMNS)
        assert columns > 4, columns
        # Pictures through srcset variants of /m; one tap stop per card to preview, and a menu.
        await all_thumbnails_loaded(page, 12)
        img = page.get_by_role("img", name="photo-05.png", exact=True)
        srcset = await img.get_attribute("srcset") or ""
        fid = files[5]["file_id"]
        assert [w.split(" ")[-1] for w in srcset.split(", ")] == ["240w", "320w", "480w", "720w"], srcset
        assert f"/m/{fid}?width=240 240w" in srcset
        current = await img.evaluate("i => i.currentSrc")
        assert re.search(rf"/m/{fid}\?width=(240|320|480|720)$", current), current
        await expect(page.locator("li.file", has_text="backup.zip").locator(".type-tile")).to_contain_text("ZIP")
        await expect(page.locator("li.file", has_text="photo-03.png")).to_contain_text("Private")
        # Fewer buttons: per card, a preview link, the name, a selection box and one menu button.
        card_buttons = await page.locator("li.file").first.locator("button").count()
        assert card_buttons == 1
        await assert_accessible(page)
        await page.mouse.move(5, 5)
        await page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
        await page.evaluate("() => window.scrollTo(0, 0)")
        await page.screenshot(path=str(artifacts / "gallery-1440.png"), full_page=True)

        # The lightbox: a click on a thumbnail; arrows move between the files, wrapping round.
        await page.get_by_role("link", name="Preview photo-11.png").click()
        lightbox = page.get_by_role("dialog", name="photo-11.png")
        await expect(lightbox).to_be_visible()
        await expect(lightbox).to_contain_text(f"4 of {len(files)}")
        shown = lightbox.get_by_role("img", name="Preview of photo-11.png")
        await expect(shown).to_be_visible()
        assert await shown.evaluate("i => new Promise(r => i.complete ? r(i.naturalWidth)"
                                    " : i.addEventListener('load', () => r(i.naturalWidth)))") == 640
        # The width asked for is the screen's (in device pixels, on a step); never enlarged.
        lightbox_src = await shown.get_attribute("src") or ""
        assert re.fullmatch(rf"/m/{files[11]['file_id']}\?width=(1280|1600|2048)", lightbox_src), lightbox_src
        await expect(page.locator(".lightbox-image")).to_have_class(re.compile("loaded"))
        await page.screenshot(path=str(artifacts / "gallery-lightbox-1440.png"))
        await page.keyboard.press("ArrowRight")
        await expect(page.locator("#lightbox-title")).to_have_text("photo-10.png")
        await page.keyboard.press("ArrowLeft")
        await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("report.pdf")
        await expect(page.locator("iframe.lightbox-frame")).to_have_attribute("title", "Preview of report.pdf")
        await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("notes.txt")
        await expect(page.locator("pre.lightbox-text")).to_have_text("Shopping list\n- bread\n")
        await page.keyboard.press("ArrowLeft")  # the newest file: on to the last one
        await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("photo-00.png")
        await expect(page.locator(".lightbox-count")).to_have_text(f"{len(files)} of {len(files)}")
        await page.keyboard.press("Home")
        await expect(page.locator("#lightbox-title")).to_have_text("backup.zip")
        await expect(page.locator(".lightbox-stage")).to_contain_text("cannot show application/zip")
        await page.keyboard.press("End")
        await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("photo-01.png")
        # A private picture is shown through a signed URL, never with the session token.
        await page.get_by_role("button", name="Next file").click()
        for _ in range(3):
            await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("photo-03.png")
        private_src = await page.get_by_role("img", name="Preview of photo-03.png").get_attribute("src") or ""
        assert private_src.startswith(f"/m/{files[3]['file_id']}?expires=") and "signature=" in private_src
        await assert_accessible(page)
        # Escape closes it; the focus is back on the card of the file last shown.
        await page.keyboard.press("Escape")
        await expect(page.locator("dialog.lightbox")).to_have_count(0)
        await expect(page.get_by_role("link", name="Preview photo-03.png")).to_be_focused()

        # Copy as Markdown, HTML and BBCode: an image embeds, another file is a link.
        photo = files[0]
        for item, expected in (
                ("Copy as Markdown", f"![photo-00.png]({photo['public_url']})"),
                ("Copy as HTML", f'<img src="{photo["public_url"]}" alt="photo-00.png">'),
                ("Copy as BBCode", f"[img]{photo['public_url']}[/img]")):
            await page.get_by_role("button", name="Actions for photo-00.png").click()
            await page.get_by_role("menuitem", name=item).click()
            assert await _wait_clipboard(page, expected) == expected
        pdf = files[12]
        await page.get_by_role("button", name="Actions for report.pdf").click()
        await page.get_by_role("menuitem", name="Copy as Markdown").click()
        assert await _wait_clipboard(page, "[report.pdf]") == f"[report.pdf]({pdf['public_url']})"
        await page.get_by_role("button", name="Actions for photo-03.png").click()
        await page.get_by_role("menuitem", name="Copy as BBCode").click()
        signed = await _wait_clipboard(page, "signature=")
        assert signed.startswith(f"[img]{files[3]['public_url']}?expires=") and signed.endswith("[/img]")
        # Names are escaped for each syntax (a name is untrusted text).
        snippets = await page.evaluate("""async () => {
            const { snippet } = await import('/assets/js/copyas.js');
            const file = { name: 'a]<b>(c).png', file_id: 'x', content_type: 'image/png' };
            return ['markdown', 'html', 'bbcode'].map((f) => snippet(f, file, 'https://h/m/x?a=1&b=(2)'));
        }""")
        assert snippets == ["![a\\]\\<b\\>\\(c\\).png](https://h/m/x?a=1&b=%282%29)",
                            '<img src="https://h/m/x?a=1&amp;b=(2)" alt="a]&lt;b&gt;(c).png">',
                            "[img]https://h/m/x?a=1&b=(2)[/img]"]
        assert problems == []

    # A phone: two columns, nothing wider than the screen.
    async with browser_page(settings.public_url, viewport=(390, 844)) as (page, problems):
        await page.emulate_media(reduced_motion="reduce")
        await page.goto("/#/login")
        await log_in(page, email)
        await expect(page.locator("ul.grid li.file")).to_have_count(len(files))
        columns = await page.locator("ul.grid").evaluate(COLUMNS)
        assert columns == 2
        assert await page.evaluate(OVERFLOW) == 0
        for y in range(0, 4000, 600):  # lazy thumbnails load as they come into view
            await page.evaluate(f"() => window.scrollTo(0, {y})")
        await all_thumbnails_loaded(page, 12)
        await page.evaluate("() => window.scrollTo(0, 0)")
        await page.screenshot(path=str(artifacts / "gallery-390.png"), full_page=True)
        await page.get_by_role("link", name="Preview photo-08.png").click()
        await expect(page.get_by_role("img", name="Preview of photo-08.png")).to_be_visible()
        await page.get_by_role("button", name="Next file").click()
        await expect(page.locator("#lightbox-title")).to_have_text("photo-07.png")
        await expect(page.locator(".lightbox-image")).to_have_class(re.compile("loaded"))
        await page.screenshot(path=str(artifacts / "gallery-lightbox-390.png"))
        assert problems == []


async def test_dark_mode_follows_the_system_setting(api: Api, settings: Settings, artifacts: Path) -> None:
    email = "dark@example.com"
    await api.user(email)
    token = await _token(api, email)
    files = await gallery_files(api, token)

    def luminance(rgb: str) -> float:
        r, g, b = (int(v) for v in re.findall(r"\d+", rgb)[:3])
        return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255

    async with browser_page(settings.public_url, viewport=(1440, 1000)) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        # The heading shows before the grid's cards (GET /files, the server's /m limits) arrive.
        await expect(page.locator("ul.grid li.file")).to_have_count(len(files))
        colours = """() => ({ page: getComputedStyle(document.body).backgroundColor,
            text: getComputedStyle(document.body).color,
            card: getComputedStyle(document.querySelector('li.file')).backgroundColor })"""
        await page.emulate_media(color_scheme="light")
        light = await page.evaluate(colours)
        assert luminance(light["page"]) > 0.9 and luminance(light["text"]) < 0.2, light
        await page.emulate_media(color_scheme="dark")
        dark = await page.evaluate(colours)
        assert luminance(dark["page"]) < 0.1 and luminance(dark["card"]) < 0.15 and luminance(dark["text"]) > 0.8, dark
        await all_thumbnails_loaded(page, 12)
        await page.screenshot(path=str(artifacts / "gallery-1440-dark.png"), full_page=True)
        # Forms and dialogs follow too: the login page, and a menu.
        await page.get_by_role("button", name="Actions for photo-00.png").click()
        menu = page.get_by_role("menu", name="Actions for photo-00.png")
        assert luminance(await menu.evaluate("m => getComputedStyle(m).backgroundColor")) < 0.15
        assert problems == []


async def test_placeholder_shows_under_a_thumbnail_until_it_loads(api: Api, settings: Settings) -> None:
    """A file's ``placeholder`` (a ThumbHash, where the server sends one) is drawn on a canvas
    under its thumbnail: the reference encoder's orange-and-blue hash decodes to orange on the
    left and blue on the right."""
    email = "placeholder@example.com"
    await api.user(email)
    token = await _token(api, email)
    photo = await upload(api, token, "slow.png", "image/png", picture((30, 90, 190), "slow"))
    async with browser_page(settings.public_url) as (page, problems):
        async def with_placeholder(route: object) -> None:
            answer = await route.fetch()  # type: ignore[attr-defined]
            listing = await answer.json()
            for f in listing["files"]:
                f["placeholder"] = ORANGE_BLUE_HASH
            await route.fulfill(response=answer, json=listing)  # type: ignore[attr-defined]

        async def never(route: object) -> None:
            pass  # the thumbnail never arrives: the placeholder stays

        await page.route(re.compile(r"/files\?.*page="), with_placeholder)
        await page.route(re.compile(rf"/m/{photo['file_id']}\?width="), never)
        await page.goto("/#/login")
        await log_in(page, email)
        canvas = page.locator("li.file .thumb-placeholder")
        await expect(canvas).to_have_count(1)
        pixels = await canvas.evaluate("""c => { const x = c.getContext('2d');
            const at = (px) => [...x.getImageData(px, c.height >> 1, 1, 1).data];
            return [at(1), at(c.width - 2), c.width, c.height]; }""")
        left, right, width, height = pixels
        assert (width, height) == (32, 23)  # the hash's 4:3 shape, 32 px on the long side
        assert left[0] > 150 and left[2] < 100, left  # orange
        assert right[2] > 150 and right[0] < 100, right  # blue
        await expect(page.locator("li.file .thumb-box")).not_to_have_class(re.compile("loaded"))
        assert problems == []


async def test_a_second_tab_opens_logged_in_and_logout_reaches_every_tab(api: Api, settings: Settings,
                                                                         clock: ShiftableClock) -> None:
    email = "tabs@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (first, problems):
        await first.goto("/#/login")
        async with first.expect_response("**/auth/login") as login_info:
            await log_in(first, email)
        expires_at = (await (await login_info.value).json())["session"]["expires_at"]
        refreshes: list[int] = []
        first.context.on("response", lambda r: refreshes.append(r.status) if r.url.endswith("/auth/refresh") else None)

        # A second tab, as a bookmark opens it: logged in, no password asked.
        second = await first.context.new_page()
        await second.goto("/#/keys")
        await expect(second.get_by_role("heading", name="API keys")).to_be_visible()
        await expect(second.locator("#who-email")).to_have_text(email)
        await expect(second.get_by_text("No API keys yet.")).to_be_visible()
        assert refreshes == []  # the first tab handed over its session: no refresh was needed

        # Both tabs' access tokens expire: the tabs share one refresh (refresh tokens are single
        # use, and a retired one presented again would end every session of the account).
        clock.advance(expires_at - clock() + 10)
        await second.get_by_role("link", name="Usage").click()
        await expect(second.locator(".stat", has_text="Files")).to_contain_text("0")
        await first.get_by_role("link", name="Settings").click()
        await expect(first.get_by_text("None: public URLs use the server URL")).to_be_visible()
        assert refreshes == [200]

        # A reload keeps a tab logged in; so does a third tab after the first one closes.
        await second.reload()
        await expect(second.get_by_role("heading", name="Usage")).to_be_visible()
        await first.close()
        third = await second.context.new_page()
        await third.goto("/#/files")
        await expect(third.get_by_role("heading", name="Files")).to_be_visible()
        # The second tab leads now: it refreshes when the tokens expire again.
        clock.advance(2 * 3600)
        await third.get_by_role("link", name="Activity").click()
        await expect(third.get_by_role("heading", name="Activity")).to_be_visible()
        await expect(third.get_by_role("cell", name="/usage").first).to_be_visible()
        assert refreshes == [200, 200]

        # Log out in one tab: every tab is logged out, and the refresh token is dead.
        refresh_token = await second.evaluate("() => sessionStorage.getItem('mediasrv.refresh_token')")
        assert refresh_token and refresh_token == await third.evaluate(
            "() => sessionStorage.getItem('mediasrv.refresh_token')")
        await third.get_by_role("button", name="Log out").click()
        await expect(third.get_by_role("heading", name="Log in")).to_be_visible()
        await expect(second.get_by_role("heading", name="Log in")).to_be_visible()
        await expect(second.locator("#status")).to_have_text("You logged out in another tab.")
        assert await second.evaluate("() => sessionStorage.getItem('mediasrv.refresh_token')") is None
        assert (await api.call("POST", "/auth/refresh", json={"refresh_token": refresh_token})).code == 401
        # A new tab now starts on the log-in page.
        fourth = await second.context.new_page()
        await fourth.goto("/#/files")
        await expect(fourth.get_by_role("heading", name="Log in")).to_be_visible()
        assert problems == []


async def test_sharex_and_shell_configurations_upload(api: Api, settings: Settings, tmp_path: Path) -> None:
    """The ShareX export is a custom uploader that uploads: its request, sent as ShareX sends it
    (method, URL with its parameters, headers, the file as the body with its type), stores the
    file, and its URL template names a link that serves it. The shell script uploads too."""
    email = "sharex@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await page.get_by_role("link", name="API keys").click()
        await page.get_by_label("Uploader").select_option("sharex")
        async with page.expect_download() as sharex_download:
            await page.get_by_role("button", name="Create a key and download the configuration").click()
        download = await sharex_download.value
        assert download.suggested_filename == "mediasrv-127.0.0.1.sxcu"
        config = json.loads(Path(await download.path()).read_text())
        await expect(page.get_by_role("cell", name="ShareX", exact=True)).to_be_visible()

        # A key made by hand offers the same downloads under it.
        await page.get_by_label("Key name").fill("laptop")
        await page.get_by_role("button", name="Create API key").click()
        key = await page.get_by_label("New API key").input_value()
        async with page.expect_download() as shell_download:
            await page.get_by_role("button", name="Download Flameshot / shell script").click()
        script = tmp_path / "mediasrv-upload.sh"
        await (await shell_download.value).save_as(script)
        assert f"MEDIASRV_KEY='{key}'" in script.read_text()
        assert problems == []

    assert config["RequestMethod"] == "POST" and config["Body"] == "Binary"
    assert config["RequestURL"] == f"{settings.public_url}/files"
    shot = picture((200, 40, 120), "screenshot")
    filename = "Screenshot 2026-11-28 café.png"
    query = urllib.parse.urlencode({k: v.replace("{filename}", filename) for k, v in config["Parameters"].items()})
    headers = {**config["Headers"], "Content-Type": "image/png"}  # ShareX sends the file's type
    r = await api.call(config["RequestMethod"], config["RequestURL"].replace(settings.public_url, "") + "?" + query,
                       body=shot, headers=headers)
    assert r.code == 201, r.body
    answer = body(r)

    def resolve(template: str) -> str:
        return re.sub(r"\{json:([\w.]+)\}", lambda m: _dig(answer, m.group(1)), template)

    link = resolve(config["URL"])
    stored = answer["file"]
    assert link == stored["public_url"] and stored["name"] == filename and stored["is_public"] is True
    served = await api.call("GET", link.replace(settings.public_url, ""))
    assert served.code == 200 and served.body == shot
    thumb = await api.call("GET", resolve(config["ThumbnailURL"]).replace(settings.public_url, ""))
    assert thumb.code == 200 and Image.open(io.BytesIO(thumb.body)).size == (320, 240)
    assert resolve(config["DeletionURL"]) == f"{settings.public_url}/#/file/{stored['file_id']}"

    # The shell script (Flameshot's, given a file it skips the screenshot) uploads and prints the link.
    document = tmp_path / "notes für dich.txt"
    document.write_text("from the shell\n")
    proc = await asyncio.create_subprocess_exec("sh", str(script), str(document), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    url = out.decode().strip()
    assert url.startswith(f"{settings.public_url}/m/"), out
    served = await api.call("GET", url.replace(settings.public_url, ""))
    assert served.code == 200 and served.body == b"from the shell\n"
    listed = body(await api.call("GET", "/files?q=notes", headers={"X-Api-Key": key}))["files"]
    assert [f["name"] for f in listed] == ["notes für dich.txt"]


def _dig(data: dict, path: str) -> str:
    value: object = data
    for part in path.split("."):
        assert isinstance(value, dict)
        value = value[part]
    return str(value)


async def test_usage_chart_counts_past_100_requests_a_day(api: Api, settings: Settings) -> None:
    """The chart reads the server's daily counts: 150 requests today show as 150, not the 100
    a page of the activity log held."""
    email = "usage@example.com"
    await api.user(email)
    token = await _token(api, email)
    for _ in range(150):
        assert (await api.call("GET", "/files?limit=1", token=token)).code == 200
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await page.get_by_role("link", name="Usage").click()
        await expect(page.locator("svg.chart rect.bar")).to_have_count(14)
        today = page.locator("svg.chart rect.bar.today title")
        await expect(today).to_have_text(re.compile(r"\d+/\d+: \d+"))
        count = int((await today.text_content() or "").rsplit(": ", 1)[1])
        assert 150 <= count < 170, count  # ours, plus the page's own few requests
        await expect(page.locator("figcaption")).to_contain_text("counted by the server")
        assert problems == []


async def test_no_focus_frame_on_load_and_focus_moves_to_the_view(api: Api, settings: Settings) -> None:
    email = "focus@example.com"
    await api.user(email)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await expect(page.get_by_role("heading", name="Log in")).to_be_visible()
        assert await page.evaluate("() => document.activeElement === document.body")
        await log_in(page, email)
        await page.reload()  # a page load: nothing is focused, nothing framed
        await expect(page.get_by_role("heading", name="Files")).to_be_visible()
        assert await page.evaluate("() => document.activeElement === document.body")
        outline = "e => getComputedStyle(e).outlineStyle"
        assert await page.locator("main").evaluate(outline) == "none"
        await page.keyboard.press("Tab")
        await page.keyboard.press("Enter")  # the skip link: focus on <main>, still no frame round the page
        assert await page.evaluate("() => document.activeElement.id") == "main"
        assert await page.locator("main").evaluate(outline) == "none"
        # A view change puts the focus on its heading (for screen readers), unframed.
        await page.get_by_role("link", name="API keys").click()
        heading = page.get_by_role("heading", name="API keys")
        await expect(heading).to_be_focused()
        assert await heading.evaluate(outline) == "none"
        assert problems == []



async def test_lightbox_goes_on_into_the_next_page(api: Api, settings: Settings) -> None:
    """50 files are two pages of 48: → on the last file of the first page shows the first file
    of the second (and the grid turns with it); ← goes back."""
    email = "pages@example.com"
    await api.user(email)
    token = await _token(api, email)
    for i in range(50):
        await upload(api, token, f"note-{i:02d}.txt", "text/plain", f"note {i}\n".encode())
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await expect(page.locator("ul.grid li.file")).to_have_count(48)
        await page.get_by_role("link", name="Preview note-02.txt").click()  # the 48th, newest first
        await expect(page.locator(".lightbox-count")).to_have_text("48 of 50")
        await page.keyboard.press("ArrowRight")
        await expect(page.locator("#lightbox-title")).to_have_text("note-01.txt")
        await expect(page.locator(".lightbox-count")).to_have_text("49 of 50")
        await expect(page.locator("pre.lightbox-text")).to_have_text("note 1\n")
        await page.keyboard.press("ArrowRight")
        await page.keyboard.press("ArrowRight")  # the very last file: it stays
        await expect(page.locator("#lightbox-title")).to_have_text("note-00.txt")
        await expect(page.locator(".lightbox-count")).to_have_text("50 of 50")
        await page.keyboard.press("ArrowLeft")
        await page.keyboard.press("ArrowLeft")
        await expect(page.locator("#lightbox-title")).to_have_text("note-02.txt")
        await expect(page.locator(".lightbox-count")).to_have_text("48 of 50")
        await page.keyboard.press("Escape")
        await expect(page.locator("dialog.lightbox")).to_have_count(0)  # (the grid shows behind it too)
        await expect(page.get_by_text("Page 1 of 2 (50 total)")).to_be_visible()
        await expect(page.get_by_role("link", name="Preview note-02.txt")).to_be_focused()
        assert problems == []


STRICT_SERVERS = [
    # Only the listed widths, none of them a width the gallery, the lightbox or the file view
    # asks for by default: a request that ignored the list would be refused.
    pytest.param({"MEDIASRV_ALLOWED_WIDTHS": "200,500,1100"}, id="widths"),
    # Only transforms signed with a key the dashboard never has: the stored images, unresized.
    pytest.param({"MEDIASRV_TRANSFORM_KEY": "k" * 40}, id="signed-only"),
    # A list without a width list: a width is not among the allowed parameters.
    pytest.param({"MEDIASRV_ALLOWED_FORMATS": "webp"}, id="formats-only"),
]


@pytest.mark.parametrize("app_env", STRICT_SERVERS, indirect=True)
async def test_a_strict_server_shows_every_picture_of_the_files_page(api: Api, settings: Settings,
                                                                     app_env: dict[str, str],
                                                                     request: pytest.FixtureRequest) -> None:
    """MEDIASRV_ALLOWED_* and MEDIASRV_TRANSFORM_KEY: the gallery, the lightbox and the file view
    ask /m only for what the server makes (a listed width, else the stored image), so every
    picture shows, public or private, and the server's limits are read once for the page."""
    listed = app_env.get("MEDIASRV_ALLOWED_WIDTHS")
    widths = listed.split(",") if listed else []
    email = f"strict-gallery-{request.node.callspec.id}@example.com"  # the mail sink outlives a test
    await api.user(email)
    token = await _token(api, email)
    public = [await upload(api, token, f"photo-{i}.png", "image/png", landscape(i)) for i in range(2)]
    private = await upload(api, token, "secret.png", "image/png", landscape(7), public=False)
    async with browser_page(settings.public_url) as (page, problems):
        media: list[tuple[str, int]] = []
        agents: list[str] = []

        def seen(response: Any) -> None:
            path = urllib.parse.urlsplit(response.url)
            if path.path.startswith("/m/"):
                media.append((path.path + ("?" + path.query if path.query else ""), response.status))
            elif path.path == "/reference/for-agents":
                agents.append(response.url)

        page.on("response", seen)
        await page.goto("/#/login")
        await log_in(page, email)
        await all_thumbnails_loaded(page, 3)
        boxes = page.locator("ul.grid .thumb-box")
        await expect(boxes).to_have_count(3)
        for k in range(3):
            await expect(boxes.nth(k)).to_have_class(re.compile(r"\bloaded\b"))
        shown = page.get_by_role("img", name="photo-1.png", exact=True)
        srcset = await shown.get_attribute("srcset")
        src = await shown.get_attribute("src")
        fid = public[1]["file_id"]
        if widths:  # the list's widths up to the first as wide as the largest tile (720): all three
            assert srcset == ", ".join(f"/m/{fid}?width={w} {w}w" for w in widths), srcset
            assert src == f"/m/{fid}?width=500", src  # the smallest listed at least 320 wide
        else:  # no width is made unsigned: the stored image
            assert srcset is None, srcset
            assert src == f"/m/{fid}", src
        private_asked = [url for url, _ in media if url.startswith(f"/m/{private['file_id']}")]
        assert private_asked == [f"/m/{private['file_id']}" + ("?width=500" if widths else "")], private_asked

        # The lightbox, for a public file and for the private one (a signed URL).
        for name in ("photo-0.png", "secret.png"):
            await page.get_by_role("link", name=f"Preview {name}").click()
            image = page.get_by_role("dialog", name=name).get_by_role("img", name=f"Preview of {name}")
            await expect(page.locator(".lightbox-image")).to_have_class(re.compile(r"\bloaded\b"))
            assert await image.evaluate("i => i.naturalWidth") == 640  # never enlarged
            asked = urllib.parse.parse_qs(urllib.parse.urlsplit(await image.get_attribute("src") or "").query)
            # 1280 px wide screen: 1178 device pixels wanted, more than any listed width
            assert asked.get("width") == (["1100"] if widths else None), asked
            await page.keyboard.press("Escape")
            await expect(page.get_by_role("dialog")).to_have_count(0)

        # The file view's preview, for the private file: the same limits, not read again.
        await page.get_by_role("link", name="secret.png", exact=True).click()
        preview = page.get_by_role("img", name="Preview of secret.png")
        await expect(preview).to_be_visible()
        assert await preview.evaluate("i => new Promise(r => i.complete ? r(i.naturalWidth)"
                                      " : i.addEventListener('load', () => r(i.naturalWidth)))") == 640
        asked = urllib.parse.parse_qs(urllib.parse.urlsplit(await preview.get_attribute("src") or "").query)
        assert asked.get("width") == (["1100"] if widths else None), asked  # 760 css px: 1100 covers it

        assert len(agents) == 1, agents
        # Each file's pictures were asked for (the same URL twice comes from the browser's cache:
        # a public lightbox image that is the stored one, a signed URL made in the same second).
        assert any("signature=" in url for url, _ in media), media
        assert {url.split("?")[0] for url, _ in media} == {f"/m/{f['file_id']}" for f in [*public, private]}
        assert [(url, status) for url, status in media if status != 200] == [], media
        assert problems == []


async def test_a_private_svg_is_never_shown_from_the_dashboard_s_origin(api: Api, settings: Settings) -> None:
    """A private thumbnail is a blob: URL, which is the dashboard's own origin, without the sandbox
    /m answers with: an SVG's script shown that way ran there once opened in a tab of its own, and
    asked the open tabs for the session (tabsession.js). Only pictures that hold no script are."""
    email = "private-svg@example.com"
    await api.user(email)
    token = await _token(api, email)
    svg = (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">'
           b'<script>document.title = "ran"</script><rect width="10" height="10"/></svg>')
    await upload(api, token, "logo.svg", "image/svg+xml", svg, public=False)
    await upload(api, token, "secret.png", "image/png", landscape(2), public=False)
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await all_thumbnails_loaded(page, 1)  # the PNG's picture; the SVG has its typed tile
        assert (await page.get_by_role("img", name="secret.png", exact=True).get_attribute("src") or "").startswith(
            "blob:")
        await expect(page.locator(".type-tile[aria-label='logo.svg']")).to_have_count(1)
        blobs = await page.evaluate("() => [...document.images].map(i => i.src).filter(s => s.startsWith('blob:'))")
        assert len(blobs) == 1, blobs
        assert problems == []
