"""The application: ``make_app`` builds every service from explicit dependencies.

Only ``mediasrv.cli.server`` builds real clients from settings; tests call ``make_app`` with
the stores and mailer they want, so nothing is monkeypatched. The route table is built here
(thumbor's ``get_handlers(context)`` pattern) from the route rows (``handlers.routes.ROUTES``):
each row names its handler class, and the class's ``initialize`` names what it takes, which is
looked up among the services built here (``Route.args`` renames one). No path is typed here but
the dashboard's own pages; the app refuses to start when a handler and its rows disagree.
"""
from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any

import tornado.web

from handlers import dashboard
from handlers import routes as declared
from handlers.base import BaseDeps, InFlight, NotFoundHandler, Prerendered, implemented_methods, request_logger
from handlers.hot_media import HotMedia, hot_routes
from handlers.reference import Document, Documents, static_json
from mediasrv.assembly.openapi import build_for_agents, build_openapi
from mediasrv.base.settings import Settings
from mediasrv.core.account_info import AccountInfo
from mediasrv.core.account_settings import AccountSettings
from mediasrv.core.accounts import LOGIN_PER_ACCOUNT, AccountService
from mediasrv.core.credentials.apikeys import ApiKeyService
from mediasrv.core.credentials.auth import Authenticator
from mediasrv.core.credentials.passwords import PasswordHasher
from mediasrv.core.credentials.principals import CredentialLookups, ForgetfulMeta
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.credentials.tokens import JwtCodec
from mediasrv.core.delivery.caches import BlobCache, FileCache, ResultCache
from mediasrv.core.delivery.hosts import HostRule
from mediasrv.core.delivery.jobs import ImageJobs, MemoryBudget, Runner, run_transform
from mediasrv.core.delivery.placeholders import Placeholders
from mediasrv.core.delivery.service import MediaDelivery, public_cache_control
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import DomainProvider
from mediasrv.core.files.content_types import AllowList
from mediasrv.core.files.links import LinkCheck, SignedLinks
from mediasrv.core.files.resumable import ResumableUploads
from mediasrv.core.files.service import FileService
from mediasrv.core.health import HealthCheck
from mediasrv.core.invites import AdminInvites, InviteService
from mediasrv.core.limits.ratelimit import Limit, RateLimiter, override
from mediasrv.core.limits.store_counters import shared_counters
from mediasrv.core.mail import MailQueue
from mediasrv.core.recorders import ActivityRecorder, Flusher, KeyUsageRecorder, UsageRecorder
from mediasrv.core.storeguard import StoreGuard
from mediasrv.core.webhooks.destinations import AddressGuard, DnsResolver, Resolver, SystemResolver
from mediasrv.core.webhooks.relay import SETTLE_MIN_S, Relay
from mediasrv.core.webhooks.service import ChangeBell, WebhookService
from mediasrv.images.policy import ALLOWED_SETTINGS, TransformPolicy
from mediasrv.images.slots import ResizePool
from mediasrv.images.spec import FORMATS
from mediasrv.images.vips import libvips_info
from mediasrv.web.cors import CorsPolicy
from mediasrv.web.reference_page import render_reference
from mediasrv.web.request_facts import RequestLog
from mediasrv.web.routespec import Route, by_path, check, limits, path_regex
from mediasrv.web.webassets import content_security_policy, load_assets
from mediasrv.web.webhook_sender import HttpSender
from store.base import BlobStore, MetaStore
from store.models import FileRecord

ABORT_DRAIN_S = 2.0
"""How long shutdown waits for cut-off uploads to give their blob and reservation back."""
WEBHOOK_GRACE_S = 2.0
"""How long shutdown lets webhook sends in flight finish; the rest are handed to another process."""


