"""The start-up checks of ``Settings``: ranges, combinations and formats, each a function that
returns a one-line problem or None (``Settings.validate`` runs them in order and raises the
first). Apart from the declarations so that each file stays one concept."""
from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from urllib.parse import urlsplit

from mediasrv.base.settings.model import (
    HOUSEKEEPING_ROLES,
    LOG_FORMATS,
    MAX_PUBLIC_MAX_AGE_S,
    MAX_RATE_LIMIT_SCALE,
    MAX_TRIAL_DAYS,
    MAX_TTL_S,
    MAX_UNIX_SOCKET_PATH,
    MIN_UPLOAD_BUFFER_BYTES,
    REGISTRATION_MODES,
    TRANSFORM_FORMATS,
    Settings,
)


def parse_nameserver(entry: str) -> tuple[str, int]:
    """``1.2.3.4``, ``1.2.3.4:5353``, ``::1`` or ``[::1]:5353`` as (address, port); ValueError otherwise."""
    text = entry.strip()
    port = 53
    if text.startswith("["):
        address, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"{entry!r} is not an address[:port]")
            port = int(rest[1:])
    elif text.count(":") == 1:
        address, _, port_text = text.partition(":")
        port = int(port_text)
    else:
        address = text
    ipaddress.ip_address(address)  # ValueError when it is not an IP address
    if not 1 <= port <= 65535:
        raise ValueError(f"{entry!r}: port must be 1..65535")
    return address, port


def _check_urls(s: Settings) -> str | None:
    if s.accel_redirect and not (s.accel_redirect.startswith("/") and s.accel_redirect.endswith("/")
                                 and s.accel_redirect.isascii() and " " not in s.accel_redirect):
        return f"MEDIASRV_ACCEL_REDIRECT={s.accel_redirect!r}: must be a location prefix such as /_blobs/"
    for name, url in (("MEDIASRV_PUBLIC_URL", s.public_url), ("MEDIASRV_DASHBOARD_URL", s.dashboard_url)):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return f"{name}={url!r}: must be an http(s) URL"
    for origin in s.cors_origins:
        parts = urlsplit(origin)
        if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc
                              or parts.path or parts.query or parts.fragment or "@" in parts.netloc):
            return f"MEDIASRV_CORS_ORIGINS: {origin!r} is not an origin such as https://app.example.com, nor *"
    if s.smtp_url:
        smtp = urlsplit(s.smtp_url)
        if smtp.scheme not in ("smtp", "smtps"):
            return f"MEDIASRV_SMTP_URL: scheme must be smtp or smtps, not {smtp.scheme!r}"
        try:
            port = smtp.port
        except ValueError:  # not a number, or out of range
            port = -1
        if port is not None and not 1 <= port <= 65535:
            return "MEDIASRV_SMTP_URL: the port must be a number from 1 to 65535"
        if not smtp.hostname:
            return "MEDIASRV_SMTP_URL: a host is required, as in smtp://host:port"
    return None


