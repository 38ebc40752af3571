"""Units of the core: the rate limiter, settings, timestamps and the buffered recorders."""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from handlers.routes import LIMITS
from mediasrv.base.ids import row_id
from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings import load as load_settings
from mediasrv.base.settings.help import help_text as settings_help_text
from mediasrv.base.settings.model import DEFAULT_ALLOWED_CONTENT_TYPES
from mediasrv.base.timeutil import iso, month_period, now, now_iso, parse_iso, period_key
from mediasrv.cli.secret import StartupError, load_secret
from mediasrv.core import recorders
from mediasrv.core.files.content_types import needs_sandbox, shown_inline
from mediasrv.core.limits.ratelimit import WINDOW_S, Limit, RateLimiter
from mediasrv.core.recorders import ActivityRecorder, Flusher, KeyUsageRecorder, UsageRecorder
from store.models import LogEntry, UsageCounts

UTC = dt.UTC

# ---------------------------------------------------------------------------- rate limiter

# interface.md, Limits: every limited route, its key and its requests per minute.
INTERFACE_TABLE = {
    "media": ("ip", 400), "register": ("ip", 10), "login": ("ip", 15),
    "api_keys.create": ("user", 10), "api_keys.list": ("user", 30), "api_keys.delete": ("user", 10),
    "files.upload": ("user", 30), "files.bulk_delete": ("user", 20), "files.list": ("user", 60),
    "files.get": ("user", 120), "files.delete": ("user", 60), "settings.get": ("user", 60),
    "settings.patch": ("user", 20), "profile": ("user", 60), "usage": ("user", 60), "logs": ("user", 60),
}


IP_LIMITS = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "ip"}
USER_LIMITS = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "user"}
"""The counters the routes declare (handlers/*.py), as the app gives them to the limiter."""


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("route", sorted(INTERFACE_TABLE))
def test_limits_are_exactly_the_interface_table(route: str) -> None:
    kind, per_minute = INTERFACE_TABLE[route]
    table = IP_LIMITS if kind == "ip" else USER_LIMITS
    assert table[route] == per_minute
    limiter = RateLimiter(LIMITS.values(), clock=Clock(1_000_020.0))
    decisions = [limiter.hit(route, "k", per_ip=kind == "ip") for _ in range(per_minute + 2)]
    assert all(d.allowed for d in decisions[:per_minute])
    assert not decisions[per_minute].allowed and not decisions[per_minute + 1].allowed
    assert [d.remaining for d in decisions[-3:]] == [0, 0, 0]
    assert decisions[0].remaining == per_minute - 1
    assert {d.limit for d in decisions} == {per_minute}


def test_counters_are_per_key_and_per_route() -> None:
    limiter = RateLimiter(LIMITS.values(), clock=Clock(6000.0))
    for _ in range(10):
        assert limiter.hit("register", "10.0.0.1", per_ip=True).allowed
    assert not limiter.hit("register", "10.0.0.1", per_ip=True).allowed
    assert limiter.hit("register", "10.0.0.2", per_ip=True).allowed  # another address
    assert limiter.hit("login", "10.0.0.1", per_ip=True).allowed  # another route
    for _ in range(20):
        limiter.hit("settings.patch", "user-a", per_ip=False)
    assert not limiter.hit("settings.patch", "user-a", per_ip=False).allowed
    assert limiter.hit("settings.get", "user-a", per_ip=False).allowed
    assert limiter.hit("settings.patch", "user-b", per_ip=False).allowed


def test_an_ipv6_client_is_counted_by_its_64_network() -> None:
    """A host on an IPv6 network has 2**64 addresses: counted alone, each would start afresh."""
    limiter = RateLimiter(LIMITS.values(), clock=Clock(6000.0))
    for n in range(10):  # ten addresses of one /64, written every way IPv6 allows
        assert limiter.hit("register", f"2001:db8:0:1::{n + 1:x}" if n % 2 else f"2001:DB8:0:1:0:0:0:{n + 1:x}",
                           per_ip=True).allowed
    assert not limiter.hit("register", "2001:db8:0:1:ffff:ffff:ffff:ffff", per_ip=True).allowed
    assert not limiter.would_allow("register", "2001:db8:0:1::abcd")
    assert limiter.hit("register", "2001:db8:0:2::1", per_ip=True).allowed  # the next /64
    for _ in range(10):
        limiter.hit("register", "::ffff:10.0.0.9", per_ip=True)  # IPv4-mapped: the IPv4 address
    assert not limiter.hit("register", "10.0.0.9", per_ip=True).allowed
    assert limiter.hit("register", "10.0.0.10", per_ip=True).allowed
    assert limiter.hit("register", "unknown", per_ip=True).allowed  # not an address: as it is