@dataclass
class Runtime:
    """What the server must start and stop around the application's life."""

    flusher: Flusher
    mail: MailQueue
    pool: ResizePool
    hash_executor: ThreadPoolExecutor
    limiter: RateLimiter
    inflight: InFlight
    images: ImageJobs
    guard: StoreGuard
    files: FileService
    relay: Relay
    file_cache: FileCache | None = None
    results: ResultCache | None = None
    requests: RequestLog = field(default_factory=RequestLog)
    """Every answered request's facts: the access log and /metrics subscribe (``serve``)."""
    resumable: ResumableUploads | None = None
    """Resumable uploads: the housekeeping holder ends the expired ones."""
    placeholders: Placeholders | None = None

    async def stop(self, flush_timeout_s: float = 5.0, mail_timeout_s: float = 5.0) -> None:
        # Uploads cut off by the closed connections give their blob and reservation back
        # first, while the stores are still open; webhook sends in flight get a moment.
        await self.relay.stop(grace_s=min(WEBHOOK_GRACE_S, flush_timeout_s))
        await self.files.drain_aborts(min(ABORT_DRAIN_S, flush_timeout_s))
        if self.placeholders is not None:
            await self.placeholders.drain(min(ABORT_DRAIN_S, flush_timeout_s))
        await self.guard.stop()
        await self.flusher.stop(flush_timeout_s)
        await self.mail.drain(timeout_s=mail_timeout_s)
        self.pool.close()
        self.hash_executor.shutdown(wait=False, cancel_futures=True)


SERVICE_LIMITS = (LOGIN_PER_ACCOUNT,)
"""Counters a service spends itself, beside the routes' (no route row declares them)."""


def rate_counters(settings: Settings, api_routes: Sequence[Route] = declared.ROUTES) -> dict[str, Limit]:
    """Every counter, the routes' and SERVICE_LIMITS, with MEDIASRV_RATE_LIMITS applied
    (ValueError when it names an unknown route or counter)."""
    table = [*limits(api_routes).values(), *SERVICE_LIMITS]
    if not settings.rate_limits:
        return {limit.name: limit for limit in table}
    routes = {f"{r.method} {r.path}": r.limit.name if r.limit else None for r in api_routes}
    return override(table, settings.rate_limits, routes)


def _with_counters(api_routes: Sequence[Route], counters: Mapping[str, Limit]) -> tuple[Route, ...]:
    """The route rows counting ``counters`` (``rate_counters``): what the limiter counts and the
    documents publish."""
    return tuple(replace(r, limit=counters[r.limit.name]) if r.limit else r for r in api_routes)