def _check_numbers(s: Settings) -> str | None:
    positive = {"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": s.max_upload_size_bytes,
                "MEDIASRV_RESIZE_SLOTS": s.resize_slots, "MEDIASRV_MAX_IMAGE_PIXELS": s.max_image_pixels,
                "MEDIASRV_ACCESS_TOKEN_TTL": s.access_token_ttl_s,
                "MEDIASRV_REFRESH_TOKEN_TTL": s.refresh_token_ttl_s}
    optional = {"MEDIASRV_TRIAL_DAYS": s.trial_days, "MEDIASRV_STORAGE_LIMIT_BYTES": s.storage_limit_bytes,
                "MEDIASRV_FILE_COUNT_LIMIT": s.file_count_limit}
    if not 1 <= s.port <= 65535:
        return f"the port (--port or MEDIASRV_PORT) must be from 1 to 65535, not {s.port}"
    for name, value in positive.items():
        if value < 1:
            return f"{name} must be a positive integer, not {value}"
    for name, optional_value in optional.items():
        if optional_value is not None and optional_value < 0:
            return f"{name} must be 0 or more, not {optional_value}"
    # Beyond these, dates computed from the value overflow (a 500 at registration or login).
    if s.trial_days is not None and s.trial_days > MAX_TRIAL_DAYS:
        return f"MEDIASRV_TRIAL_DAYS must be at most {MAX_TRIAL_DAYS}, not {s.trial_days}"
    for name, value in (("MEDIASRV_ACCESS_TOKEN_TTL", s.access_token_ttl_s),
                        ("MEDIASRV_REFRESH_TOKEN_TTL", s.refresh_token_ttl_s)):
        if value > MAX_TTL_S:
            return f"{name} must be at most {MAX_TTL_S} seconds, not {value}"
    if not 4 <= s.bcrypt_rounds <= 16:
        return f"MEDIASRV_BCRYPT_ROUNDS must be between 4 and 16, not {s.bcrypt_rounds}"
    if not (math.isfinite(s.rate_limit_scale) and 0 < s.rate_limit_scale <= MAX_RATE_LIMIT_SCALE):
        return (f"MEDIASRV_RATE_LIMIT_SCALE must be a positive number of at most {MAX_RATE_LIMIT_SCALE:.0f}, "
                f"not {s.rate_limit_scale}")
    if not 0 <= s.public_max_age_s <= MAX_PUBLIC_MAX_AGE_S:
        return f"MEDIASRV_PUBLIC_MAX_AGE must be from 0 to {MAX_PUBLIC_MAX_AGE_S} seconds, not {s.public_max_age_s}"
    if s.image_memory_bytes < 64 * 1024 * 1024:
        return f"MEDIASRV_IMAGE_MEMORY_BYTES must be at least 67108864 (64 MiB), not {s.image_memory_bytes}"
    if s.upload_buffer_bytes < MIN_UPLOAD_BUFFER_BYTES:
        return (f"MEDIASRV_UPLOAD_BUFFER_BYTES must be at least {MIN_UPLOAD_BUFFER_BYTES} (16 MiB: one upload "
                f"to S3 holds about 10 MiB), not {s.upload_buffer_bytes}")
    if s.upload_expiry_s < 60:
        return f"MEDIASRV_UPLOAD_EXPIRY must be at least 60 seconds, not {s.upload_expiry_s}"
    if s.resize_retry_after is not None and not 1 <= s.resize_retry_after <= 30:
        return f"MEDIASRV_RESIZE_RETRY_AFTER must be auto or 1..30 seconds, not {s.resize_retry_after}"
    if s.result_cache_bytes < 0 or s.sweep_grace_s < 0:
        return "MEDIASRV_RESULT_CACHE_BYTES and MEDIASRV_SWEEP_GRACE must be 0 or more"
    if not 0 <= s.credential_cache_s <= 60:
        return f"MEDIASRV_CREDENTIAL_CACHE_TTL must be 0..60 seconds, not {s.credential_cache_s}"
    if min(s.blob_cache_bytes, s.blob_cache_item_bytes, s.resize_threads) < 0:
        return ("MEDIASRV_BLOB_CACHE_BYTES, MEDIASRV_BLOB_CACHE_ITEM_BYTES and MEDIASRV_RESIZE_THREADS "
                "must be 0 or more")
    return _check_safety(s)


