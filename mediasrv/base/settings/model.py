"""One frozen settings object, built from the MEDIASRV_* environment and documented once.

Every field names its environment variable and a one-line description; ``mediasrv serve
--help`` prints them from here. Nothing else in the project reads ``os.environ``.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mediasrv.base.settings.values import (
    boolean,
    byte_size,
    number,
    rate_limits,
    whole_number,
)

DEFAULT_ALLOWED_CONTENT_TYPES: tuple[str, ...] = (
    # images (SVG is served as an attachment under the sandbox CSP: it may carry scripts)
    "image/jpeg", "image/png", "image/gif", "image/webp", "image/avif", "image/heic", "image/heif",
    "image/tiff", "image/bmp", "image/svg+xml", "image/x-icon",
    # video and audio
    "video/mp4", "video/webm", "video/quicktime", "video/ogg", "video/x-matroska", "video/x-msvideo",
    "audio/mpeg", "audio/ogg", "audio/wav", "audio/webm", "audio/aac", "audio/flac", "audio/mp4",
    # documents: PDF and text; Office, OpenDocument and EPUB files; HTML, as an attachment under the sandbox CSP
    "application/pdf", "text/plain", "text/csv", "text/markdown", "application/json", "application/rtf",
    "text/html",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
    "application/vnd.oasis.opendocument.text", "application/vnd.oasis.opendocument.spreadsheet",
    "application/vnd.oasis.opendocument.presentation", "application/vnd.oasis.opendocument.graphics",
    "application/epub+zip",
    # archives
    "application/zip", "application/gzip", "application/x-tar", "application/x-7z-compressed",
    "application/vnd.rar", "application/x-bzip2", "application/x-xz", "application/zstd",
)
"""What a self-hosted file host accepts out of the box (issue 31): media, documents and
archives. Nothing here runs on the service's origin: every type but raster media, PDF and
plain text is served as an attachment under ``Content-Security-Policy: sandbox``
(``mediasrv.core.files.content_types.shown_inline``, ``needs_sandbox``); JavaScript is not
listed. Executables are never accepted (``content_types.NEVER_ALLOWED``), whatever the list says."""
CLOUDFLARE_API_URL = "https://api.cloudflare.com/client/v4"
MAX_TRIAL_DAYS = 36_500
MAX_TTL_S = 10 * 366 * 86400
MAX_PUBLIC_MAX_AGE_S = 365 * 86400
MAX_RATE_LIMIT_SCALE = 1_000_000.0
"""MEDIASRV_RATE_LIMIT_SCALE's ceiling: with it the largest limit (``setting_values.MAX_RATE_LIMIT``
times this) stays an exact integer everywhere a limit is published or counted."""
HOUSEKEEPING_ROLES = ("full", "sweep", "none")
"""MEDIASRV_HOUSEKEEPING: what one process does besides serving (see ``Settings.housekeeping``)."""
REGISTRATION_MODES = ("auto", "open", "invite", "closed")
"""MEDIASRV_REGISTRATION: who may create an account through POST /auth/register."""
LOG_FORMATS = ("text", "json")
MIN_UPLOAD_BUFFER_BYTES = 16 * 1024 * 1024
"""MEDIASRV_UPLOAD_BUFFER_BYTES below this would refuse every large upload to S3 (about 10 MiB each)."""
MAX_UNIX_SOCKET_PATH = 107
"""sun_path holds 108 bytes with the terminating NUL (Linux)."""
OTHER_NAMES = frozenset({"MEDIASRV_WORKERS", "MEDIASRV_NGINX_WORKERS", "MEDIASRV_NGINX_RESOLVER",
                         "MEDIASRV_NGINX_REAL_IP_FROM", "MEDIASRV_NGINX_CACHE", "MEDIASRV_SERVE_CMD",
                         "MEDIASRV_RUN_DIR"})
"""MEDIASRV_* variables read by the nginx sidecar (`mediasrv sidecar`), supervisord.conf and CI, not by
``Settings``: known, so not warned about. ``MEDIASRV_TEST_*`` belong to the test suite."""


class SettingsError(ValueError):
    """A setting has a value the server cannot run with; the message names the variable."""


SECRET, URL_WITH_PASSWORD = "secret", "url"
"""``Field.metadata["shown"]`` of a setting an operator never sees in clear: a secret (masked
whole) or a URL that may carry a password in its user-info (the password masked). The one list
of what is secret: ``mediasrv config`` and the start-up log show values through ``shown``."""


def _env(name: str, help_text: str, *, shown: str | None = None, **kw: Any) -> Any:
    """A field read from variable ``name``; ``shown=SECRET`` or ``URL_WITH_PASSWORD`` marks
    what is masked wherever a value is shown (and keeps it out of ``repr``)."""
    metadata = {"env": name, "help": help_text}
    if shown is not None:
        metadata["shown"] = shown
        kw.setdefault("repr", False)
    return field(metadata=metadata, **kw)


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in value.split(",") if part.strip())


def _int_csv(value: str) -> tuple[int, ...]:
    return tuple(sorted({whole_number(part) for part in _csv(value)}))


TRANSFORM_FORMATS = ("jpeg", "png", "webp", "avif", "gif", "auto")
"""``format`` values a transform may name (jpg is jpeg); MEDIASRV_ALLOWED_FORMATS lists some of them."""


def _formats(value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys("jpeg" if f == "jpg" else f for f in _csv(value)))


@dataclass(frozen=True)
class Settings:
    """The server's whole configuration. Build with ``from_env``; check with ``validate``."""

    host: str = _env("MEDIASRV_HOST", "address to listen on (--host wins)", default="127.0.0.1")
    port: int = _env("MEDIASRV_PORT", "port to listen on (--port wins)", default=8080)
    data_dir: Path = _env("MEDIASRV_DATA_DIR", "embedded metadata database and blob files",
                          default=Path("./data"))
    # MongoDB metadata (instead of SQLite in DATA_DIR)
    mongodb_url: str | None = _env("MEDIASRV_MONGODB_URL", "mongodb://[user:pass@]host[:port]/[db][?opts]: "
                                   "metadata in MongoDB (database from the path, default mediasrv)",
                                   default=None, shown=URL_WITH_PASSWORD)
    mongodb_timeout_ms: int = _env("MEDIASRV_MONGODB_TIMEOUT_MS", "MongoDB server selection, connect and "
                                   "per-operation timeout, ms", default=3000)
    # S3 blobs (instead of files in DATA_DIR)
    s3_bucket: str | None = _env("MEDIASRV_S3_BUCKET", "blobs in this S3 bucket (created if missing) "
                                 "instead of files", default=None)
    s3_endpoint_url: str | None = _env("MEDIASRV_S3_ENDPOINT_URL", "S3-compatible endpoint such as "
                                       "MinIO, Ceph RGW, R2 (default: AWS)", default=None, shown=URL_WITH_PASSWORD)
    s3_region: str = _env("AWS_REGION", "S3 region", default="us-east-1")
    s3_access_key_id: str | None = _env("AWS_ACCESS_KEY_ID", "S3 access key (unset: the AWS default "
                                        "credential chain)", default=None)
    s3_secret_access_key: str | None = _env("AWS_SECRET_ACCESS_KEY", "S3 secret key", default=None, shown=SECRET)
    s3_session_token: str | None = _env("AWS_SESSION_TOKEN", "S3 session token (temporary credentials)",
                                        default=None, shown=SECRET)
    s3_timeout_s: float = _env("MEDIASRV_S3_TIMEOUT", "total deadline of each S3 call (retry included), "
                               "seconds, plus the time its bytes take at S3_MIN_RATE", default=5.0)
    s3_min_rate_bytes: int = _env("MEDIASRV_S3_MIN_RATE", "slowest transfer to or from S3 given time, bytes "
                                  "per second: a call carrying N bytes (an upload part of up to 8 MiB, a "
                                  "read) may take S3_TIMEOUT + N / this; slower is an outage (503)",
                                  default=1024 * 1024)
    public_url: str = _env("MEDIASRV_PUBLIC_URL", "base of /m and /d URLs and of e-mail links "
                           "(default http://HOST:PORT)", default="")
    smtp_url: str | None = _env("MEDIASRV_SMTP_URL", "smtp://[user:password@]host:port or smtps://; "
                                "unset: e-mails go to DATA_DIR/outbox/", default=None, shown=URL_WITH_PASSWORD)
    mail_from: str = _env("MEDIASRV_MAIL_FROM", "sender of e-mails", default="mediasrv@localhost")
    jwt_secret: str | None = _env("MEDIASRV_JWT_SECRET", "HMAC key of session tokens and signed URLs "
                                  "(default: generated once, kept in DATA_DIR with mode 0600, or in "
                                  "MongoDB when it is used)", default=None, shown=SECRET)
    trial_days: int | None = _env("MEDIASRV_TRIAL_DAYS", "trial length of new accounts in days; 0 ends "
                                  "it at once (unset: no trial)", default=None)
    storage_limit_bytes: int | None = _env("MEDIASRV_STORAGE_LIMIT_BYTES", "per-account storage limit "
                                           "(unset: none)", default=None)
    file_count_limit: int | None = _env("MEDIASRV_FILE_COUNT_LIMIT", "per-account file count limit "
                                        "(unset: none)", default=None)
    max_upload_size_bytes: int = _env("MEDIASRV_MAX_UPLOAD_SIZE_BYTES", "server-wide upload cap; an "
                                      "account can only lower it", default=104_857_600)
    registration: str = _env("MEDIASRV_REGISTRATION", "who may register: open, invite (a code from "
                             "`mediasrv invites create`), closed, or auto: open while PUBLIC_URL is a "
                             "loopback address (this machine only), invite otherwise", default="auto")
    admin_emails: tuple[str, ...] = _env("MEDIASRV_ADMIN_EMAILS", "comma-separated addresses of the accounts "
                                         "that may make invite codes from the dashboard (unset: none; "
                                         "`mediasrv invites create` always can)", default=())
    trust_proxy: bool = _env("MEDIASRV_TRUST_PROXY", "true: client address from X-Forwarded-For / "
                             "X-Real-IP of requests that carry PROXY_SECRET (only behind a proxy you run; "
                             "needs PROXY_SECRET)", default=False)
    proxy_secret: str | None = _env("MEDIASRV_PROXY_SECRET", "with TRUST_PROXY: the value the proxy "
                                    "sends in X-Mediasrv-Proxy-Secret; a request without it is the peer's own "
                                    "(no forwarded address, no X-Mediasrv-* header believed); the sidecar sets "
                                    "one per start", default=None, shown=SECRET)
    domain_provider: str = _env("MEDIASRV_DOMAIN_PROVIDER", "custom domains: manual or cloudflare",
                                default="manual")
    domain_verification: str = _env("MEDIASRV_DOMAIN_VERIFICATION", "manual provider: dns (a custom "
                                    "domain turns active once its TXT record _mediasrv-challenge.HOST "
                                    "holds its token, or an operator approves it) or none (any hostname "
                                    "turns active on refresh)", default="dns")
    dns_nameservers: tuple[str, ...] = _env("MEDIASRV_DNS_NAMESERVERS", "comma-separated resolvers "
                                            "(IP or IP:port) for the domain TXT check and webhook "
                                            "destinations (default: the system's)", default=())
    cloudflare_api_token: str | None = _env("CLOUDFLARE_API_TOKEN", "Cloudflare API token "
                                            "(cloudflare provider)", default=None, shown=SECRET)
    cloudflare_zone_id: str | None = _env("CLOUDFLARE_ZONE_ID", "Cloudflare zone of the custom "
                                          "hostnames (cloudflare provider)", default=None)
    cloudflare_api_url: str = _env("MEDIASRV_CLOUDFLARE_API_URL", "Cloudflare API base URL",
                                   default=CLOUDFLARE_API_URL, shown=URL_WITH_PASSWORD)
    resize_slots: int = _env("MEDIASRV_RESIZE_SLOTS", "concurrent resize/format operations",
                             default=10)
    max_image_pixels: int = _env("MEDIASRV_MAX_IMAGE_PIXELS", "largest image (width x height) that "
                                 "is decoded", default=50_000_000)
    image_memory_bytes: int = _env("MEDIASRV_IMAGE_MEMORY_BYTES", "memory all resize/format jobs "
                                   "together may use (estimated from headers), bytes",
                                   default=384 * 1024 * 1024)
    resize_retry_after: int | None = _env("MEDIASRV_RESIZE_RETRY_AFTER", "Retry-After of a busy "
                                          "resize 503: seconds (1..30), or auto (measured)",
                                          default=5)
    allowed_widths: tuple[int, ...] = _env("MEDIASRV_ALLOWED_WIDTHS", "comma-separated widths /m makes (e.g. "
                                           "320,640,1280); any of the ALLOWED_* lists makes transforms strict: only "
                                           "listed values, and a parameter without a list is refused (unset: any)",
                                           default=())
    allowed_heights: tuple[int, ...] = _env("MEDIASRV_ALLOWED_HEIGHTS", "comma-separated heights /m makes "
                                            "(unset: any, unless another ALLOWED_* list is set)", default=())
    allowed_formats: tuple[str, ...] = _env("MEDIASRV_ALLOWED_FORMATS", "comma-separated formats /m makes, of "
                                            "jpeg, png, webp, avif, gif, auto (unset: any, unless another "
                                            "ALLOWED_* list is set)", default=())
    allowed_qualities: tuple[int, ...] = _env("MEDIASRV_ALLOWED_QUALITIES", "comma-separated quality values /m "
                                              "accepts (unset: any, unless another ALLOWED_* list is set)",
                                              default=())
    allowed_fits: tuple[str, ...] = _env("MEDIASRV_ALLOWED_FITS", "comma-separated fit values /m makes besides "
                                         "the default contain: cover (unset: any, unless another ALLOWED_* list "
                                         "is set)", default=())
    allowed_gravities: tuple[str, ...] = _env("MEDIASRV_ALLOWED_GRAVITIES", "comma-separated gravity values of "
                                              "fit=cover /m makes besides the default center (unset: any, unless "
                                              "another ALLOWED_* list is set)", default=())
    allowed_dprs: tuple[str, ...] = _env("MEDIASRV_ALLOWED_DPRS", "comma-separated dpr values /m makes besides "
                                         "the default 1, e.g. 2,3 (unset: any, unless another ALLOWED_* list is "
                                         "set)", default=())
    allowed_animated: tuple[str, ...] = _env("MEDIASRV_ALLOWED_ANIMATED", "false: /m may be asked for the first "
                                             "frame of an animation (unset: yes, unless another ALLOWED_* list is "
                                             "set)", default=())
    allowed_blurs: tuple[str, ...] = _env("MEDIASRV_ALLOWED_BLURS", "comma-separated blur sigmas /m makes "
                                          "(unset: any, unless another ALLOWED_* list is set)", default=())
    allowed_sharpens: tuple[str, ...] = _env("MEDIASRV_ALLOWED_SHARPENS", "comma-separated sharpen sigmas /m "
                                             "makes (unset: any, unless another ALLOWED_* list is set)", default=())
    allowed_bgs: tuple[str, ...] = _env("MEDIASRV_ALLOWED_BGS", "comma-separated bg colours (RRGGBB) /m makes "
                                        "besides the default ffffff (unset: any, unless another ALLOWED_* list "
                                        "is set)", default=())
    max_animation_frames: int = _env("MEDIASRV_MAX_ANIMATION_FRAMES", "most frames of an animated GIF or WebP /m "
                                     "resizes and keeps animated; longer ones are refused (422 "
                                     "TOO_MANY_FRAMES) unless asked for with animated=false", default=300)
    transform_key: str | None = _env("MEDIASRV_TRANSFORM_KEY", "a key (32+ characters) that signs /m transforms: "
                                     "with it, a transform outside the ALLOWED_* lists (any, without lists) "
                                     "needs tsig=HMAC-SHA256(key, '<id>:<spec>') (unset: no signatures)",
                                     default=None, shown=SECRET)
    rate_limit_scale: float = _env("MEDIASRV_RATE_LIMIT_SCALE", "multiplies every rate limit, "
                                   "MEDIASRV_RATE_LIMITS' numbers included", default=1.0)
    rate_limits: tuple[tuple[str, int], ...] = _env(
        "MEDIASRV_RATE_LIMITS", "per-minute limits instead of the interface's, comma-separated "
        "ROUTE=N or COUNTER=N, e.g. \"POST /files=600, GET /files=120\" (unset: the interface's)",
        default=())
    allowed_content_types: tuple[str, ...] = _env(
        "MEDIASRV_ALLOWED_CONTENT_TYPES", "comma-separated list of upload MIME types "
        "(default: built-in list)", default=DEFAULT_ALLOWED_CONTENT_TYPES)
    redirect_allowlist: tuple[str, ...] = _env(
        "MEDIASRV_REDIRECT_ALLOWLIST", "comma-separated origins allowed as redirect_to besides "
        "PUBLIC_URL's", default=())
    cors_origins: tuple[str, ...] = _env(
        "MEDIASRV_CORS_ORIGINS", "comma-separated origins (scheme://host[:port]) whose browser pages may "
        "call the API, or * for any (unset: none)", default=())
    dashboard_url: str = _env("MEDIASRV_DASHBOARD_URL", "where a confirmation link lands without "
                              "redirect_to (default PUBLIC_URL/)", default="")
    bcrypt_rounds: int = _env("MEDIASRV_BCRYPT_ROUNDS", "bcrypt cost factor (4..16)", default=12)
    access_token_ttl_s: int = _env("MEDIASRV_ACCESS_TOKEN_TTL", "session token lifetime, seconds",
                                   default=3600)
    refresh_token_ttl_s: int = _env("MEDIASRV_REFRESH_TOKEN_TTL", "refresh token lifetime, seconds",
                                    default=30 * 86400)
    public_max_age_s: int = _env("MEDIASRV_PUBLIC_MAX_AGE", "seconds browsers and CDNs may cache a public "
                                 "/m or /d response; a deleted file can outlive its deletion this long",
                                 default=3600)
    public_immutable: bool = _env("MEDIASRV_PUBLIC_IMMUTABLE", "true: add 'immutable' to public responses "
                                  "(no revalidation at all until max-age ends)", default=False)
    result_cache_bytes: int = _env("MEDIASRV_RESULT_CACHE_BYTES", "memory for cached resize "
                                   "results, bytes", default=128 * 1024 * 1024)
    blob_cache_bytes: int = _env("MEDIASRV_BLOB_CACHE_BYTES", "memory for the bytes of small hot public "
                                 "files served from memory, bytes (0: off)", default=64 * 1024 * 1024)
    blob_cache_item_bytes: int = _env("MEDIASRV_BLOB_CACHE_ITEM_BYTES", "largest file kept in that "
                                      "memory, bytes", default=256 * 1024)
    credential_cache_s: float = _env("MEDIASRV_CREDENTIAL_CACHE_TTL", "seconds a user or API key looked "
                                     "up for a request is reused; changes by another process (a second "
                                     "worker, an operator command) take effect within this", default=2.0)
    resize_threads: int = _env("MEDIASRV_RESIZE_THREADS", "threads running admitted resize jobs "
                               "(0: one more than CPU cores)", default=0)
    sweep_grace_s: int = _env("MEDIASRV_SWEEP_GRACE", "age before an unreferenced blob is swept, "
                              "seconds", default=3600)
    sweep_max_share: float = _env("MEDIASRV_SWEEP_MAX_SHARE", "largest share of the file count one "
                                  "sweep may quarantine (at least 10 blobs); more: it refuses", default=0.02)
    quarantine_grace_s: int = _env("MEDIASRV_QUARANTINE_GRACE", "age in seconds after which `mediasrv "
                                   "sweep --purge-quarantine` deletes quarantined blobs", default=7 * 86400)
    proxy_hops: int = _env("MEDIASRV_PROXY_HOPS", "with TRUST_PROXY: trusted proxies in front, the client "
                           "is the address this many entries from the right of X-Forwarded-For", default=1)
    header_timeout_s: float = _env("MEDIASRV_HEADER_TIMEOUT", "seconds a connection may take to send a "
                                   "request's headers, idle keep-alive time included", default=20.0)
    body_idle_timeout_s: float = _env("MEDIASRV_BODY_IDLE_TIMEOUT", "seconds a request body may go without "
                                      "sending a byte before the connection is closed", default=60.0)
    buffered_body_timeout_s: float = _env("MEDIASRV_BUFFERED_BODY_TIMEOUT", "seconds a request body "
                                          "read whole before its handler (every route but uploads: 64 KiB "
                                          "at most) may take in all; later: 408 and the connection closed",
                                          default=30.0)
    max_connections: int | None = _env("MEDIASRV_MAX_CONNECTIONS", "open connections at most; more wait "
                                       "in the listen queue (default: from the descriptor limit)",
                                       default=None)
    max_connections_per_ip: int = _env("MEDIASRV_MAX_CONNECTIONS_PER_IP", "open connections per client "
                                       "address (not applied with TRUST_PROXY)", default=256)
    max_uploads_per_user: int = _env("MEDIASRV_MAX_UPLOADS_PER_USER", "uploads one account may have in "
                                     "progress at once, per process (one more: 429 TOO_MANY_UPLOADS)",
                                     default=16)
    upload_buffer_bytes: int = _env("MEDIASRV_UPLOAD_BUFFER_BYTES", "memory all uploads in progress in one "
                                    "process may hold at once (each takes the most it may hold: a large one about "
                                    "10 MiB on S3, 2 MiB on files, a small one a few times its size); one more: "
                                    "503 UPLOADS_BUSY with Retry-After", default=256 * 1024 * 1024)
    upload_expiry_s: int = _env("MEDIASRV_UPLOAD_EXPIRY", "seconds an unfinished resumable upload (tus, "
                                "/uploads) lives after its last chunk; then the housekeeping holder ends it "
                                "(its bytes, its S3 multipart upload and its quota reservation go)", default=86400)
    accel_redirect: str = _env("MEDIASRV_ACCEL_REDIRECT", "behind nginx: passthrough /m and /d answer with "
                               "X-Accel-Redirect to this internal location prefix (e.g. /_blobs/) and nginx "
                               "sends the blob file; empty: mediasrv streams it", default="")
    housekeeping: str = _env("MEDIASRV_HOUSEKEEPING", "full (start-up usage reconcile on embedded SQLite "
                             "+ periodic sweep), sweep (periodic sweep only) or none: several processes "
                             "on one database give one `sweep` and the others `none`; on MongoDB every `full` or "
                             "`sweep` process of the fleet competes for one lease, and its holder alone sweeps and "
                             "reconciles", default="full")
    housekeeping_lease_s: int = _env("MEDIASRV_HOUSEKEEPING_LEASE", "MongoDB: seconds the housekeeping lease "
                                     "lasts; one process of the fleet holds it (it sweeps and reconciles), "
                                     "renews it every third of it, and another takes over this long after "
                                     "the holder stops", default=30)
    reconcile_interval_s: int = _env("MEDIASRV_RECONCILE_INTERVAL", "MongoDB: seconds between two rounds of "
                                     "the automatic reconcile of the accounts' counters", default=60)
    reservation_ttl_s: int = _env("MEDIASRV_RESERVATION_TTL", "MongoDB: seconds an upload's quota "
                                  "reservation counts without its upload finishing; the reconcile then "
                                  "gives it back (an upload killed with its host)", default=900)
    metrics_port: int | None = _env("MEDIASRV_METRICS_PORT", "serve GET /metrics (Prometheus text) on "
                                    "METRICS_HOST:PORT, a listener of its own covering every process of "
                                    "--workers and of the sidecar (unset: no metrics endpoint)",
                                    default=None)
    metrics_host: str = _env("MEDIASRV_METRICS_HOST", "address of the metrics listener (0.0.0.0 or a "
                             "private address for a Prometheus on another machine)", default="127.0.0.1")
    metrics_socket: Path | None = _env("MEDIASRV_METRICS_SOCKET", "also serve GET /metrics on this Unix "
                                       "socket (mode 0600), for a collector on this host; --workers and the "
                                       "sidecar set it per process and serve the sum at METRICS_PORT",
                                       default=None)
    webhook_limit: int = _env("MEDIASRV_WEBHOOK_LIMIT", "webhook endpoints one account may have", default=10)
    webhook_allow_private: bool = _env("MEDIASRV_WEBHOOK_ALLOW_PRIVATE", "true: webhooks may go to loopback, "
                                       "private, link-local, unique-local, multicast and cloud-metadata "
                                       "addresses (a receiver on your own network; never on a shared server)",
                                       default=False)
    webhook_concurrency: int = _env("MEDIASRV_WEBHOOK_CONCURRENCY", "webhook deliveries one process sends at "
                                    "once", default=32)
    webhook_per_endpoint: int = _env("MEDIASRV_WEBHOOK_PER_ENDPOINT", "of those, at most this many to one "
                                     "endpoint (a slow endpoint holds no more)", default=4)
    webhook_claim_s: int = _env("MEDIASRV_WEBHOOK_CLAIM", "seconds a process holds a webhook delivery it is "
                                "sending (15 or more); another process retries it this long after a crash",
                                default=60)
    log_level: str = _env("MEDIASRV_LOG_LEVEL", "DEBUG, INFO, WARNING or ERROR", default="INFO")
    log_format: str = _env("MEDIASRV_LOG_FORMAT", "text (one readable line per event) or json (one "
                           "JSON object per line), for every log line", default="text")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, host: str | None = None,
                 port: int | None = None) -> Settings:
        """Read every documented variable; raise SettingsError naming a bad one. ``host`` and
        ``port`` (the command-line flags) win over MEDIASRV_HOST and MEDIASRV_PORT."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.metadata.get("env")
            if not name or name not in env or env[name].strip() == "":
                continue
            try:
                values[f.name] = _PARSERS.get(f.name, str)(env[name])
            except ValueError as exc:
                raise SettingsError(f"{name}={env[name]!r}: {exc}") from None
        values.update({k: v for k, v in (("host", host), ("port", port)) if v is not None})
        settings = cls(**values)
        host, port = settings.host, settings.port
        derived: dict[str, Any] = {}
        if not settings.public_url:
            shown = f"[{host}]" if ":" in host else host  # an IPv6 literal needs brackets in a URL
            derived["public_url"] = f"http://{shown}:{port}"
        else:
            derived["public_url"] = settings.public_url.rstrip("/")
        if not settings.dashboard_url:
            derived["dashboard_url"] = derived["public_url"] + "/"
        return dataclasses.replace(settings, **derived)

    @property
    def registration_explained(self) -> str:
        """The effective registration mode and why, for ``mediasrv config`` and the start-up log:
        ``invite (MEDIASRV_REGISTRATION=auto, and the public URL https://media.example.com is
        not a loopback address)``."""
        mode = self.registration_mode
        if self.registration != "auto":
            return f"{mode} (MEDIASRV_REGISTRATION={self.registration})"
        where = "a loopback address: only this machine reaches it" if mode == "open" else "not a loopback address"
        return f"{mode} (MEDIASRV_REGISTRATION=auto, and the public URL {self.public_url} is {where})"

    @property
    def registration_mode(self) -> str:
        """open, invite or closed; ``auto`` resolved: open while the public URL is a loopback
        address (only this machine can reach the server: development, tests), invite once it
        is anything else, so a server put on a public address is not a free file host by
        accident."""
        if self.registration != "auto":
            return self.registration
        host = (urlsplit(self.public_url).hostname or "") if self.public_url else "127.0.0.1"
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        return "open" if loopback else "invite"


_PARSERS: dict[str, Callable[[str], Any]] = {
    "host": str.strip, "port": whole_number,
    "data_dir": lambda v: Path(v).expanduser(),
    "trial_days": whole_number, "storage_limit_bytes": byte_size, "file_count_limit": whole_number,
    "max_upload_size_bytes": byte_size, "resize_slots": whole_number, "max_image_pixels": whole_number,
    "bcrypt_rounds": whole_number, "access_token_ttl_s": whole_number, "refresh_token_ttl_s": whole_number,
    "result_cache_bytes": byte_size, "blob_cache_bytes": byte_size, "blob_cache_item_bytes": byte_size,
    "resize_threads": whole_number, "credential_cache_s": number, "sweep_grace_s": whole_number,
    "sweep_max_share": number, "quarantine_grace_s": whole_number, "proxy_hops": whole_number,
    "header_timeout_s": number, "body_idle_timeout_s": number, "buffered_body_timeout_s": number,
    "max_connections": whole_number,
    "metrics_port": whole_number, "metrics_host": str.strip, "metrics_socket": lambda v: Path(v).expanduser(),
    "max_connections_per_ip": whole_number,
    "max_uploads_per_user": whole_number, "upload_buffer_bytes": byte_size,
    "upload_expiry_s": whole_number, "image_memory_bytes": byte_size,
    "resize_retry_after": lambda v: None if v.strip().lower() == "auto" else whole_number(v),
    "public_max_age_s": whole_number, "public_immutable": boolean, "mongodb_timeout_ms": whole_number,
    "s3_timeout_s": number, "s3_min_rate_bytes": byte_size,
    "trust_proxy": boolean, "rate_limit_scale": number, "rate_limits": rate_limits,
    "allowed_widths": _int_csv, "allowed_heights": _int_csv, "allowed_qualities": _int_csv,
    "allowed_formats": _formats, "allowed_fits": _csv, "allowed_gravities": _csv, "allowed_dprs": _csv,
    "allowed_animated": _csv, "allowed_blurs": _csv, "allowed_sharpens": _csv, "allowed_bgs": _csv,
    "max_animation_frames": whole_number, "housekeeping_lease_s": whole_number, "reconcile_interval_s": whole_number,
    "reservation_ttl_s": whole_number,
    "allowed_content_types": _csv, "redirect_allowlist": lambda v: tuple(
        p.strip().rstrip("/") for p in v.split(",") if p.strip()),
    "cors_origins": lambda v: tuple(p.strip().rstrip("/").lower() for p in v.split(",") if p.strip()),
    "domain_provider": lambda v: v.strip().lower(),
    "domain_verification": lambda v: v.strip().lower(),
    "housekeeping": lambda v: v.strip().lower(),
    "registration": lambda v: v.strip().lower(),
    "admin_emails": lambda v: tuple(sorted({p.strip().lower() for p in v.split(",") if p.strip()})),
    "dns_nameservers": lambda v: tuple(p.strip() for p in v.split(",") if p.strip()),
    "webhook_limit": whole_number, "webhook_allow_private": boolean, "webhook_concurrency": whole_number,
    "webhook_per_endpoint": whole_number, "webhook_claim_s": whole_number,
    "log_level": lambda v: v.strip().upper(),
    "log_format": lambda v: v.strip().lower(),
}