def make_app(settings: Settings, *, meta: MetaStore, blobs: BlobStore, mail: MailQueue,
             domain_provider: DomainProvider, jwt_secret: str,
             flush_interval_s: float = 1.0,
             image_runner: Runner = run_transform,
             clock: Callable[[], float] = time.time,
             api_routes: Sequence[Route] = declared.ROUTES) -> tuple[tornado.web.Application, Runtime]:
    """The Tornado application and the runtime pieces the caller starts and stops.

    ``image_runner`` does one transform on a worker thread (tests inject a controllable one);
    ``clock`` is the wall clock of the session tokens and the per-minute rate limits (tests move
    it instead of sleeping);
    ``api_routes`` are the API's route rows (every handler module's, unless a test adds one)."""
    counters = rate_counters(settings, api_routes)
    api_routes = _with_counters(api_routes, counters)
    # Credentials are looked up through a short-lived cache that this process's own writes
    # clear at once (mediasrv.core.credentials.principals); every service below sees the forgetting store.
    lookups = CredentialLookups(meta, ttl_s=settings.credential_cache_s)
    meta = ForgetfulMeta(meta, lookups)  # type: ignore[assignment]
    bell = ChangeBell(meta)
    inner, meta = meta, bell  # type: ignore[assignment]  # uploads and deletes ring the relay (below)
    usage, key_usage = UsageRecorder(), KeyUsageRecorder()
    activity = ActivityRecorder(on_request=usage.api_request)
    jwt_codec = JwtCodec(jwt_secret, settings.access_token_ttl_s, clock)
    hash_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bcrypt")
    limiter = RateLimiter(counters.values(), settings.rate_limit_scale, clock=clock,
                          users=shared_counters(meta))
    inflight = InFlight()
    cors, requests = CorsPolicy.from_origins(settings.cors_origins), RequestLog()
    base = BaseDeps(auth=Authenticator(meta, jwt_codec, key_usage.used, lookups), limiter=limiter,
                    activity=activity, trust_proxy=settings.trust_proxy, inflight=inflight,
                    proxy_hops=settings.proxy_hops, proxy_secret=settings.proxy_secret, cors_policy=cors)
    accounts = AccountService(settings, meta, PasswordHasher(settings.bcrypt_rounds, hash_executor),
                              jwt_codec, mail, limiter)
    domains = DomainService(meta, domain_provider)
    file_cache, results = FileCache(), ResultCache(settings.result_cache_bytes)
    bodies = BlobCache(settings.blob_cache_bytes, settings.blob_cache_item_bytes)
    pool = ResizePool(settings.resize_slots, retry_after=settings.resize_retry_after,
                      threads=settings.resize_threads or None)
    images = ImageJobs(blobs, pool, MemoryBudget(settings.image_memory_bytes), settings.max_image_pixels,
                       runner=image_runner, max_frames=settings.max_animation_frames)
    signer = UrlSigner(jwt_secret)

    def forget(record: FileRecord) -> None:
        file_cache.invalidate(record.file_id)
        results.invalidate(record.file_id)
        bodies.invalidate(record.file_id)

    guard = StoreGuard(meta)
    placeholders = Placeholders(meta, images)
    file_service = FileService(settings, meta, blobs, domains, on_deleted=forget, guard=guard,
                               on_stored=placeholders.schedule)
    resumable = ResumableUploads(file_service, meta, blobs, expiry_s=settings.upload_expiry_s, clock=clock)
    relay = webhook_relay(settings, inner, mail, file_service.renderer, requests=lambda: inflight.count)
    bell.ring_to(relay.poke)
    allow = AllowList(settings.allowed_content_types)
    delivery = MediaDelivery(
        meta, blobs, files=file_cache, results=results, bodies=bodies, images=images,
        links=LinkCheck(signer, lookups.user),
        usage=usage, hosts=HostRule.from_urls((settings.public_url, settings.dashboard_url), domains),
        public_cache=public_cache_control(settings.public_max_age_s, settings.public_immutable),
        accel_prefix=settings.accel_redirect, policy=transform_policy(settings))
    route_args = _RouteArgs(
        base=base, settings=settings, accounts=accounts, files=file_service, allow=allow,
        links=SignedLinks(file_service, signer), keys=ApiKeyService(meta), info=AccountInfo(settings, meta),
        account_settings=AccountSettings(meta, domains, settings.max_upload_size_bytes),
        health=HealthCheck(meta, blobs, libvips=libvips_info().version), delivery=delivery, guard=guard,
        invites=AdminInvites(InviteService(meta), settings.admin_emails), resumable=resumable,
        webhooks=WebhookService(settings, meta, relay.poke))
    app = tornado.web.Application(
        routes(route_args, api_routes), default_handler_class=NotFoundHandler, default_handler_args={"base": base},
        compress_response=False, xheaders=False, serve_traceback=False,
        log_function=request_logger(requests))
    app.settings["hot_media"] = HotMedia(app, delivery, hot_routes(api_routes), limiter=limiter, requests=requests,
                                         cors=cors, trust_proxy=settings.trust_proxy,
                                         proxy_hops=settings.proxy_hops, proxy_secret=settings.proxy_secret)
    flusher = Flusher(meta, [usage.flush, activity.flush, key_usage.flush], interval_s=flush_interval_s,
                      counters={"usage counts": usage, "activity-log entries": activity,
                                "API-key last-used times": key_usage})
    return app, Runtime(flusher=flusher, mail=mail, pool=pool, hash_executor=hash_executor, limiter=limiter,
                          inflight=inflight, images=images, guard=guard, files=file_service, relay=relay,
                          file_cache=file_cache, results=results, requests=requests, resumable=resumable,
                          placeholders=placeholders)


def webhook_resolver(settings: Settings) -> Resolver:
    """MEDIASRV_DNS_NAMESERVERS when set (as for the domain check), else the system's resolver."""
    if settings.dns_nameservers:
        from mediasrv.base.settings.checks import parse_nameserver

        return DnsResolver(tuple(parse_nameserver(ns) for ns in settings.dns_nameservers))
    return SystemResolver()


