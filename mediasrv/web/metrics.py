"""Prometheus metrics, served by ``GET /metrics`` on a loopback listener of its own.

The request path pays one dict lookup and three increments per request (a ``RequestLog``
sink, after the response went out): the per-(route, method, status) children of the counter
and histogram are cached here, so no label set is built per request. Everything else (resize
slots in use and refusals, cache hits and misses, store errors) is kept as plain integers by
the parts that own it and read only when Prometheus scrapes, by a custom collector.

Also: the process (``process_*``: resident memory, CPU seconds, open and maximum descriptors,
start time; prometheus_client's ``ProcessCollector``), ``mediasrv_build_info`` (version, Python),
and ``/m`` answers counted apart by kind (``mediasrv_media_requests_total{kind="passthrough"|
"resize"}`` and its latency histogram), which the route's one label would mix. Several
processes (``--workers``, the sidecar) are scraped as one target through
``mediasrv.web.metrics_fanin``, each series labelled with its ``worker``.

Routes are labelled by their declared path (the route row's ``/m/{id}`` is labelled ``/m/:id``),
never the raw path, so the number of series stays bounded whatever clients request: each
handler carries its route's path (``BaseDeps.path``), and only the paths of the application's
route table become labels.
"""
from __future__ import annotations

import platform
import re
from collections.abc import Iterator
from typing import Any

import tornado.ioloop
import tornado.web
from prometheus_client import CollectorRegistry, Counter, Histogram, Info, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mediasrv.version import version
from mediasrv.web.request_facts import RequestFacts

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
UNMATCHED = "unmatched"
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"})
OTHER_METHOD = "other"
"""The method label of any other token a client sends (``XFOO /files``, a 405): each distinct one
was a series of its own, so anyone could grow the scrape without bound (3,000 requests: 56 KB to
7.2 MB, 14.6 s to render)."""
_PARAM = re.compile(r"\{[^{}/]*\}")


def route_label(path: str) -> str:
    """A declared path as a label: ``/files/{id}/signed-url`` -> ``/files/:id/signed-url`` (every
    path parameter is ``:id``, as the labels have always been)."""
    return _PARAM.sub(":id", path)


