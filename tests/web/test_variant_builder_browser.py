"""Issue 29's dashboard part in Debian's chromium: the file view's variant builder (gravity, dpr,
blur, sharpen, bg, first frame, a live preview, "Copy srcset") and the focal point picker.

Same harness as test_dashboard_browser.py (the test app on the test's loop, Playwright's async API
on the same loop). What the builder writes is checked against the server itself: each link is
fetched without following redirects (a non-canonical spelling would be a 308), and the page's own
module (variants.js) is run over many combinations whose queries ``images.spec.read_query`` must
find canonical. Screenshots go to $MEDIASRV_TEST_ARTIFACTS, else the test's tmp_path, and to
$MEDIASRV_TEST_SHOTS when it is set (the lead's review copies at 1440 and 390 pixels wide).
"""
from __future__ import annotations

import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from mediasrv.base.errors import BadRequest
from mediasrv.base.settings import Settings
from mediasrv.images.spec import parse_transform, read_query
from tests.conftest import Api, body
from tests.web import test_dashboard_browser as dashboard
from tests.web.test_dashboard_browser import (
    _token,
    _wait_clipboard,
    assert_accessible,
    browser_page,
    expect,
    log_in,
    picture,
    tab_to,
    upload,
)

# The browser tests' fixtures: screenshots outside the checkout, a local DNS, a rate-limit scale.
artifacts = dashboard.artifacts
io_loop = dashboard.io_loop  # one loop and one Playwright driver for the module's tests
playwright_driver = dashboard.playwright_driver
app_env = dashboard.app_env

from playwright.async_api import Page, Route  # noqa: E402  (after the chromium check above)

# Slow (a browser): scheduled first (tests/conftest.py). On one worker, so the module's loop and
# Playwright driver start once per run, not once per worker that takes one of its tests.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser-variant-builder")]


