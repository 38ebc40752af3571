"""What one answered request was, as one typed record, and where such records go.

The access log and ``/metrics`` read the same facts, and two fronts produce them: a handler
(``handlers.base.BaseHandler.request_facts``) and the hot path's answers
(``handlers.hot_media``). Every field is required, so a field added here is a type error in
each producer until both fill it: it cannot silently read as zero in one of them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class RequestFacts:
    """One answered request, as the client saw it. Built once, after the answer, and not
    changed after (not frozen only because a frozen init costs twice as much per request)."""

    method: str
    uri: str
    """The request target as sent (the access log redacts secret query values)."""
    route: str
    """The declared path of the route that answered (``/m/{id}``); empty when none matched."""
    status: int
    """The status the client got: for an answer nginx completes (X-Accel-Redirect), nginx's."""
    seconds: float
    received: int
    """Request body bytes read."""
    sent: int
    """Response body bytes the client gets (none for HEAD or a 304)."""
    client: str
    """The client's address, through the proxies this server trusts."""
    user: str | None
    request_id: str | None
    user_agent: str | None
    media_kind: str | None
    """For ``/m``: ``passthrough`` (the stored bytes) or ``resize`` (a transform asked for)."""
    busy: bool
    """The answer is back-pressure (429, a busy 503), not a failure."""
    store_error: bool
    """The answer is a store failure (503/507)."""
    extra: tuple[tuple[str, str | int], ...]
    """What the access line adds after the usual fields (an upload's file id, ``sent_by=nginx``)."""


RequestSink = Callable[[RequestFacts], None]


class RequestLog:
    """Where every answered request's facts go; the access log and ``/metrics`` subscribe.

    One object handed to both fronts at assembly, rather than a hook read out of the
    application's settings: who records what is visible where the server is put together."""

    def __init__(self) -> None:
        self._sinks: tuple[RequestSink, ...] = ()

    def subscribe(self, sink: RequestSink) -> None:
        self._sinks = (*self._sinks, sink)

    def record(self, facts: RequestFacts) -> None:
        for sink in self._sinks:
            sink(facts)