def _check_safety(s: Settings) -> str | None:
    """Sweep, proxy and connection bounds."""
    if not (math.isfinite(s.sweep_max_share) and 0 <= s.sweep_max_share <= 1):
        return f"MEDIASRV_SWEEP_MAX_SHARE must be a share from 0 to 1, not {s.sweep_max_share}"
    if s.quarantine_grace_s < 0:
        return f"MEDIASRV_QUARANTINE_GRACE must be 0 or more, not {s.quarantine_grace_s}"
    if not 1 <= s.proxy_hops <= 32:
        return f"MEDIASRV_PROXY_HOPS must be from 1 to 32, not {s.proxy_hops}"
    if s.proxy_secret is not None and not re.fullmatch(r"[A-Za-z0-9._~-]{16,256}", s.proxy_secret):
        return ("MEDIASRV_PROXY_SECRET must be 16 to 256 letters, digits or ._~- (it goes into an HTTP "
                "header and nginx's configuration as it is)")
    for name, value in (("MEDIASRV_HEADER_TIMEOUT", s.header_timeout_s),
                        ("MEDIASRV_BODY_IDLE_TIMEOUT", s.body_idle_timeout_s),
                        ("MEDIASRV_BUFFERED_BODY_TIMEOUT", s.buffered_body_timeout_s)):
        if not (math.isfinite(value) and 0 < value <= 86400):
            return f"{name} must be a number of seconds above 0 and at most 86400, not {value}"
    if s.max_connections is not None and s.max_connections < 1:
        return f"MEDIASRV_MAX_CONNECTIONS must be a positive integer, not {s.max_connections}"
    if s.max_connections_per_ip < 1:
        return f"MEDIASRV_MAX_CONNECTIONS_PER_IP must be a positive integer, not {s.max_connections_per_ip}"
    for name, value, least in (("MEDIASRV_HOUSEKEEPING_LEASE", s.housekeeping_lease_s, 3),
                               ("MEDIASRV_RECONCILE_INTERVAL", s.reconcile_interval_s, 1),
                               ("MEDIASRV_RESERVATION_TTL", s.reservation_ttl_s, 10)):
        if not least <= value <= 86400:
            return f"{name} must be from {least} to 86400 seconds, not {value}"
    if s.max_uploads_per_user < 1:
        return f"MEDIASRV_MAX_UPLOADS_PER_USER must be a positive integer, not {s.max_uploads_per_user}"
    return None


def _check_choices(s: Settings) -> str | None:
    if s.domain_provider not in ("manual", "cloudflare"):
        return f"MEDIASRV_DOMAIN_PROVIDER must be manual or cloudflare, not {s.domain_provider!r}"
    if s.domain_provider == "cloudflare" and not (s.cloudflare_api_token and s.cloudflare_zone_id):
        return "MEDIASRV_DOMAIN_PROVIDER=cloudflare needs CLOUDFLARE_API_TOKEN and CLOUDFLARE_ZONE_ID"
    if s.registration not in REGISTRATION_MODES:
        return f"MEDIASRV_REGISTRATION must be one of {', '.join(REGISTRATION_MODES)}, not {s.registration!r}"
    if s.housekeeping not in HOUSEKEEPING_ROLES:
        return f"MEDIASRV_HOUSEKEEPING must be full, sweep or none, not {s.housekeeping!r}"
    if s.domain_verification not in ("dns", "none"):
        return f"MEDIASRV_DOMAIN_VERIFICATION must be dns or none, not {s.domain_verification!r}"
    for entry in s.dns_nameservers:
        try:
            parse_nameserver(entry)
        except ValueError:
            return f"MEDIASRV_DNS_NAMESERVERS: {entry!r} is not an IP address with an optional :port"
    if s.metrics_port is not None and not 1 <= s.metrics_port <= 65535:
        return f"MEDIASRV_METRICS_PORT must be from 1 to 65535, not {s.metrics_port}"
    if not s.metrics_host:
        return "MEDIASRV_METRICS_HOST must be an address to listen on, such as 127.0.0.1 or 0.0.0.0"
    if s.metrics_socket is not None and len(str(s.metrics_socket).encode()) > MAX_UNIX_SOCKET_PATH:
        return f"MEDIASRV_METRICS_SOCKET must be at most {MAX_UNIX_SOCKET_PATH} bytes long (a Unix socket path)"
    if s.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        return f"MEDIASRV_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, not {s.log_level!r}"
    if s.log_format not in LOG_FORMATS:
        return f"MEDIASRV_LOG_FORMAT must be text or json, not {s.log_format!r}"
    if not s.allowed_content_types or any("/" not in t for t in s.allowed_content_types):
        return "MEDIASRV_ALLOWED_CONTENT_TYPES must list MIME types such as image/png"
    return None