class Metrics:
    """One registry per application (tests build many); ``observe`` subscribes to its ``RequestLog``."""

    def __init__(self, app: tornado.web.Application, sources: dict[str, Any]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter("mediasrv_http_requests", "HTTP requests by route pattern, method and status",
                                 ("route", "method", "status"), registry=self.registry)
        self._latency = Histogram("mediasrv_http_request_duration_seconds", "Time from request to response end",
                                  ("route", "method", "status"), buckets=LATENCY_BUCKETS, registry=self.registry)
        self._bytes_in = Counter("mediasrv_http_request_bytes", "Request body bytes received",
                                 registry=self.registry)
        self._bytes_out = Counter("mediasrv_http_response_bytes",
                                  "Response body bytes sent (nginx's, for an answer it completes)",
                                  registry=self.registry)
        self._store_errors = Counter("mediasrv_store_errors",
                                     "Requests answered 503/507 because a store failed", registry=self.registry)
        self._media = Counter("mediasrv_media_requests", "Answers of /m by kind (passthrough: the stored "
                              "bytes; resize: a transform asked for) and status", ("kind", "status"),
                              registry=self.registry)
        self._media_latency = Histogram("mediasrv_media_request_duration_seconds", "/m time from request to "
                                        "response end, by kind", ("kind",), buckets=LATENCY_BUCKETS,
                                        registry=self.registry)
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._media_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._labels = {path: route_label(path) for path in _declared_paths(app)}
        self.registry.register(_StateCollector(sources))
        ProcessCollector(registry=self.registry)  # process_*: RSS, CPU, descriptors, start time (Linux)
        Info("mediasrv_build", "The running mediasrv", registry=self.registry).info(
            {"version": version(), "python": platform.python_version()})

    def observe(self, facts: RequestFacts) -> None:
        """Count one answered request (a ``RequestLog`` sink)."""
        method = facts.method if facts.method in HTTP_METHODS else OTHER_METHOD
        key = (self._labels.get(facts.route, UNMATCHED), method, facts.status)
        children = self._children.get(key)
        if children is None:
            children = self._new_children(key)
        children[0].inc()
        children[1].observe(facts.seconds)
        kind = facts.media_kind
        if kind is not None:
            media = self._media_children.get((kind, facts.status))
            if media is None:  # bounded: 2 kinds x statuses
                media = self._media_children[(kind, facts.status)] = (self._media.labels(kind, str(facts.status)),
                                                                      self._media_latency.labels(kind))
            media[0].inc()
            media[1].observe(facts.seconds)
        if facts.received:
            self._bytes_in.inc(facts.received)
        if facts.sent:
            self._bytes_out.inc(facts.sent)
        if facts.store_error:
            self._store_errors.inc()

    def _new_children(self, key: tuple[str, str, int]) -> tuple[Any, Any]:
        labels = (key[0], key[1], str(key[2]))
        children = (self._requests.labels(*labels), self._latency.labels(*labels))
        self._children[key] = children  # bounded: routes of the table x methods x statuses
        return children

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _declared_paths(app: tornado.web.Application) -> set[str]:
    """The declared path of every route of ``app`` (its handlers' ``BaseDeps.path``)."""
    paths = set()
    for rule in app.wildcard_router.rules:
        path = getattr((rule.target_kwargs or {}).get("base"), "path", "")
        if path:
            paths.add(path)
    return paths


class _StateCollector:
    """Reads the live counters of the resize pool and caches at scrape time."""

    def __init__(self, sources: dict[str, Any]) -> None:
        self._s = sources

    def collect(self) -> Iterator[Any]:
        pool, files, results = self._s["pool"], self._s["files"], self._s["results"]
        yield GaugeMetricFamily("mediasrv_resize_slots", "Resize/format slots configured", value=pool.slots)
        yield GaugeMetricFamily("mediasrv_resize_slots_in_use", "Resize/format slots in use", value=pool.in_use)
        yield CounterMetricFamily("mediasrv_resize_busy", "Resize/format requests refused with 503 (busy)",
                                  value=pool.refused)
        cache = CounterMetricFamily("mediasrv_cache_lookups", "Cache lookups by cache and result",
                                    labels=("cache", "result"))
        for name, source in (("file", files), ("result", results)):
            cache.add_metric((name, "hit"), source.hits)
            cache.add_metric((name, "miss"), source.misses)
        yield cache
        yield GaugeMetricFamily("mediasrv_result_cache_bytes", "Bytes held by the resize result cache",
                                value=results.size_bytes)
        webhooks = self._s.get("webhooks")
        if webhooks is not None:
            yield from _webhook_families(webhooks)
        sweeper = self._s.get("sweep")
        if sweeper is not None and sweeper.last is not None:  # this process sweeps (MEDIASRV_HOUSEKEEPING)
            yield from _sweep_families(sweeper.last)
        libvips = self._s.get("libvips")
        if libvips is not None:  # build-info style: the value is 1, the facts are the labels
            info = GaugeMetricFamily("mediasrv_libvips_info", "The libvips the image work runs on",
                                     labels=("version", "library"))
            info.add_metric((libvips.version, libvips.origin), 1)
            yield info

    def describe(self) -> Iterator[Any]:
        return iter(())


def _sweep_families(report: Any) -> Iterator[Any]:
    """The last sweep of this process (``mediasrv.core.sweep.SweepReport``): what an operator
    alerts on (bytes lost, a sweep that refused, a sweep that stopped running)."""
    yield GaugeMetricFamily("mediasrv_sweep_lost_blobs", "Files whose blob the last sweep found missing (they "
                            "answer 404; see the log)", value=len(report.lost) + report.unchecked)
    yield GaugeMetricFamily("mediasrv_sweep_refused", "1 when the last sweep refused to move unreferenced blobs "
                            "(see the log)", value=int(report.refused is not None))
    yield GaugeMetricFamily("mediasrv_sweep_quarantined_blobs", "Unreferenced blobs the last sweep quarantined",
                            value=report.orphan_blobs)
    yield GaugeMetricFamily("mediasrv_sweep_last_end_time_seconds", "When the last sweep ended (Unix time)",
                            value=report.ended_at)


def _webhook_families(c: Any) -> Iterator[Any]:
    """The webhook relay's counters (``mediasrv.core.webhooks.relay.Counters``): this process's
    attempts by outcome, and the queue as the store saw it at the relay's last look (every 10 s)."""
    attempts = CounterMetricFamily("mediasrv_webhook_deliveries", "Webhook delivery attempts by this process, "
                                   "by outcome (succeeded; retry: failed, tried again later; failed: given up)",
                                   labels=("outcome",))
    for outcome, count in c.attempts.items():
        attempts.add_metric((outcome,), count)
    yield attempts
    yield CounterMetricFamily("mediasrv_webhook_endpoints_disabled", "Webhook endpoints this process disabled "
                              "after 3 days of failures", value=c.disabled)
    yield GaugeMetricFamily("mediasrv_webhook_in_flight", "Webhook deliveries this process is sending now",
                            value=c.in_flight)
    yield GaugeMetricFamily("mediasrv_webhook_queue_pending", "Webhook deliveries not yet delivered nor given up "
                            "(all processes)", value=c.pending)
    yield GaugeMetricFamily("mediasrv_webhook_queue_due", "Of those, due now: waiting for a free slot",
                            value=c.due)
    yield GaugeMetricFamily("mediasrv_webhook_queue_oldest_seconds", "Age of the oldest pending delivery's "
                            "event (0: none)", value=c.oldest_pending_age_s)
    yield GaugeMetricFamily("mediasrv_webhook_queue_due_lag_seconds", "How long the most overdue delivery has "
                            "been due (0: none waits)", value=c.oldest_due_age_s)


class MetricsHandler(tornado.web.RequestHandler):
    """``GET /metrics`` on the metrics listener; nothing else is served there."""

    def initialize(self, metrics: Metrics) -> None:  # type: ignore[override]
        self.metrics = metrics

    async def get(self) -> None:
        # On a thread: the process collector lists /proc/self/fd (thousands of connections).
        text = await tornado.ioloop.IOLoop.current().run_in_executor(None, self.metrics.render)
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.set_header("Cache-Control", "no-store")
        self.finish(text)


def metrics_app(metrics: Metrics) -> tornado.web.Application:
    return tornado.web.Application([(r"/metrics", MetricsHandler, {"metrics": metrics})],
                                   log_function=_quiet)


def _quiet(handler: tornado.web.RequestHandler) -> None:
    """Scrapes are not logged: one every few seconds would drown the access log."""