def stripes() -> bytes:
    """A 600x400 PNG in three upright bands, red, green and blue: a portrait crop of it shows
    which band the crop kept (the centre: green; a focal point on the left: red)."""
    image = Image.new("RGB", (600, 400))
    draw = ImageDraw.Draw(image)
    for k, colour in enumerate(((220, 30, 30), (30, 200, 60), (30, 60, 220))):
        draw.rectangle((k * 200, 0, k * 200 + 199, 399), fill=colour)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def animation() -> bytes:
    """A 3-frame 120x90 GIF: only an animatable source offers "first frame only"."""
    frames = [Image.new("RGB", (120, 90), colour) for colour in ((200, 0, 0), (0, 200, 0), (0, 0, 200))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return out.getvalue()


def translucent() -> bytes:
    """A 400x300 PNG whose left half is transparent: bg is what it becomes in a JPEG."""
    image = Image.new("RGBA", (400, 300), (20, 120, 200, 255))
    ImageDraw.Draw(image).rectangle((0, 0, 199, 299), fill=(0, 0, 0, 0))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


async def shoot(page: Page, artifacts: Path, name: str) -> None:
    """A full-page screenshot into the artifacts, and a copy where $MEDIASRV_TEST_SHOTS says."""
    path = artifacts / name
    await page.evaluate("() => window.scrollTo(0, 0)")  # the sticky header at the top of the shot
    await page.screenshot(path=str(path), full_page=True)
    shots = os.environ.get("MEDIASRV_TEST_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(shots) / name)


async def fill_builder(page: Page, **values: str | bool) -> None:
    """Set the builder's fields by their labels (fit, gravity and format are <select>s)."""
    labels = {"width": "Width (px)", "height": "Height (px)", "dpr": "Pixel density (dpr, 1-4)",
              "quality": "Quality (1-100)", "blur": "Blur (sigma 0.3-100)", "sharpen": "Sharpen (sigma 0.3-10)"}
    for name in ("width", "height", "fit", "gravity", "format", "quality", "dpr", "blur", "sharpen", "bg",
                 "first_frame"):
        if name not in values:
            continue
        value = values[name]
        if name == "fit":
            await page.get_by_label("Fit", exact=True).select_option(str(value))
        elif name == "gravity":
            await page.get_by_label("Gravity", exact=True).select_option(str(value))
        elif name == "format":
            await page.get_by_label("Format", exact=True).select_option(str(value))
        elif name == "bg":
            await page.get_by_label("Background colour").fill(str(value))
        elif name == "first_frame":
            await page.get_by_label("First frame only").set_checked(bool(value))
        else:
            await page.get_by_label(labels[name], exact=True).fill(str(value))


async def fetched(api: Api, link: str, **headers: str) -> Any:
    """GET a link of this server without following redirects: a 308 would be a wrong spelling."""
    r = await api.call("GET", link.replace(api.base, ""), headers=headers or None)
    assert r.code == 200, (link, r.code, r.headers.get("Location"), r.body[:200])
    assert "Location" not in r.headers
    return r


async def ready_preview(page: Page) -> Any:
    """The builder's preview once it shows the current variant; its <img>."""
    figure = page.locator("figure.variant-preview")
    await expect(figure).to_have_attribute("data-state", "ready")
    return figure.get_by_role("img", name="Preview of this variant")


async def centre_colour(page: Page, selector: str) -> tuple[int, int, int]:
    """The RGB of an <img>'s middle pixel, read in the page (the image is from this origin)."""
    rgb = await page.eval_on_selector(selector, """img => {
        const c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const g = c.getContext('2d');
        g.drawImage(img, 0, 0);
        return [...g.getImageData(img.naturalWidth >> 1, img.naturalHeight >> 1, 1, 1).data.slice(0, 3)];
    }""")
    return rgb[0], rgb[1], rgb[2]


def dominant(rgb: tuple[int, int, int]) -> str:
    return ("red", "green", "blue")[max(range(3), key=lambda k: rgb[k])]


async def open_file(page: Page, file: dict) -> None:
    await page.goto(f"/#/file/{file['file_id']}")
    await expect(page.get_by_role("heading", name=file["name"])).to_be_visible()


async def test_the_builder_writes_the_servers_canonical_links(api: Api, settings: Settings, artifacts: Path) -> None:
    email = "variants-builder@example.com"
    await api.user(email)
    token = await _token(api, email)
    photo = await upload(api, token, "harbour.png", "image/png", picture((30, 120, 160), "harbour"))
    glass = await upload(api, token, "glass.png", "image/png", translucent())
    gif = await upload(api, token, "blink.gif", "image/gif", animation())
    secret = await upload(api, token, "secret.png", "image/png", picture((160, 40, 90), "secret"), public=False)
    async with browser_page(settings.public_url, viewport=(1440, 1000)) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await open_file(page, photo)
        resized = page.get_by_label("Resized link")
        copy = page.get_by_role("button", name="Copy resized link")
        copy_srcset = page.get_by_role("button", name="Copy srcset")
        gravity = page.get_by_label("Gravity", exact=True)

        # Gravity only says where fit=cover crops: hidden (and out of the link) until cover.
        await expect(gravity).to_be_hidden()
        await expect(page.get_by_label("First frame only")).to_have_count(0)  # a PNG: nothing to freeze
        await fill_builder(page, width="300", height="200")
        await expect(gravity).to_be_hidden()
        await fill_builder(page, fit="cover")
        await expect(gravity).to_be_visible()
        await expect(gravity.locator("option[value=focal]")).to_have_text("This file's focal point")
        await fill_builder(page, gravity="focal")
        await expect(page.locator(".hint", has_text="Crops around this file's focal point")).to_contain_text(
            "or the most interesting part when none is set")

        # A representative combination, each value typed the long way: the canonical link.
        await fill_builder(page, format="webp", quality="70", dpr="1.50", blur=".50", sharpen="1.0", bg="#1A2B3C")
        expected = (f"{photo['public_url']}?width=300&height=200&fit=cover&gravity=focal&format=webp&quality=70"
                    "&dpr=1.5&blur=0.5&sharpen=1&bg=1a2b3c")
        await expect(resized).to_have_value(expected)
        r = await fetched(api, expected)
        assert r.headers["Content-Type"] == "image/webp"
        assert Image.open(io.BytesIO(r.body)).size == (450, 300)  # the box times dpr 1.5
        # The link it opens is the same, and the browser gets it without a redirect.
        assert await page.get_by_role("link", name="Open the resized image").get_attribute("href") == expected
        answer = await page.request.get(expected, max_redirects=0)
        assert answer.status == 200 and answer.headers["content-type"] == "image/webp"
        # The live preview shows that variant (from this origin's /m path, as the CSP wants).
        thumb = await ready_preview(page)
        src = await thumb.get_attribute("src")
        assert src == expected.replace(settings.public_url, "") + "&v=none", src  # no focal point yet
        assert await thumb.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [450, 300]
        await expect(page.locator("figure.variant-preview figcaption")).to_contain_text(
            "450 \N{MULTIPLICATION SIGN} 300 px")
        await copy.click()
        assert await _wait_clipboard(page, "gravity=focal") == expected

        # Defaults written out are left out (centre, dpr 1, white), as /m writes them.
        await fill_builder(page, gravity="center", dpr="1", bg="#ffffff", blur="", sharpen="", quality="")
        await expect(resized).to_have_value(f"{photo['public_url']}?width=300&height=200&fit=cover&format=webp")
        # Back to contain: gravity goes away with cover.
        await fill_builder(page, gravity="north")
        await expect(resized).to_have_value(
            f"{photo['public_url']}?width=300&height=200&fit=cover&gravity=north&format=webp")
        await fill_builder(page, fit="contain")
        await expect(gravity).to_be_hidden()
        await expect(resized).to_have_value(f"{photo['public_url']}?width=300&height=200&format=webp")

        # More combinations: each written link is answered 200 with no redirect.
        for values, query in (
            ({"width": "", "height": "120", "format": "", "dpr": "2"}, "height=120&dpr=2"),
            ({"height": "", "width": "0250", "format": "jpeg", "quality": "055", "dpr": "1.25"},
             "width=250&format=jpeg&quality=55&dpr=1.25"),
            ({"width": "", "quality": "", "dpr": "", "format": "", "blur": "100"}, "blur=100"),
            ({"blur": "", "sharpen": "0.3", "format": "png"}, "format=png&sharpen=0.3"),
            ({"sharpen": "", "format": "auto", "width": "64", "height": "64", "fit": "cover", "gravity": "southeast"},
             "width=64&height=64&fit=cover&gravity=southeast&format=auto"),
        ):
            await fill_builder(page, **values)
            written = f"{photo['public_url']}?{query}"
            await expect(resized).to_have_value(written)
            await fetched(api, written, Accept="image/avif,image/webp,*/*")

        # Out of range: the server's own bounds, the copy buttons off, the field marked.
        alert = page.get_by_role("alert")
        dpr = page.get_by_label("Pixel density (dpr, 1-4)")
        for value in ("5", "1.255", "0.5"):
            await dpr.fill(value)
            await expect(alert).to_have_text(
                "Pixel density (dpr) must be a number from 1 to 4 with at most two decimals")
            await expect(copy).to_be_disabled()
            await expect(copy_srcset).to_be_disabled()
            await expect(dpr).to_have_attribute("aria-invalid", "true")
            opener = page.locator("a", has_text="Open the resized image")  # no href: no longer a link
            assert await opener.get_attribute("href") is None
            await expect(opener).to_have_attribute("aria-disabled", "true")
        await dpr.fill("")
        await expect(alert).to_be_hidden()
        await expect(dpr).not_to_have_attribute("aria-invalid", "true")
        await fill_builder(page, blur="0.2")
        await expect(alert).to_have_text("Blur must be a number from 0.3 to 100 with at most two decimals")
        await fill_builder(page, blur="", sharpen="11")
        await expect(alert).to_have_text("Sharpen must be a number from 0.3 to 10 with at most two decimals")
        await fill_builder(page, sharpen="", width="9000")
        await expect(alert).to_have_text("width must be a whole number from 1 to 8192")
        await fill_builder(page, width="", height="", fit="contain", format="", dpr="2")
        await expect(alert).to_have_text("Pixel density (dpr) multiplies the box: give a width or a height")
        await expect(copy).to_be_disabled()
        await expect(page.locator("figure.variant-preview")).to_have_attribute("data-state", "empty")
        await fill_builder(page, dpr="")
        await expect(copy).to_be_enabled()
        await assert_accessible(page)

        # srcset: the widths up to the image's own 640, each with the builder's other parameters;
        # a box keeps its shape at every width, dpr is left out.
        await fill_builder(page, width="300", height="200", fit="cover", gravity="center", format="webp", dpr="2")
        await copy_srcset.click()
        text = await _wait_clipboard(page, " 640w")
        url = photo["public_url"]
        assert text == (f"{url}?width=320&height=213&fit=cover&format=webp 320w, "
                        f"{url}?width=640&height=427&fit=cover&format=webp 640w")
        for candidate in text.split(", "):
            link, descriptor = candidate.rsplit(" ", 1)
            r = await fetched(api, link)
            assert Image.open(io.BytesIO(r.body)).size[0] == int(descriptor[:-1])
        await expect(page.locator("#status")).to_contain_text("Copied the srcset")
        await fill_builder(page, height="", fit="contain", dpr="", format="")
        await copy_srcset.click()
        assert await _wait_clipboard(page, "width=320 320w") == f"{url}?width=320 320w, {url}?width=640 640w"
        await fill_builder(page, height="200", fit="cover", gravity="focal", format="webp", quality="70", blur="1.5")
        await ready_preview(page)
        await shoot(page, artifacts, "variants-builder-1440.png")
        await page.emulate_media(color_scheme="dark")
        await shoot(page, artifacts, "variants-builder-1440-dark.png")
        await page.emulate_media(color_scheme="light")
        # A phone: one column, nothing wider than the screen.
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.reload()
        await expect(page.get_by_role("heading", name=photo["name"])).to_be_visible()
        await fill_builder(page, width="300", height="200", fit="cover", gravity="focal", format="webp")
        await ready_preview(page)
        assert await page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth") == 0
        await shoot(page, artifacts, "variants-builder-390.png")
        await page.set_viewport_size({"width": 1440, "height": 1000})

        # bg: what the transparent half of a PNG becomes in a JPEG.
        await open_file(page, glass)
        await fill_builder(page, width="200", format="jpeg", bg="#ff0000")
        link = f"{glass['public_url']}?width=200&format=jpeg&bg=ff0000"
        await expect(page.get_by_label("Resized link")).to_have_value(link)
        await expect(page.locator(".hint", has_text="no alpha")).to_be_visible()
        r = await fetched(api, link)
        left = Image.open(io.BytesIO(r.body)).convert("RGB").getpixel((20, 75))
        assert left[0] > 200 and left[1] < 60 and left[2] < 60, left

        # An animated GIF offers its first frame alone.
        await open_file(page, gif)
        await fill_builder(page, width="60", first_frame=True)
        link = f"{gif['public_url']}?width=60&animated=false"
        await expect(page.get_by_label("Resized link")).to_have_value(link)
        r = await fetched(api, link)
        assert getattr(Image.open(io.BytesIO(r.body)), "n_frames", 1) == 1
        await fill_builder(page, first_frame=False)
        await expect(page.get_by_label("Resized link")).to_have_value(f"{gif['public_url']}?width=60")

        # A private file: the link and the preview are signed, and the link is still canonical.
        await open_file(page, secret)
        await fill_builder(page, width="160", height="160", fit="cover", gravity="attention", format="png")
        signed = page.get_by_label("Resized link")
        pattern = rf"{re.escape(secret['public_url'])}\?expires=\d+&signature=[^&]+" \
                  r"&width=160&height=160&fit=cover&gravity=attention&format=png"
        await expect(signed).to_have_value(re.compile(pattern))
        thumb = await ready_preview(page)
        assert await thumb.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [160, 160]
        await page.get_by_role("button", name="Copy resized link").click()
        link = await _wait_clipboard(page, "gravity=attention")
        assert re.fullmatch(pattern, link), link
        await fetched(api, link)
        await page.get_by_role("button", name="Copy srcset").click()
        text = await _wait_clipboard(page, " 320w")
        for candidate in text.split(", "):
            await fetched(api, candidate.rsplit(" ", 1)[0])
        assert problems == []


async def test_the_pages_variant_module_writes_what_read_query_calls_canonical(api: Api, settings: Settings) -> None:
    """variants.js over a few hundred random combinations, run in the page: every query it writes
    is one /m reads without a 308 (``read_query`` finds no other canonical spelling), and each
    value it refuses is one the parser refuses too."""
    rng = random.Random(29)
    choices: dict[str, list[str]] = {
        "width": ["", "1", "0320", "8192", "8193", "0", "12.5"], "height": ["", "200", "007"],
        "fit": ["contain", "cover"], "gravity": ["", "center", "north", "focal", "attention", "southwest"],
        "format": ["", "jpeg", "JPG", "png", "webp", "auto"], "quality": ["", "1", "100", "070", "101"],
        "dpr": ["", "1", "1.0", "2.00", "1.5", "4", "4.01", ".75", "3.333"],
        "blur": ["", "0.3", "0.30", "100", "100.00", "0.29", "7.5"], "sharpen": ["", "10", "0.5", "10.5"],
        "bg": ["#ffffff", "#FFFFFF", "#000000", "#1A2b3C"], "firstFrame": ["", "1"],
    }
    combos = [{name: rng.choice(values) for name, values in choices.items()} for _ in range(400)]
    async with browser_page(settings.public_url) as (page, problems):
        await page.goto("/#/login")
        results = await page.evaluate("""async (combos) => {
            const v = await import('/assets/js/variants.js');
            const limits = v.withDefaults({formats: ['jpeg', 'png', 'webp', 'avif', 'gif', 'auto']});
            return combos.map((raw) => {
                try {
                    return {query: v.withQuery('', v.variantParams({...raw, firstFrame: raw.firstFrame === '1'},
                                                                   limits)).slice(1)};
                } catch (e) {
                    return {error: e.message, field: e.field};
                }
            });
        }""", combos)
        assert problems == []
    written = [r["query"] for r in results if "query" in r]
    refused = [(combo, r) for combo, r in zip(combos, results, strict=True) if "error" in r]
    assert len(written) > 50 and len(refused) > 50  # both sides were exercised
    for query in written:
        parsed = read_query(query)
        assert parsed.canonical is None, (query, parsed.canonical)
    for combo, _ in refused:
        args = {name: [value] for name, value in combo.items() if value and name not in ("firstFrame", "bg")}
        if combo["fit"] != "cover":
            args.pop("gravity", None)
        with pytest.raises(BadRequest):
            parse_transform(args)


async def test_the_focal_point_is_set_by_click_and_keyboard_and_steers_the_crop(
        api: Api, settings: Settings, artifacts: Path) -> None:
    email = "variants-focal@example.com"
    await api.user(email)
    token = await _token(api, email)
    bands = await upload(api, token, "bands.png", "image/png", stripes())
    path = f"/files/{bands['file_id']}"
    async with browser_page(settings.public_url, viewport=(1440, 1000)) as (page, problems):
        await page.goto("/#/login")
        await log_in(page, email)
        await open_file(page, bands)
        picker = page.get_by_role("group", name="Focal point of bands.png")
        preview = picker.get_by_role("img", name="Preview of bands.png")
        await expect(preview).to_be_visible()
        await expect(page.locator(".focal-value")).to_have_text(
            "No focal point: gravity=focal keeps the most interesting part.")
        await expect(page.get_by_role("button", name="Clear focal point")).to_be_disabled()
        await expect(page.locator(".focal-marker")).to_be_hidden()

        # A portrait crop of the bands: the centre keeps green.
        await fill_builder(page, width="100", height="200", fit="cover", gravity="focal", format="png")
        thumb_selector = "figure.variant-preview img"
        await ready_preview(page)

        # Click at 15% across, 70% down: the File has that point, and the marker sits there.
        box = await preview.bounding_box()
        assert box is not None
        await preview.click(position={"x": box["width"] * 0.15, "y": box["height"] * 0.7})
        await expect(page.locator("#status")).to_contain_text("Saved the focal point: 15% across, 70% down.")
        await expect(page.locator(".toast")).to_contain_text("Saved the focal point")
        stored = body(await api.call("GET", path, token=token))["focal_point"]
        assert stored["x"] == pytest.approx(0.15, abs=0.01) and stored["y"] == pytest.approx(0.7, abs=0.01)
        marker = await page.locator(".focal-marker").bounding_box()
        assert marker is not None
        assert marker["x"] + marker["width"] / 2 == pytest.approx(box["x"] + box["width"] * 0.15, abs=2)
        assert marker["y"] + marker["height"] / 2 == pytest.approx(box["y"] + box["height"] * 0.7, abs=2)
        await expect(page.locator(".focal-value")).to_have_text("Focal point: 15% across, 70% down")

        # The builder's preview follows at once: the focal crop keeps the red band now.
        await expect(page.locator(thumb_selector)).to_have_attribute(
            "src", re.compile(re.escape(f"&v={stored['x']}x{stored['y']}") + "$"))
        await ready_preview(page)
        assert dominant(await centre_colour(page, thumb_selector)) == "red"
        # Over the API: gravity=focal and gravity=center are different crops now.
        url = bands["public_url"]
        focal = (await fetched(api, f"{url}?width=100&height=200&fit=cover&gravity=focal&format=png")).body
        centre = (await fetched(api, f"{url}?width=100&height=200&fit=cover&format=png")).body
        assert focal != centre
        assert dominant(Image.open(io.BytesIO(focal)).convert("RGB").getpixel((50, 100))) == "red"
        assert dominant(Image.open(io.BytesIO(centre)).convert("RGB").getpixel((50, 100))) == "green"
        await shoot(page, artifacts, "variants-focal-1440.png")
        await page.set_viewport_size({"width": 390, "height": 844})
        await expect(page.locator(".focal-marker")).to_be_visible()
        await shoot(page, artifacts, "variants-focal-390.png")
        await page.set_viewport_size({"width": 1440, "height": 1000})

        # Keyboard only: Tab to the picture, move the marker with the arrows, Enter saves.
        await tab_to(page, ".focal-picker")
        for key in ("ArrowRight",) * 3 + ("Shift+ArrowRight",) * 6 + ("ArrowUp",) * 2:
            await page.keyboard.press(key)
        await expect(page.locator(".focal-marker")).to_have_class(re.compile("pending"))
        await expect(page.locator(".focal-value")).to_contain_text("78% across, 68% down (not saved")
        await page.keyboard.press("Escape")  # puts it back
        await expect(page.locator(".focal-value")).to_have_text("Focal point: 15% across, 70% down")
        for key in ("ArrowRight",) * 3 + ("Shift+ArrowRight",) * 6 + ("ArrowUp",) * 2:
            await page.keyboard.press(key)
        await page.keyboard.press("Enter")
        await expect(page.locator("#status")).to_contain_text("Saved the focal point: 78% across, 68% down.")
        clicked = stored
        stored = body(await api.call("GET", path, token=token))["focal_point"]
        assert stored == {"x": pytest.approx(clicked["x"] + 0.63, abs=1e-4),  # 3 steps of 1%, 6 of 10%
                          "y": pytest.approx(clicked["y"] - 0.02, abs=1e-4)}
        await expect(page.locator(thumb_selector)).to_have_attribute(
            "src", re.compile(re.escape(f"&v={stored['x']}x{stored['y']}") + "$"))
        await ready_preview(page)
        assert dominant(await centre_colour(page, thumb_selector)) == "blue"

        # A refused save says so (toast and status) and keeps the stored point.
        async def refuse(route: Route) -> None:
            if route.request.method != "PATCH":
                await route.continue_()
                return
            await route.fulfill(status=400, content_type="application/json",
                                body='{"error": "focal_point must be null or {x, y}", "code": "INVALID_FOCAL_POINT"}')
        await page.route(re.compile(r".*/files/[^/?]+$"), refuse)
        await preview.click(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
        await expect(page.locator(".toast[data-kind=error]")).to_contain_text(
            "The focal point was not saved: focal_point must be null")
        await expect(page.locator("#status")).to_have_attribute("data-kind", "error")
        await expect(page.locator(".focal-value")).to_have_text("Focal point: 78% across, 68% down")
        await page.unroute(re.compile(r".*/files/[^/?]+$"))

        # Clear: the File has none, the marker goes, gravity=focal falls back to attention.
        await page.get_by_role("button", name="Clear focal point").click()
        await expect(page.locator("#status")).to_contain_text("Cleared the focal point.")
        assert body(await api.call("GET", path, token=token))["focal_point"] is None
        await expect(page.locator(".focal-marker")).to_be_hidden()
        await expect(page.get_by_role("button", name="Clear focal point")).to_be_disabled()
        await expect(page.locator(thumb_selector)).to_have_attribute("src", re.compile(r"&v=none$"))
        await ready_preview(page)
        await assert_accessible(page)
        assert [p for p in problems if "status of 400" not in p] == []


@pytest.mark.parametrize("app_env", [{"MEDIASRV_ALLOWED_WIDTHS": "320,640", "MEDIASRV_ALLOWED_FORMATS": "webp",
                                      "MEDIASRV_ALLOWED_FITS": "cover", "MEDIASRV_ALLOWED_HEIGHTS": "320"}],
                         indirect=True)
async def test_a_strict_server_lists_what_the_builder_offers(api: Api, settings: Settings) -> None:
    """MEDIASRV_ALLOWED_*: the discovery document publishes the lists, and the builder refuses
    what the server would instead of showing a broken link."""
    resize = body(await api.call("GET", "/reference/for-agents"))["limits"]["resize"]
    assert resize["allowed"] == {"width": ["320", "640"], "height": ["320"], "format": ["webp"], "fit": ["cover"]}
    email = "variants-strict@example.com"
    await api.user(email)
    token = await _token(api, email)
    photo = await upload(api, token, "harbour.png", "image/png", picture((30, 120, 160), "harbour"))
    async with browser_page(settings.public_url) as (page, problems):
        refused: list[str] = []
        agents: list[str] = []
        page.on("response", lambda r: refused.append(r.url) if r.status >= 400 else None)
        page.on("request", lambda r: agents.append(r.url) if r.url.endswith("/reference/for-agents") else None)
        await page.goto("/#/login")
        await log_in(page, email)
        await expect(page.locator("ul.grid .thumb-box")).to_have_class(re.compile(r"\bloaded\b"))
        await open_file(page, photo)
        # The page's own preview asks for a listed width.
        src = await page.get_by_role("img", name="Preview of harbour.png").get_attribute("src")
        assert src in (f"/m/{photo['file_id']}?width=320", f"/m/{photo['file_id']}?width=640"), src
        formats = await page.get_by_label("Format", exact=True).locator("option").evaluate_all(
            "os => os.map(o => o.value)")
        assert formats == ["", "webp"]
        await fill_builder(page, width="300")
        await expect(page.get_by_role("alert")).to_have_text("This server makes width only as 320, 640")
        await expect(page.get_by_role("button", name="Copy resized link")).to_be_disabled()
        await fill_builder(page, width="320", blur="2")
        await expect(page.get_by_role("alert")).to_have_text(
            "This server makes only the variants its owner lists: not blur")
        await fill_builder(page, blur="", format="webp")
        link = f"{photo['public_url']}?width=320&format=webp"
        await expect(page.get_by_label("Resized link")).to_have_value(link)
        await fetched(api, link)
        await ready_preview(page)
        await page.get_by_role("button", name="Copy srcset").click()
        text = await _wait_clipboard(page, " 640w")
        url = photo["public_url"]
        assert text == f"{url}?width=320&format=webp 320w, {url}?width=640&format=webp 640w"
        for candidate in text.split(", "):
            await fetched(api, candidate.rsplit(" ", 1)[0])
        # Nothing was refused: the Files page's thumbnails (where the login lands) ask for the
        # server's widths too, and the page read its limits once for both views.
        assert refused == []
        assert len(agents) == 1, agents
        assert problems == []