def test_window_rolls_over_on_the_clock_minute() -> None:
    clock = Clock(60 * 1000 + 30.0)
    limiter = RateLimiter(LIMITS.values(), clock=clock)
    for _ in range(15):
        assert limiter.hit("login", "ip", per_ip=True).allowed
    clock.t = 60 * 1000 + 59.999
    denied = limiter.hit("login", "ip", per_ip=True)
    assert not denied.allowed and denied.reset_s == 1
    clock.t = 60 * 1001  # the next window starts: every counter starts again
    fresh = limiter.hit("login", "ip", per_ip=True)
    assert fresh.allowed and fresh.remaining == 14 and fresh.reset_s == 60
    clock.t = 60 * 1001 + 45.5
    assert limiter.hit("login", "ip", per_ip=True).reset_s == 15


@pytest.mark.parametrize("offset", [0.0, 0.001, 0.5, 1.0, 17.3, 30.0, 58.9, 59.0, 59.5, 59.999999])
def test_reset_is_whole_seconds_from_1_to_60(offset: float) -> None:
    t = 60 * 123_456 + offset
    d = RateLimiter(LIMITS.values(), clock=Clock(t)).hit("usage", "u", per_ip=False)
    assert isinstance(d.reset_s, int) and 1 <= d.reset_s <= WINDOW_S
    assert d.reset_s == max(1, math.ceil(60 - offset))
    headers = d.headers()
    assert headers == {"RateLimit-Limit": "60", "RateLimit-Remaining": "59", "RateLimit-Reset": str(d.reset_s)}


def test_real_clock_reset_is_in_range() -> None:
    d = RateLimiter(LIMITS.values()).hit("media", "127.0.0.1", per_ip=True)
    assert 1 <= d.reset_s <= 60 and d.allowed and d.limit == 400


@pytest.mark.parametrize(("scale", "route", "expected"), [
    (1.0, "register", 10), (2.0, "register", 20), (1.5, "login", 22), (10.0, "media", 4000),
    (0.5, "files.get", 60), (0.01, "register", 1), (1e-9, "media", 1), (1000.0, "usage", 60000),
])
def test_scale_multiplies_every_limit_but_never_below_one(scale: float, route: str, expected: int) -> None:
    limiter = RateLimiter(LIMITS.values(), scale=scale, clock=Clock(120.0))
    per_ip = route in ("register", "login", "media")
    decisions = [limiter.hit(route, "k", per_ip=per_ip) for _ in range(expected + 1)]
    assert decisions[0].limit == expected
    assert sum(d.allowed for d in decisions) == expected
    assert not decisions[-1].allowed


def test_memory_holds_only_the_current_window() -> None:
    clock = Clock(60 * 5000 + 1.0)
    limiter = RateLimiter(LIMITS.values(), clock=clock)
    for i in range(5000):
        limiter.hit("media", f"10.0.{i // 256}.{i % 256}", per_ip=True)
    limiter.hit("usage", "user", per_ip=False)
    assert len(limiter) == 5001
    clock.t += 60
    limiter.hit("media", "10.9.9.9", per_ip=True)
    assert len(limiter) == 1
    clock.t += 3600  # long idle: still one window's worth
    limiter.hit("login", "x", per_ip=True)
    assert len(limiter) == 1


def test_limits_are_given_as_data() -> None:
    limiter = RateLimiter([Limit("a", 2, "ip"), Limit("b", 1, "user"), Limit("a", 2, "ip")], clock=Clock(60.0))
    assert [limiter.hit("a", "k", per_ip=True).allowed for _ in range(3)] == [True, True, False]
    assert limiter.hit("b", "u", per_ip=False).limit == 1
    with pytest.raises(ValueError, match="rate limit a given twice"):
        RateLimiter([Limit("a", 2, "ip"), Limit("a", 3, "ip")])


def test_unknown_route_names_fail_loudly() -> None:
    limiter = RateLimiter(LIMITS.values())
    with pytest.raises(KeyError):
        limiter.hit("nope", "k", per_ip=False)
    with pytest.raises(KeyError):
        limiter.hit("usage", "k", per_ip=True)  # a per-user route has no per-IP counter


# ---------------------------------------------------------------------------- settings

ALL_VARS = {f.metadata["env"] for f in dataclasses.fields(Settings) if "env" in f.metadata}