def webhook_relay(settings: Settings, meta: MetaStore, mail: MailQueue, renderer: Any,
                  requests: Callable[[], int] = lambda: 0) -> Relay:
    """This process's webhook relay (started by ``mediasrv serve`` once it listens); ``requests``
    counts the requests being answered (they come first)."""
    guard = AddressGuard(webhook_resolver(settings), allow_private=settings.webhook_allow_private)
    return Relay(meta, HttpSender(guard), renderer, mail, concurrency=settings.webhook_concurrency,
                 per_endpoint=settings.webhook_per_endpoint, claim_s=settings.webhook_claim_s,
                 settle_s=max(SETTLE_MIN_S, 10 * settings.mongodb_timeout_ms / 1000),
                 dashboard_url=settings.dashboard_url, requests=requests)


def transform_policy(settings: Settings) -> TransformPolicy:
    """The strict-transform settings (MEDIASRV_ALLOWED_*, MEDIASRV_TRANSFORM_KEY) as a policy: one
    list per /m parameter (``policy.ALLOWED_SETTINGS``); ValueError naming the setting for a value
    /m would refuse (``mediasrv serve`` checks it before it starts)."""
    return TransformPolicy.of({name: getattr(settings, field) for name, field in ALLOWED_SETTINGS.items()},
                              key=settings.transform_key)


@dataclass(frozen=True)
class _RouteArgs:
    """The services handlers are given, under the names their ``initialize`` parameters use."""

    base: BaseDeps
    settings: Settings
    accounts: AccountService
    files: FileService
    allow: AllowList
    links: SignedLinks
    keys: ApiKeyService
    info: AccountInfo
    account_settings: AccountSettings
    health: HealthCheck
    delivery: MediaDelivery
    guard: StoreGuard
    invites: AdminInvites
    resumable: ResumableUploads
    webhooks: WebhookService


Table = list[tuple[str, type[tornado.web.RequestHandler], dict[str, Any]]]


def routes(a: _RouteArgs, api_routes: Sequence[Route] = declared.ROUTES) -> Table:
    """Every route of the service: the dashboard's own pages, then the API's paths (fixed before
    templated, see ``routespec.by_path``), each with its declared operations and its handler's
    init arguments."""
    check(api_routes)
    page = {"assets": load_assets(), "csp": content_security_policy(a.settings.public_url)}
    paths = by_path(api_routes)
    check_bindings({path: _handler_class(operations) for path, operations in paths.items()}, paths)
    services = {**{f.name: getattr(a, f.name) for f in fields(a)}, **page,
                **_documents(a.settings, a.allow, api_routes)}
    table: Table = [
        (r"/", dashboard.DashboardHandler, {"base": a.base.for_route("/", {}), **page}),
        (r"/assets/([A-Za-z0-9_./-]+)", dashboard.DashboardHandler,
         {"base": a.base.for_route("/assets/{path}", {}), **page}),
    ]
    for path, operations in paths.items():
        cls = _handler_class(operations)
        table.append((path_regex(path), cls, {"base": a.base.for_route(path, operations),
                                              **init_args(path, cls, operations.values(), services)}))
    return table


def _handler_class(operations: Mapping[str, Route]) -> type[tornado.web.RequestHandler]:
    """The class every row of one path names (``routespec.check`` refused two)."""
    return next(iter(operations.values())).handler


def check_bindings(classes: Mapping[str, type[tornado.web.RequestHandler]],
                   spec: Mapping[str, Mapping[str, Route]] = declared.PATHS) -> None:
    """Refuse to build a route table that disagrees with the route rows: a declared path
    without a handler, a handler on an undeclared path, or a handler whose methods are not
    exactly the declared ones (an undeclared method would run without its auth and limit)."""
    problems = [f"{path}: declared but no handler serves it" for path in spec if path not in classes]
    problems += [f"{path}: served by {cls.__name__} but not declared" for path, cls in classes.items()
                 if path not in spec]
    for path, cls in classes.items():
        if path in spec and set(implemented_methods(cls)) != set(spec[path]):
            problems.append(f"{path}: {cls.__name__} implements {sorted(implemented_methods(cls))}, "
                            f"the specification declares {sorted(spec[path])}")
    if problems:
        raise ValueError("route table: " + "; ".join(problems))