def _check_transforms(s: Settings) -> str | None:
    """The strict-transform lists and key (MEDIASRV_ALLOWED_*, MEDIASRV_TRANSFORM_KEY)."""
    for name, values, top in (("MEDIASRV_ALLOWED_WIDTHS", s.allowed_widths, 8192),
                              ("MEDIASRV_ALLOWED_HEIGHTS", s.allowed_heights, 8192),
                              ("MEDIASRV_ALLOWED_QUALITIES", s.allowed_qualities, 100)):
        if any(not 1 <= v <= top for v in values):
            return f"{name} must list integers from 1 to {top}"
    unknown = [f for f in s.allowed_formats if f not in TRANSFORM_FORMATS]
    if unknown:
        return f"MEDIASRV_ALLOWED_FORMATS: {', '.join(unknown)} is not one of {', '.join(TRANSFORM_FORMATS)}"
    if not 1 <= s.max_animation_frames <= 100_000:
        return "MEDIASRV_MAX_ANIMATION_FRAMES must be from 1 to 100000"
    if s.transform_key is not None and len(s.transform_key) < 32:
        return "MEDIASRV_TRANSFORM_KEY must be at least 32 characters"
    return None


def _check_backends(s: Settings) -> str | None:
    if s.mongodb_url is not None:
        if urlsplit(s.mongodb_url).scheme not in ("mongodb", "mongodb+srv"):
            return "MEDIASRV_MONGODB_URL must start with mongodb:// or mongodb+srv://"
        database = urlsplit(s.mongodb_url).path.lstrip("/")
        if database and not re.fullmatch(r"[A-Za-z0-9_-]{1,63}", database):
            return f"MEDIASRV_MONGODB_URL: database name {database!r} must be letters, digits, _ or -"
    if not 100 <= s.mongodb_timeout_ms <= 60_000:
        return f"MEDIASRV_MONGODB_TIMEOUT_MS must be from 100 to 60000, not {s.mongodb_timeout_ms}"
    if s.s3_endpoint_url and not s.s3_bucket:
        return ("MEDIASRV_S3_ENDPOINT_URL is set without MEDIASRV_S3_BUCKET: set the bucket too, "
                "or unset the endpoint to keep blobs in files")
    if s.s3_bucket is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", s.s3_bucket):
        return f"MEDIASRV_S3_BUCKET={s.s3_bucket!r}: not a valid bucket name (3-63 of a-z 0-9 . -)"
    if s.s3_endpoint_url:
        parts = urlsplit(s.s3_endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return f"MEDIASRV_S3_ENDPOINT_URL={s.s3_endpoint_url!r}: must be an http(s) URL"
    if bool(s.s3_access_key_id) != bool(s.s3_secret_access_key):
        return "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together"
    if not math.isfinite(s.s3_timeout_s) or not 0.1 <= s.s3_timeout_s <= 300:
        return f"MEDIASRV_S3_TIMEOUT must be from 0.1 to 300 seconds, not {s.s3_timeout_s}"
    if s.s3_min_rate_bytes < 1024:
        return f"MEDIASRV_S3_MIN_RATE must be at least 1024 (1 KiB) bytes per second, not {s.s3_min_rate_bytes}"
    return None


def _check_webhooks(s: Settings) -> str | None:
    if s.webhook_concurrency < 1 or s.webhook_per_endpoint < 1:
        return "MEDIASRV_WEBHOOK_CONCURRENCY and MEDIASRV_WEBHOOK_PER_ENDPOINT must be at least 1"
    if s.webhook_claim_s < 15:
        return ("MEDIASRV_WEBHOOK_CLAIM must be at least 15 seconds: a delivery takes up to 10, and no "
                "other process may take it meanwhile")
    return None


CHECKS: tuple[Callable[[Settings], str | None], ...] = (
    _check_urls, _check_numbers, _check_choices, _check_transforms, _check_backends, _check_webhooks)
