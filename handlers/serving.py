"""The hot path's transport: GET/HEAD /m/:key (passthrough or resize) and /d/:key (download).

Parse, ask ``MediaDelivery`` once, write its answer. Every decision (record, host and privacy,
representation, validators, 304, Range, X-Accel-Redirect or bytes, usage counting) is made in
``mediasrv.core.delivery.service``; what stays here is Tornado's: CORS for private files, the
socket's flow control and a client that goes away mid-body.
"""
from __future__ import annotations

import contextlib
from typing import ClassVar

from tornado.iostream import StreamClosedError

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.delivery.answer import BlobStream, MediaAnswer, MediaRequest
from mediasrv.core.delivery.service import MediaDelivery
from mediasrv.images.policy import SIGNATURE_PARAM
from mediasrv.images.spec import TransformSpec, parse_transform
from mediasrv.web.cors import CorsMode


class ServeBase(BaseHandler):
    logged = False
    private = False  # Cache-Control is chosen per file by the delivery service
    attachment = False
    cors: ClassVar[CorsMode] = "public"

    delivery: MediaDelivery

    def initialize(self, base: BaseDeps, deps: MediaDelivery) -> None:  # type: ignore[override]
        """``deps``: the delivery service (the route argument keeps the name tests look up)."""
        super().initialize(base)
        self.delivery = deps

    async def get(self, key: str) -> None:
        await self.serve(key, None)

    async def head(self, key: str) -> None:
        await self.get(key)

    async def serve(self, key: str, spec: TransformSpec | None) -> None:
        headers = self.request.headers
        principal = self.principal
        answer = await self.delivery.deliver(MediaRequest(
            key, spec, self.request.host, None if principal is None else principal.user.id,
            expires=self.get_query_argument("expires", None),
            signature=self.get_query_argument("signature", None),
            head=self.request.method == "HEAD", attachment=self.attachment,
            if_none_match=headers.get("If-None-Match"), if_modified_since=headers.get("If-Modified-Since"),
            range=headers.get("Range"), if_range=headers.get("If-Range"),
            proxy_cache=headers.get("X-Mediasrv-Cache") == "1" and self.from_our_proxy(),
            client=self.client_ip() if spec is not None else "",
            accept=headers.get("Accept") if spec is not None else None,
            transform_signature=self.get_query_argument(SIGNATURE_PARAM, None) if spec is not None else None))
        await self.write_answer(answer)

    async def write_answer(self, answer: MediaAnswer) -> None:
        if answer.private:
            self.cors_private()  # before a failure too: its error answer stays unreadable elsewhere
        if answer.failure is not None:
            raise answer.failure
        if answer.status != 200:
            self.set_status(answer.status)
        for name, value in answer.headers.items():
            self.set_header(name, value)
        if answer.stream is not None:
            await self._stream(answer.stream)
            return
        self.finish(answer.body)  # headers and a small body in one socket write

    async def _stream(self, stream: BlobStream) -> None:
        async with contextlib.aclosing(stream):  # the blob is closed on every path
            try:
                self.write(stream.first)
                await self.flush()
                async for chunk in stream.rest:
                    self.write(chunk)
                    await self.flush()  # flow control: wait for the socket before reading more
            except StreamClosedError:
                return  # the client went away mid-body: nobody to answer, nothing to log
        self.finish()


class MediaHandler(ServeBase):
    """/m/:key: inline serving, with optional width, height and format."""

    async def get(self, key: str) -> None:
        await self.serve(key, parse_transform(self.request.query_arguments))


class DownloadHandler(ServeBase):
    """/d/:key: the stored bytes as an attachment; never rate limited."""

    attachment = True