def init_args(path: str, cls: type[tornado.web.RequestHandler], rows: Iterable[Route],
              services: Mapping[str, Any]) -> dict[str, Any]:
    """What ``cls.initialize`` takes besides ``base``, by parameter name, from ``services``;
    a row's ``args`` maps a parameter to another service name. Refused: a parameter the app does
    not provide (and has no default), a renamed parameter ``initialize`` does not take, two rows
    renaming one apart."""
    params = _init_params(cls)
    renames: dict[str, str] = {}
    problems: list[str] = []
    for row in rows:
        for param, name in row.args.items():
            if renames.setdefault(param, name) != name:
                problems.append(f"{param} is given as {renames[param]} and as {name}")
            if param not in params:
                problems.append(f"{param} is not a parameter of {cls.__name__}.initialize")
    given = {param: renames.get(param, param) for param in params}
    required = {param for param, p in params.items() if p.default is p.empty}
    problems += [f"{cls.__name__}.initialize takes {param}, which the app does not provide"
                 for param, name in given.items() if name not in services and param in required]
    if problems:
        raise ValueError(f"route table: {path}: " + "; ".join(problems))
    return {param: services[name] for param, name in given.items() if name in services}


def _init_params(cls: type[tornado.web.RequestHandler]) -> Mapping[str, inspect.Parameter]:
    """``cls.initialize``'s named parameters but ``self`` and ``base`` (read once per class)."""
    found = _INIT_PARAMS.get(cls)
    if found is None:
        found = _INIT_PARAMS[cls] = {
            name: p for name, p in inspect.signature(cls.initialize).parameters.items()
            if name not in ("self", "base") and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return found


_INIT_PARAMS: dict[type[tornado.web.RequestHandler], Mapping[str, inspect.Parameter]] = {}


DOCUMENT_NAMES = ("openapi_document", "for_agents_document", "allowed_types_document", "reference_page")
"""The reference documents, by the names the reference rows ask for (``handlers.reference``)."""


def _documents(settings: Settings, allow: AllowList, api_routes: Sequence[Route]) -> dict[str, Document]:
    """The reference documents, rendered when first asked for, once per distinct input (apps
    assembled from the same settings share the rendering)."""
    policy = transform_policy(settings)
    key = (settings.public_url, tuple(allow.types), settings.max_upload_size_bytes, settings.resize_slots,
           settings.rate_limit_scale, tuple(sorted((k, tuple(sorted(v))) for k, v in policy.lists.items())),
           policy.key, tuple(api_routes))
    found = _RENDERED.get(key)
    if found is None:
        found = _RENDERED[key] = Documents(functools.partial(_render_documents, settings, allow, api_routes, policy))
        while len(_RENDERED) > _RENDERED_KEPT:
            del _RENDERED[next(iter(_RENDERED))]
    return {name: found.document(name) for name in DOCUMENT_NAMES}


_RENDERED: dict[tuple[Any, ...], Documents] = {}
_RENDERED_KEPT = 16


def _render_documents(settings: Settings, allow: AllowList, api_routes: Sequence[Route],
                      policy: TransformPolicy) -> dict[str, Prerendered]:
    kw: dict[str, Any] = {"max_upload_size_bytes": settings.max_upload_size_bytes,
                          "resize_slots": settings.resize_slots, "rate_limit_scale": settings.rate_limit_scale,
                          "formats": tuple(FORMATS), "routes": api_routes}
    openapi = build_openapi(settings.public_url, allow.types, **kw)
    return {"openapi_document": static_json(openapi),
            "for_agents_document": static_json(build_for_agents(settings.public_url, allow.types, **kw,
                                                                policy=policy)),
            "allowed_types_document": static_json({"content_types": list(allow.types)}),
            "reference_page": Prerendered(render_reference(openapi))}
