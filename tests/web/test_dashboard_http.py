"""The dashboard's HTTP side: its page and files, headers, the reset page, logout, packaging.

The browser tests (test_dashboard_browser.py) drive the page itself; these pin the server's
answers exactly and run without a browser.
"""
from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from mediasrv.base.settings import Settings
from mediasrv.web import webassets
from tests.conftest import Api, body

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "mediasrv" / "web" / "dashboard"


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100"}


async def test_root_serves_the_page_with_a_strict_csp(api: Api) -> None:
    r = await api.call("GET", "/")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = r.headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["connect-src"] == "'self'"
    assert "unsafe" not in csp
    assert r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["Referrer-Policy"] == "no-referrer"
    assert r.headers["Cache-Control"] == "no-cache"
    page = r.body.decode()
    assert '<script type="module" src="/assets/js/app.js"></script>' in page
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), "no inline script"
    assert "http://" not in page and "https://" not in page, "nothing from another origin (no CDN)"


async def test_etag_revalidation_answers_304(api: Api) -> None:
    r = await api.call("GET", "/assets/js/app.js")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/javascript; charset=utf-8"
    etag = r.headers["ETag"]
    again = await api.call("GET", "/assets/js/app.js", headers={"If-None-Match": etag})
    assert again.code == 304
    assert again.body == b""
    other = await api.call("GET", "/assets/js/app.js", headers={"If-None-Match": '"stale"'})
    assert other.code == 200 and other.body == r.body
    head = await api.call("HEAD", "/")
    assert head.code == 200 and head.body == b""


@pytest.mark.parametrize("path", ["/assets/nope.js", "/assets/../settings.py", "/nope", "/files/x/y/z",
                                  "/dashboard"])
async def test_unknown_paths_stay_json_404(api: Api, path: str) -> None:
    r = await api.call("GET", path)
    assert r.code == 404
    assert r.headers["Content-Type"] == "application/json"
    assert body(r)["code"]


async def test_api_routes_are_untouched(api: Api) -> None:
    r = await api.call("GET", "/files")
    assert r.code == 401
    assert r.headers["Content-Type"] == "application/json"


async def test_every_module_the_page_imports_is_served(api: Api) -> None:
    """Follow the import graph from app.js: a missing module would blank the page."""
    seen: set[str] = set()
    todo = ["js/app.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = await api.call("GET", f"/assets/{path}")
        assert r.code == 200, path
        for spec in re.findall(r"from '(\.[^']+)'", r.body.decode()):
            todo.append(_join(path, spec))
    assert {"js/api.js", "js/dom.js", "js/views/files.js", "js/views/keys.js"} <= seen


def _join(base: str, spec: str) -> str:
    parts = base.split("/")[:-1]
    for piece in spec.split("/"):
        if piece == "..":
            parts.pop()
        elif piece != ".":
            parts.append(piece)
    return "/".join(parts)


async def test_reset_link_get_shows_the_page_and_post_still_resets(api: Api) -> None:
    email = "reset-page@example.com"
    await api.user(email)
    r = await api.call("POST", "/auth/forgot-password", json={"email": email})
    assert r.code == 200
    link = await api.mail_link(email, "/auth/reset-password", after=1)
    page = await api.call("GET", link.replace(api.base, ""))
    assert page.code == 200  # was 405
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert page.headers["Referrer-Policy"] == "no-referrer"  # the URL holds the token
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    token = link.split("token=", 1)[1]
    r = await api.call("POST", "/auth/reset-password", json={"token": token, "password": "brand-new-pw"})
    assert r.code == 200, r.body
    r = await api.call("POST", "/auth/login", json={"email": email, "password": "brand-new-pw"})
    assert r.code == 200


async def test_confirmation_lands_on_the_confirmed_page(api: Api, settings: Settings) -> None:
    email = "landing@example.com"
    r = await api.call("POST", "/auth/register", json={"email": email, "password": "s3cret-pass"})
    assert r.code == 201
    link = await api.mail_link(email, "/auth/confirm")
    r = await api.call("GET", link.replace(api.base, ""))
    assert r.code == 303
    assert r.headers["Location"] == f"{settings.public_url}/#/confirmed"
    landing = await api.call("GET", "/")
    assert landing.code == 200 and b"app.js" in landing.body


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"


async def test_a_used_confirmation_link_sends_a_browser_to_the_dashboard(api: Api, settings: Settings) -> None:
    """Opened again, the link is a 400 for an API client and a page saying so for a browser."""
    email = "twice@example.com"
    r = await api.call("POST", "/auth/register", json={"email": email, "password": "s3cret-pass"})
    assert r.code == 201
    path = (await api.mail_link(email, "/auth/confirm")).replace(api.base, "")
    first = await api.call("GET", path, headers={"Accept": BROWSER_ACCEPT})
    assert first.code == 303 and first.headers["Location"] == f"{settings.public_url}/#/confirmed"
    for accept in (BROWSER_ACCEPT, "text/html", "TEXT/HTML; q=0.5"):
        again = await api.call("GET", path, headers={"Accept": accept})
        assert again.code == 303, accept
        assert again.headers["Location"] == f"{settings.public_url}/#/confirm-used"
        assert again.body == b""
    for accept in (None, "*/*", "application/json", "text/html;q=0", "text/html-like"):
        again = await api.call("GET", path, headers={"Accept": accept} if accept else {})
        assert again.code == 400, accept
        assert again.headers["Content-Type"] == "application/json"
        assert body(again)["code"] == "INVALID_TOKEN"
    # A token that never existed is treated the same way (the server cannot tell them apart).
    never = await api.call("GET", "/auth/confirm?token=" + "A" * 43, headers={"Accept": BROWSER_ACCEPT})
    assert never.code == 303 and never.headers["Location"].endswith("#/confirm-used")
    # The account is confirmed once, and stays so.
    assert (await api.call("POST", "/auth/login", json={"email": email, "password": "s3cret-pass"})).code == 200


async def test_logout_retires_the_refresh_token(api: Api) -> None:
    session = (await api.user("logout@example.com"))["session"]
    r = await api.call("POST", "/auth/logout", json={"refresh_token": session["refresh_token"]})
    assert r.code == 204 and r.body == b""
    r = await api.call("POST", "/auth/refresh", json={"refresh_token": session["refresh_token"]})
    assert r.code == 401
    again = await api.call("POST", "/auth/logout", json={"refresh_token": session["refresh_token"]})
    assert again.code == 204  # idempotent: the outcome is the same
    bad = await api.call("POST", "/auth/logout", json={"refresh_token": 5})
    assert bad.code == 400 and body(bad)["code"] == "INVALID_TOKEN"


def test_package_data_ships_every_dashboard_file() -> None:
    """pip install . must carry each file the dashboard serves (pyproject package-data globs)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["mediasrv.web"]
    files = [p.relative_to(ROOT / "mediasrv" / "web").as_posix() for p in DASHBOARD.rglob("*") if p.is_file()]
    assert files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert missing == []
    assert set(webassets.load_assets()) == {f.removeprefix("dashboard/") for f in files}
