"""Who sent a request: the socket's peer, or behind our own proxy the address it saw.

One rule for the handler path, the hot path (``handlers.hot_media``) and the request id: a
request is from our proxy only with MEDIASRV_TRUST_PROXY and the secret the proxy and this
server share (MEDIASRV_PROXY_SECRET in ``X-Mediasrv-Proxy-Secret``, docs/internal-headers.md);
only such a request may use the internal headers. The forwarded client address follows the
operator contract: MEDIASRV_TRUST_PROXY=true believes X-Forwarded-For / X-Real-Ip (behind a
proxy the operator runs); once a secret is configured (the sidecar always sets one), only from
requests that carry it, since anyone who reaches a process's port directly (the sidecar's
processes listen on loopback) could otherwise pick the address its per-address limits count.
"""
from __future__ import annotations

import hmac

from tornado.httputil import HTTPHeaders

PROXY_SECRET_HEADER = "X-Mediasrv-Proxy-Secret"


def from_our_proxy(headers: HTTPHeaders, *, trust_proxy: bool, secret: str | None) -> bool:
    """Whether the request carries our proxy's secret (and proxies are trusted at all)."""
    if not (trust_proxy and secret):
        return False
    sent = headers.get(PROXY_SECRET_HEADER, "")
    return bool(sent) and hmac.compare_digest(sent.encode(), secret.encode())


def forwarded_address_believed(headers: HTTPHeaders, *, trust_proxy: bool, secret: str | None) -> bool:
    """Whether the request's X-Forwarded-For / X-Real-Ip name its client: with proxies trusted,
    and with the proxy's secret when one is configured."""
    return trust_proxy and (secret is None or from_our_proxy(headers, trust_proxy=trust_proxy, secret=secret))


def client_address(headers: HTTPHeaders, remote_ip: str | None, *, trust_proxy: bool, secret: str | None,
                   hops: int) -> str:
    """The socket's peer, or when its forwarded address is believed (``forwarded_address_believed``)
    the address the outermost trusted proxy saw.

    Each proxy appends the address it received the request from to X-Forwarded-For, so with
    ``hops`` proxies the client is that many entries from the right; anything further left was
    sent by the client and is not believed. X-Real-Ip, which a client can send too, counts only
    when no X-Forwarded-For arrived at all (a proxy that sets only X-Real-Ip).
    """
    if forwarded_address_believed(headers, trust_proxy=trust_proxy, secret=secret):
        forwarded = [h.strip() for value in headers.get_list("X-Forwarded-For")
                     for h in value.split(",") if h.strip()]
        if forwarded:
            return forwarded[-min(hops, len(forwarded))]
        real = headers.get("X-Real-Ip", "").strip()
        if real:
            return real
    return remote_ip or "unknown"
