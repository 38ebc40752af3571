"""Who sent a request: the socket's peer, or behind proxies we run, the address they saw."""
from __future__ import annotations

from tornado.httputil import HTTPHeaders


def client_address(headers: HTTPHeaders, remote_ip: str | None, *, trust_proxy: bool, hops: int) -> str:
    """The socket's peer, or behind trusted proxies the address the outermost one saw.

    Each proxy appends the address it received the request from to X-Forwarded-For, so with
    ``hops`` proxies the client is that many entries from the right; anything further left was
    sent by the client and is not believed. X-Real-Ip, which a client can send too, counts only
    when no X-Forwarded-For arrived at all (a proxy that sets only X-Real-Ip).
    """
    if trust_proxy:
        forwarded = [h.strip() for value in headers.get_list("X-Forwarded-For")
                     for h in value.split(",") if h.strip()]
        if forwarded:
            return forwarded[-min(hops, len(forwarded))]
        real = headers.get("X-Real-Ip", "").strip()
        if real:
            return real
    return remote_ip or "unknown"