def test_defaults_with_an_empty_environment() -> None:
    s = load_settings({})
    assert s.data_dir == Path("./data")
    assert s.public_url == "http://127.0.0.1:8080"
    assert s.dashboard_url == "http://127.0.0.1:8080/"
    assert s.smtp_url is None and s.jwt_secret is None
    assert s.mail_from == "mediasrv@localhost"
    assert s.trial_days is None and s.storage_limit_bytes is None and s.file_count_limit is None
    assert s.max_upload_size_bytes == 104_857_600
    assert s.trust_proxy is False
    assert s.mongodb_url is None and s.s3_bucket is None and s.s3_endpoint_url is None
    assert s.domain_provider == "manual"
    assert s.cloudflare_api_token is None and s.cloudflare_zone_id is None
    assert s.cloudflare_api_url == "https://api.cloudflare.com/client/v4"
    assert s.resize_slots == 10 and s.max_image_pixels == 50_000_000
    assert s.rate_limit_scale == 1.0
    assert s.allowed_content_types == DEFAULT_ALLOWED_CONTENT_TYPES
    assert s.bcrypt_rounds >= 10  # a real cost by default; tests lower it
    assert s.log_level == "INFO"


def test_from_env_reads_only_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDIASRV_RESIZE_SLOTS", "3")
    assert Settings.from_env({}).resize_slots == 10
    assert Settings.from_env().resize_slots == 3
    monkeypatch.setenv("MEDIASRV_RESIZE_SLOTS", "abc")
    with pytest.raises(SettingsError, match="MEDIASRV_RESIZE_SLOTS"):
        Settings.from_env()


def test_default_allowed_types_include_the_contract_list_and_no_executables() -> None:
    required = {"image/jpeg", "image/png", "image/gif", "image/webp", "image/avif", "application/pdf",
                "text/plain"}
    assert required <= set(DEFAULT_ALLOWED_CONTENT_TYPES)
    for t in DEFAULT_ALLOWED_CONTENT_TYPES:
        assert t == t.lower() and t.count("/") == 1
        assert not any(word in t for word in ("executable", "msdownload", "x-sh", "javascript", "xhtml",
                                              "x-elf", "java-archive", "x-msi", "mach-binary", "octet-stream"))
    # HTML is listed (issue 31), and, like every type not shown in place, served as a sandboxed attachment.
    assert "text/html" in DEFAULT_ALLOWED_CONTENT_TYPES
    assert not shown_inline("text/html") and needs_sandbox("text/html")


def test_parsing_of_every_kind_of_value() -> None:
    env = {
        "MEDIASRV_DATA_DIR": "/srv/media", "MEDIASRV_PUBLIC_URL": "https://cdn.example.com/",
        "MEDIASRV_SMTP_URL": "smtps://user:pw@mail.example.com:465", "MEDIASRV_MAIL_FROM": "media@example.com",
        "MEDIASRV_JWT_SECRET": "k" * 40, "MEDIASRV_TRIAL_DAYS": " 14 ", "MEDIASRV_STORAGE_LIMIT_BYTES": "1000",
        "MEDIASRV_FILE_COUNT_LIMIT": "0", "MEDIASRV_MAX_UPLOAD_SIZE_BYTES": "5000", "MEDIASRV_TRUST_PROXY": "Yes",
        "MEDIASRV_DOMAIN_PROVIDER": "Cloudflare", "CLOUDFLARE_API_TOKEN": "tok", "CLOUDFLARE_ZONE_ID": "zone",
        "MEDIASRV_CLOUDFLARE_API_URL": "http://127.0.0.1:9/client/v4", "MEDIASRV_RESIZE_SLOTS": "2",
        "MEDIASRV_MAX_IMAGE_PIXELS": "1000000", "MEDIASRV_RATE_LIMIT_SCALE": "2.5",
        "MEDIASRV_ALLOWED_CONTENT_TYPES": " Image/PNG, text/plain ,,", "MEDIASRV_LOG_LEVEL": "debug",
        "MEDIASRV_REDIRECT_ALLOWLIST": "https://app.example.com/, https://other.example.com",
        "MEDIASRV_BCRYPT_ROUNDS": "4", "MEDIASRV_PROXY_SECRET": "p" * 20,
    }
    s = load_settings(env, host="0.0.0.0", port=9000)
    assert s.data_dir == Path("/srv/media")
    assert s.public_url == "https://cdn.example.com"  # no trailing slash: links join cleanly
    assert s.dashboard_url == "https://cdn.example.com/"
    assert s.smtp_url == "smtps://user:pw@mail.example.com:465"
    assert s.trial_days == 14 and s.storage_limit_bytes == 1000 and s.file_count_limit == 0
    assert s.max_upload_size_bytes == 5000 and s.trust_proxy is True
    assert s.domain_provider == "cloudflare" and s.cloudflare_api_url == "http://127.0.0.1:9/client/v4"
    assert s.resize_slots == 2 and s.max_image_pixels == 1_000_000 and s.rate_limit_scale == 2.5
    assert s.allowed_content_types == ("image/png", "text/plain")
    assert s.redirect_allowlist == ("https://app.example.com", "https://other.example.com")
    assert s.log_level == "DEBUG" and (s.host, s.port) == ("0.0.0.0", 9000)


@pytest.mark.parametrize(("text", "value"), [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_booleans(text: str, value: bool) -> None:
    assert Settings.from_env({"MEDIASRV_TRUST_PROXY": text}).trust_proxy is value


def test_empty_values_mean_unset() -> None:
    env = dict.fromkeys(ALL_VARS, "  ")
    s = load_settings(env)
    assert s == load_settings({})


def test_public_url_follows_host_and_port() -> None:
    assert Settings.from_env({}, host="10.1.2.3", port=8443).public_url == "http://10.1.2.3:8443"
    s = load_settings({}, host="::1", port=8080)
    assert s.public_url == "http://[::1]:8080"
    assert Settings.from_env({"MEDIASRV_DASHBOARD_URL": "https://app.example.com/dash"}).dashboard_url == \
        "https://app.example.com/dash"


@pytest.mark.parametrize(("name", "value"), [
    ("MEDIASRV_RESIZE_SLOTS", "abc"), ("MEDIASRV_RESIZE_SLOTS", "0"), ("MEDIASRV_RESIZE_SLOTS", "1.5"),
    ("MEDIASRV_MAX_IMAGE_PIXELS", "-1"), ("MEDIASRV_MAX_UPLOAD_SIZE_BYTES", "0"),
    ("MEDIASRV_TRIAL_DAYS", "-1"), ("MEDIASRV_TRIAL_DAYS", "seven"), ("MEDIASRV_TRIAL_DAYS", "99999999999"),
    ("MEDIASRV_STORAGE_LIMIT_BYTES", "-5"), ("MEDIASRV_FILE_COUNT_LIMIT", "many"),
    ("MEDIASRV_TRUST_PROXY", "maybe"), ("MEDIASRV_DOMAIN_PROVIDER", "nope"),
    ("MEDIASRV_DOMAIN_PROVIDER", "cloudflare"),  # without its token and zone
    ("MEDIASRV_RATE_LIMIT_SCALE", "0"), ("MEDIASRV_RATE_LIMIT_SCALE", "-1"), ("MEDIASRV_RATE_LIMIT_SCALE", "x"),
    ("MEDIASRV_RATE_LIMIT_SCALE", "nan"), ("MEDIASRV_RATE_LIMIT_SCALE", "inf"),
    ("MEDIASRV_BCRYPT_ROUNDS", "3"), ("MEDIASRV_BCRYPT_ROUNDS", "17"),
    ("MEDIASRV_PUBLIC_URL", "ftp://example.com"), ("MEDIASRV_PUBLIC_URL", "example.com"),
    ("MEDIASRV_DASHBOARD_URL", "javascript:alert(1)"),
    ("MEDIASRV_SMTP_URL", "http://mail.example.com"), ("MEDIASRV_SMTP_URL", "smtp://"),
    ("MEDIASRV_SMTP_URL", "smtp://mail.example.com:99999"), ("MEDIASRV_SMTP_URL", "smtp://mail.example.com:x"),
    ("MEDIASRV_LOG_LEVEL", "LOUD"), ("MEDIASRV_ALLOWED_CONTENT_TYPES", "png,jpeg"),
    ("MEDIASRV_ALLOWED_CONTENT_TYPES", ","),
    ("MEDIASRV_MONGODB_URL", "http://localhost"), ("MEDIASRV_S3_BUCKET", "Bad_Bucket"),
    ("MEDIASRV_MONGODB_TIMEOUT_MS", "5"), ("MEDIASRV_S3_ENDPOINT_URL", "ftp://x"),
    ("MEDIASRV_ACCESS_TOKEN_TTL", "0"), ("MEDIASRV_REFRESH_TOKEN_TTL", "999999999999"),
    ("MEDIASRV_SWEEP_GRACE", "-1"), ("MEDIASRV_RESULT_CACHE_BYTES", "-1"),
    ("MEDIASRV_S3_ENDPOINT_URL", "http://127.0.0.1:9000"),
    ("MEDIASRV_PUBLIC_MAX_AGE", "-1"), ("MEDIASRV_PUBLIC_MAX_AGE", "99999999999"),
    ("MEDIASRV_PUBLIC_IMMUTABLE", "sometimes"),
    ("MEDIASRV_S3_MIN_RATE", "100"), ("MEDIASRV_S3_MIN_RATE", "fast"),
    ("MEDIASRV_UPLOAD_BUFFER_BYTES", "1MiB"), ("MEDIASRV_UPLOAD_BUFFER_BYTES", "-1"),
    ("MEDIASRV_UPLOAD_EXPIRY", "59"), ("MEDIASRV_UPLOAD_EXPIRY", "1d"),
])
def test_bad_values_raise_settings_error_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({name: value})
    assert name in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(SettingsError, match="port"):
        load_settings({}, port=port)


def test_cloudflare_with_its_credentials_is_valid() -> None:
    s = load_settings({"MEDIASRV_DOMAIN_PROVIDER": "cloudflare", "CLOUDFLARE_API_TOKEN": "t",
                           "CLOUDFLARE_ZONE_ID": "z"})
    assert s.domain_provider == "cloudflare"


def test_settings_are_frozen() -> None:
    s = Settings.from_env({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.resize_slots = 3  # type: ignore[misc]


def test_help_text_lists_every_variable_once_with_a_description() -> None:
    text = settings_help_text(Settings)
    lines = [line for line in text.splitlines() if line.startswith("  ")]  # others are group headings
    assert len(lines) == len(ALL_VARS)
    for name in ALL_VARS:
        matching = [line for line in lines if line.split()[0] == name]
        assert len(matching) == 1, name
        assert len(matching[0].split(None, 1)[1].strip()) > 5
    contract = {"MEDIASRV_DATA_DIR", "MEDIASRV_PUBLIC_URL", "MEDIASRV_SMTP_URL", "MEDIASRV_MAIL_FROM",
                "MEDIASRV_JWT_SECRET", "MEDIASRV_TRIAL_DAYS", "MEDIASRV_STORAGE_LIMIT_BYTES",
                "MEDIASRV_FILE_COUNT_LIMIT", "MEDIASRV_MAX_UPLOAD_SIZE_BYTES", "MEDIASRV_TRUST_PROXY",
                "MEDIASRV_MONGODB_URL", "MEDIASRV_S3_BUCKET", "MEDIASRV_S3_ENDPOINT_URL",
                "MEDIASRV_DOMAIN_PROVIDER", "CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ZONE_ID",
                "MEDIASRV_CLOUDFLARE_API_URL", "MEDIASRV_RESIZE_SLOTS", "MEDIASRV_MAX_IMAGE_PIXELS",
                "MEDIASRV_RATE_LIMIT_SCALE", "MEDIASRV_ALLOWED_CONTENT_TYPES"}
    assert contract <= ALL_VARS


def test_every_secret_looking_setting_is_marked_secret_and_every_url_masks_its_password() -> None:
    """Issue 25 finding 7: `mediasrv config` printed AWS_SECRET_ACCESS_KEY, MEDIASRV_PROXY_SECRET and
    MEDIASRV_TRANSFORM_KEY because a list apart from the declarations named two secrets only. The
    declarations carry the mark now; a new variable named like a secret cannot be left unmarked."""
    from mediasrv.base.settings.client import ClientSettings
    from mediasrv.base.settings.model import SECRET, URL_WITH_PASSWORD

    identifiers = {"AWS_ACCESS_KEY_ID"}  # shown, as a user name is: which credentials are in use
    links = {"MEDIASRV_PUBLIC_URL", "MEDIASRV_DASHBOARD_URL"}  # in every link anyway: no password there
    for cls in (Settings, ClientSettings):
        for f in dataclasses.fields(cls):
            name = f.metadata["env"]
            if name in identifiers or name in links:
                assert "shown" not in f.metadata, name
            elif name.endswith("_URL"):
                assert f.metadata.get("shown") == URL_WITH_PASSWORD, name
            elif name.rpartition("_")[2] in ("SECRET", "TOKEN", "KEY", "PASSWORD") or "SECRET" in name:
                assert f.metadata.get("shown") == SECRET and not f.repr, name


def test_shown_values_mask_secrets_and_url_passwords() -> None:
    from mediasrv.base.settings.help import shown_value

    s = Settings.from_env({"MEDIASRV_TRANSFORM_KEY": "t" * 40, "MEDIASRV_SMTP_URL": "smtp://u:pw@h:25",
                           "MEDIASRV_S3_ENDPOINT_URL": "http://minio:9000", "MEDIASRV_PROXY_SECRET": "p" * 20})
    assert shown_value(s, "transform_key") == shown_value(s, "proxy_secret") == "********"
    assert shown_value(s, "smtp_url") == "smtp://u:********@h:25"
    assert shown_value(s, "s3_endpoint_url") == "http://minio:9000"  # no password: as it is
    assert shown_value(s, "jwt_secret") == ""  # unset
    assert "t" * 40 not in repr(s) and "p" * 20 not in repr(s)
    # A URL Python cannot split (a port that is no number) shows nothing rather than its password.
    bad = dataclasses.replace(s, smtp_url="smtp://u:pw@h:x[")
    assert "pw" not in shown_value(bad, "smtp_url")


# ---------------------------------------------------------------------------- timeutil

def test_iso_has_millisecond_precision_and_z() -> None:
    t = dt.datetime(2024, 2, 3, 4, 5, 6, 789_999, tzinfo=UTC)
    assert iso(t) == "2024-02-03T04:05:06.789Z"  # truncated, not rounded
    assert iso(dt.datetime(2024, 2, 3, 4, 5, 6, tzinfo=UTC)) == "2024-02-03T04:05:06.000Z"
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert iso(dt.datetime(2024, 1, 1, 1, 0, 0, 5000, tzinfo=plus2)) == "2023-12-31T23:00:00.005Z"


def test_now_is_utc_and_truncated_to_milliseconds() -> None:
    t = now()
    assert t.tzinfo is not None and t.utcoffset() == dt.timedelta(0)
    assert t.microsecond % 1000 == 0
    assert abs(t - dt.datetime.now(UTC)) < dt.timedelta(seconds=5)
    text = now_iso()
    assert len(text) == 24 and text.endswith("Z") and text[19] == "."
    assert iso(parse_iso(text)) == text


def test_now_iso_writes_what_iso_writes_for_the_same_instant_across_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    # now_iso keeps the current second's text: it must follow the clock into the next second,
    # the next day and back (a clock set back), and truncate the milliseconds as iso does.
    from mediasrv.base import timeutil

    nanos = [1_700_000_000_999_999_999, 1_700_000_001_000_000_000, 1_700_000_001_250_400_000,
             1_700_006_399_999_000_000, 1_700_006_400_001_000_000, 1_699_999_999_500_000_000,
             1_735_689_599_999_999_000, 1_735_689_600_000_000_000]
    for stamp in nanos:
        monkeypatch.setattr(timeutil.time, "time_ns", lambda stamp=stamp: stamp)
        whole, nanos_left = divmod(stamp, 10**9)
        expected = iso(dt.datetime.fromtimestamp(whole, UTC) + dt.timedelta(microseconds=nanos_left // 1000))
        assert timeutil.now_iso() == expected, stamp


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-05-06T07:08:09.123Z", dt.datetime(2024, 5, 6, 7, 8, 9, 123_000, tzinfo=UTC)),
    ("2024-05-06T07:08:09.123z", dt.datetime(2024, 5, 6, 7, 8, 9, 123_000, tzinfo=UTC)),
    ("2024-05-06T07:08:09Z", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    ("2024-05-06T07:08:09.123456+00:00", dt.datetime(2024, 5, 6, 7, 8, 9, 123_456, tzinfo=UTC)),
    ("2024-05-06T09:08:09+02:00", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    ("2024-05-06T02:08:09-05:00", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    ("2024-05-06T07:08:09", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),  # naive: UTC
    ("2024-05-06", dt.datetime(2024, 5, 6, tzinfo=UTC)),
    ("  2024-05-06T07:08:09.5Z ", dt.datetime(2024, 5, 6, 7, 8, 9, 500_000, tzinfo=UTC)),
    ("2024-05-06 07:08:09Z", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
])
def test_parse_iso_variants(text: str, expected: dt.datetime) -> None:
    parsed = parse_iso(text)
    assert parsed == expected
    assert parsed.utcoffset() == dt.timedelta(0)


@pytest.mark.parametrize("text", ["", "   ", "yesterday", "2024-13-01", "2024-02-30T00:00:00Z", "Z",
                                  "2024-05-06T25:00:00Z", "2" * 65, "2024-05-06T07:08:09+25:00"])
def test_parse_iso_refuses_garbage_with_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso(text)


def test_stored_timestamps_round_trip_and_sort_as_text() -> None:
    stamps = [iso(dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=ms))
              for ms in (0, 1, 999, 1000, 59_999, 86_400_000, 31_622_400_000)]
    assert stamps == sorted(stamps)
    for text in stamps:
        assert iso(parse_iso(text)) == text


@pytest.mark.parametrize(("t", "start", "end"), [
    (dt.datetime(2024, 12, 15, 10, tzinfo=UTC), dt.datetime(2024, 12, 1, tzinfo=UTC),
     dt.datetime(2025, 1, 1, tzinfo=UTC)),
    (dt.datetime(2024, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), dt.datetime(2024, 12, 1, tzinfo=UTC),
     dt.datetime(2025, 1, 1, tzinfo=UTC)),
    (dt.datetime(2025, 1, 1, tzinfo=UTC), dt.datetime(2025, 1, 1, tzinfo=UTC), dt.datetime(2025, 2, 1, tzinfo=UTC)),
    (dt.datetime(2024, 2, 29, 12, tzinfo=UTC), dt.datetime(2024, 2, 1, tzinfo=UTC),
     dt.datetime(2024, 3, 1, tzinfo=UTC)),
    # 00:30 on 1 January in UTC+1 is still December in UTC.
    (dt.datetime(2025, 1, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=1))),
     dt.datetime(2024, 12, 1, tzinfo=UTC), dt.datetime(2025, 1, 1, tzinfo=UTC)),
])
def test_month_period(t: dt.datetime, start: dt.datetime, end: dt.datetime) -> None:
    assert month_period(t) == (start, end)
    assert period_key(t) == start.strftime("%Y-%m")


def test_month_period_of_now_contains_now() -> None:
    start, end = month_period()
    assert start <= dt.datetime.now(UTC) < end + dt.timedelta(seconds=1)
    assert start.day == 1 and (start.hour, start.minute, start.second, start.microsecond) == (0, 0, 0, 0)
    assert period_key() == start.strftime("%Y-%m")
    assert iso(end).endswith("-01T00:00:00.000Z")


# ---------------------------------------------------------------------------- recorders

class FlakyMeta:
    """A stand-in MetaStore for the three buffered writes: fails the first ``failures`` calls."""

    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.usage: list[dict[tuple[str, str], UsageCounts]] = []
        self.batch_ids: list[str | None] = []
        self.logs: list[list[LogEntry]] = []
        self.touched: list[dict[str, str]] = []
        self.during_call: Any = None

    async def _maybe_fail(self) -> None:
        await asyncio.sleep(0)
        if self.during_call:
            self.during_call()
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("store down")

    async def add_usage(self, deltas: dict[tuple[str, str], UsageCounts], *, batch_id: str | None = None) -> None:
        self.batch_ids.append(batch_id)
        await self._maybe_fail()
        self.usage.append(dict(deltas))

    async def insert_logs(self, entries: list[LogEntry]) -> None:
        await self._maybe_fail()
        self.logs.append(list(entries))

    async def touch_api_keys(self, last_used: dict[str, str]) -> None:
        await self._maybe_fail()
        self.touched.append(dict(last_used))


def entry(n: int) -> LogEntry:
    return LogEntry(id=f"id-{n}", user_id="u", method="GET", path="/usage", status_code=200,
                    request_size_bytes=None, created_at=f"2024-01-01T00:00:{n:02d}.000Z")


def months(batch: dict[tuple[str, str], UsageCounts]) -> dict[tuple[str, str], UsageCounts]:
    return {key: counts for key, counts in batch.items() if len(key[1]) == len("YYYY-MM")}


def sum_days(batch: dict[tuple[str, str], UsageCounts]) -> dict[tuple[str, str], UsageCounts]:
    """The days' counters of a batch added up per month (a flush may straddle midnight)."""
    out: dict[tuple[str, str], UsageCounts] = {}
    for (user_id, day), c in batch.items():
        if len(day) == len("YYYY-MM-DD"):
            was = out.get((user_id, day[:7]), UsageCounts())
            out[(user_id, day[:7])] = UsageCounts(was.origin_reads + c.origin_reads, was.image_ops + c.image_ops,
                                                  was.api_requests + c.api_requests)
    return out


async def test_usage_flush_resends_a_failed_batch_whole_with_its_id() -> None:
    """A failed batch may have been applied (its reply lost): it is sent again unchanged, with
    the same id, so the store can count it once; newer counts wait for the next batch."""
    rec = UsageRecorder()
    meta = FlakyMeta(failures=1)
    for _ in range(3):
        rec.origin_read("alice")
    rec.image_op("alice")
    rec.origin_read("bob")
    meta.during_call = lambda: rec.origin_read("alice")  # a read counted while the write is in flight
    with pytest.raises(ConnectionError):
        await rec.flush(meta)  # type: ignore[arg-type]
    meta.during_call = None
    assert meta.usage == [] and rec.pending() == 6
    await rec.flush(meta)  # type: ignore[arg-type]
    assert months(meta.usage[0]) == {("alice", period_key()): UsageCounts(origin_reads=3, image_ops=1),
                                     ("bob", period_key()): UsageCounts(origin_reads=1, image_ops=0)}
    assert sum_days(meta.usage[0]) == months(meta.usage[0])  # each day's counts, and its month's
    assert meta.batch_ids[0] == meta.batch_ids[1] is not None  # resent under its id
    await rec.flush(meta)  # type: ignore[arg-type]
    assert [months(batch) for batch in meta.usage[1:]] == [{("alice", period_key()): UsageCounts(origin_reads=1)}]
    assert meta.batch_ids[2] != meta.batch_ids[1]
    await rec.flush(meta)  # type: ignore[arg-type]
    assert len(meta.usage) == 2 and rec.pending() == 0  # nothing left: no empty write


async def test_activity_flush_requeues_in_order() -> None:
    rec = ActivityRecorder()
    meta = FlakyMeta(failures=2)
    rec.add(entry(1))
    rec.add(entry(2))
    meta.during_call = lambda: rec.add(entry(3))
    with pytest.raises(ConnectionError):
        await rec.flush(meta)  # type: ignore[arg-type]
    meta.during_call = None
    with pytest.raises(ConnectionError):
        await rec.flush(meta)  # type: ignore[arg-type]
    await rec.flush(meta)  # type: ignore[arg-type]
    assert [[e.id for e in batch] for batch in meta.logs] == [["id-1", "id-2", "id-3"]]
    await rec.flush(meta)  # type: ignore[arg-type]
    assert len(meta.logs) == 1


def test_activity_buffer_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorders, "MAX_PENDING_LOGS", 5)
    rec = ActivityRecorder()
    for n in range(10):
        rec.add(entry(n))
    assert len(rec._pending) == 5
    assert [e.id for e in rec._pending] == [f"id-{n}" for n in range(5)]


async def test_key_usage_flush_requeues_without_losing_a_newer_use() -> None:
    rec = KeyUsageRecorder()
    meta = FlakyMeta(failures=1)
    rec.used("k1")
    rec.used("k2")
    first = dict(rec._last)
    newer = "2999-01-01T00:00:00.000Z"

    def newer_use() -> None:
        rec._last["k1"] = newer  # k1 used again while the failed write was in flight

    meta.during_call = newer_use
    with pytest.raises(ConnectionError):
        await rec.flush(meta)  # type: ignore[arg-type]
    meta.during_call = None
    await rec.flush(meta)  # type: ignore[arg-type]
    assert meta.touched == [{"k1": newer, "k2": first["k2"]}]


async def test_flusher_keeps_going_when_one_step_fails_and_flushes_at_stop() -> None:
    usage, activity, keys = UsageRecorder(), ActivityRecorder(), KeyUsageRecorder()
    meta = FlakyMeta(failures=1)  # only the first write (usage) fails
    flusher = Flusher(meta, [usage.flush, activity.flush, keys.flush], interval_s=0.05)  # type: ignore[arg-type]
    usage.origin_read("u")
    activity.add(entry(1))
    keys.used("k")
    await flusher.flush_now()  # usage fails and is kept; the others are written
    assert meta.usage == [] and len(meta.logs) == 1 and len(meta.touched) == 1
    flusher.start()
    await asyncio.sleep(0.2)  # the periodic loop retries
    assert [months(batch) for batch in meta.usage] == [{("u", period_key()): UsageCounts(origin_reads=1)}]
    activity.add(entry(2))
    await flusher.stop()  # cancels the loop and flushes once more
    assert [e.id for batch in meta.logs for e in batch] == ["id-1", "id-2"]
    await flusher.stop()  # idempotent


async def test_two_flushes_at_once_send_a_batch_once() -> None:
    """A flush started while the periodic one waits on the store does not send the same
    counts again (the SQLite store does not deduplicate batches: 2 requests counted as 4)."""
    class SlowMeta:
        def __init__(self) -> None:
            self.sent: list[dict[Any, UsageCounts]] = []
            self.release = asyncio.Event()

        async def add_usage(self, deltas: dict[Any, UsageCounts], *, batch_id: str | None = None) -> None:
            self.sent.append(deltas)
            await self.release.wait()

    usage, meta = UsageRecorder(), SlowMeta()
    flusher = Flusher(meta, [usage.flush])  # type: ignore[arg-type]
    usage.api_request("u")
    usage.api_request("u")
    first = asyncio.ensure_future(flusher.flush_now())
    await asyncio.sleep(0)  # the first flush is waiting on the store
    second = asyncio.ensure_future(flusher.flush_now())
    await asyncio.sleep(0)
    meta.release.set()
    await asyncio.gather(first, second)
    assert len(meta.sent) == 1
    assert sum(c.api_requests for (_, day), c in meta.sent[0].items() if len(day) == 10) == 2


# ---------------------------------------------------------------------------- the JWT secret file

def test_secret_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path / "new" / "dir")})
    first = load_secret(settings)
    path = settings.data_dir / "jwt_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 32 and path.read_text() == first
    assert load_secret(settings) == first
    assert sorted(p.name for p in settings.data_dir.iterdir()) == ["jwt_secret"]  # no temp file left


def test_explicit_secret_wins_and_writes_nothing(tmp_path: Path) -> None:
    settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path), "MEDIASRV_JWT_SECRET": "s" * 40})
    assert load_secret(settings) == "s" * 40
    assert not (tmp_path / "jwt_secret").exists()


@pytest.mark.parametrize("content", ["", "\n", "short"])
def test_an_unusable_secret_file_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / "jwt_secret").write_text(content)
    with pytest.raises(StartupError, match="jwt_secret"):
        load_secret(Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)}))


def test_a_readable_secret_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "jwt_secret"
    path.write_text("k" * 50 + "\n")
    path.chmod(0o644)
    assert load_secret(Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)})) == "k" * 50
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_row_ids_are_unique_version_7_uuids_that_start_with_their_millisecond() -> None:
    """Time-ordered row ids (``row_id``): a new row's key lands on the index's last page."""
    before = time.time_ns() // 1_000_000
    ids = [row_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(i) for i in ids]
    assert {(u.version, u.variant) for u in parsed} == {(7, uuid.RFC_4122)}
    stamps = [u.int >> 80 for u in parsed]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= after
