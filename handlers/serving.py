"""The hot path's transport: GET/HEAD /m/:key (passthrough or resize) and /d/:key (download),
with their route rows and OpenAPI operations.

Parse, ask ``MediaDelivery`` once, write its answer. Every decision (record, host and privacy,
representation, validators, 304, Range, X-Accel-Redirect or bytes, usage counting) is made in
``mediasrv.core.delivery.service``; what stays here is Tornado's: CORS for private files, the
socket's flow control and a client that goes away mid-body.

Hot public answers (a cached file or variant, no credential, no Range) never reach these
handlers: ``handlers.hot_media`` writes them from the same ``MediaDelivery.deliver_cached``
without a ``RequestHandler``, and hands everything else here unchanged.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from typing import ClassVar

from tornado.iostream import StreamClosedError

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.delivery.answer import BlobStream, MediaAnswer, MediaRequest
from mediasrv.core.delivery.service import MediaDelivery
from mediasrv.core.files.content_types import OCTET_STREAM
from mediasrv.core.limits.ratelimit import Limit
from mediasrv.images.pipeline import ENCODERS
from mediasrv.images.policy import SIGNATURE_PARAM
from mediasrv.images.spec import AUTO, FITS, GRAVITIES, TransformSpec, read_query
from mediasrv.images.vips import OUTPUT_TYPES
from mediasrv.web.cors import CorsMode
from mediasrv.web.openapi_parts import DocContext, Json, error, header_refs, ref, typed
from mediasrv.web.routespec import OPTIONAL, Route


def _absent(_name: str) -> None:
    """A query argument of a request that has no query string."""
    return None


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

    async def serve(self, key: str, spec: TransformSpec | None, canonical: str | None = None) -> None:
        headers = self.request.headers
        principal = self.principal
        query = self._query_argument if self.request.query_arguments else _absent  # most /m have none
        answer = await self.delivery.deliver(MediaRequest(
            key, spec, self.request.host, None if principal is None else principal.user.id,
            expires=query("expires"), signature=query("signature"),
            head=self.request.method == "HEAD", attachment=self.attachment,
            if_none_match=headers.get("If-None-Match"), if_modified_since=headers.get("If-Modified-Since"),
            range=headers.get("Range"), if_range=headers.get("If-Range"),
            proxy_cache=headers.get("X-Mediasrv-Cache") == "1" and self.from_our_proxy(),
            client=self.client_ip() if spec is not None else "",
            accept=headers.get("Accept") if spec is not None else None,
            transform_signature=query(SIGNATURE_PARAM) if spec is not None else None,
            canonical_query=canonical))
        await self.write_answer(answer)

    def _query_argument(self, name: str) -> str | None:
        return self.get_query_argument(name, None)

    async def write_answer(self, answer: MediaAnswer) -> None:
        if answer.private:
            self.cors_private()  # before a failure too: its error answer stays unreadable elsewhere
        if answer.failure is not None:
            raise answer.failure
        if answer.status != 200:
            self.set_status(answer.status)
        for name, value in answer.headers.items():
            self.set_header(name, value)
        if answer.accel is not None:  # the access line says what nginx sends, not the empty 200 it gets
            accel = answer.accel
            self.relayed = (accel.status, accel.length)
            self.access_extra = (("sent_by", "nginx"),) + ((("range", accel.content_range.removeprefix("bytes ")),)
                                                           if accel.content_range else ())
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
    """/m/:key: inline serving, with optional width, height, fit, format and quality."""

    media_kind = "resize"
    """passthrough or resize (a transform asked for, valid or not): /metrics counts them apart."""

    async def get(self, key: str) -> None:
        parsed = read_query(self.request.query)
        if parsed.spec is None:
            self.media_kind = "passthrough"
        await self.serve(key, parsed.spec, parsed.canonical)


class DownloadHandler(ServeBase):
    """/d/:key: the stored bytes as an attachment; never rate limited."""

    attachment = True


# ---------------------------------------------------------------------------- OpenAPI operations

def _binary_content(media_types: Sequence[str]) -> Json:
    """Concrete binary media types, so that generated clients return bytes, never parse JSON."""
    return {t: {"schema": typed("string", format="binary")} for t in media_types}


def _served(description: str, *, head: bool, media_types: Sequence[str] = (OCTET_STREAM,),
            **headers: str) -> Json:
    names = {"ETag": "ETag", "Last-Modified": "LastModified", "Cache-Control": "CacheControl",
             "Accept-Ranges": "AcceptRanges", "Content-Length": "ContentLength",
             "X-Content-Type-Options": "NoSniff", **headers}
    response: Json = {"description": description, "headers": header_refs(**names)}
    if not head:
        response["content"] = _binary_content(media_types)
    return response


def _serving(ctx: DocContext, *, head: bool, download: bool) -> Json:
    extra = {"Content-Disposition": "ContentDisposition"} if download else {}
    # /m answers a resize with one of the output image types; anything else (and /d) with the
    # stored type, which the document cannot know: application/octet-stream stands for it.
    types = [OCTET_STREAM] if download else [OCTET_STREAM, *(
        OUTPUT_TYPES[f] for f in ctx.formats if f in OUTPUT_TYPES)]
    return {
        "200": _served("The bytes, with their stored Content-Type (or the output format's for a "
                       "resize)." + (" Without a body for HEAD." if head else ""), head=head,
                       media_types=types, **extra),
        "206": _served("The requested byte range.", head=head, media_types=types,
                       **{"Content-Range": "ContentRange"}, **extra),
        "304": ref("NotModified", "responses"),
        "404": error("No such file, or a private file without the owner's credential or a valid "
                     "signature."),
        "410": error("A signed link of this private file, made by its owner, past its `expires` "
                     "(LINK_EXPIRED): ask the owner for a new one. A link altered or made for another "
                     "file is 404."),
        "416": ref("RangeNotSatisfiable", "responses"),
    }


def _quality_defaults() -> str:
    """``jpeg 82, webp 80, avif 50``: the encoders' own qualities, as ``pipeline.ENCODERS`` fixes them."""
    return ", ".join(f"{fmt} {enc.quality}" for fmt, enc in ENCODERS.items() if enc.quality is not None)


def _transform_parameters(ctx: DocContext) -> list[Json]:
    """/m's own query parameters besides width and height (``images/spec.py`` parses them and
    ``images/policy.py`` checks ``tsig``): written here, beside the only route that takes them."""
    def query(name: str, description: str, schema: Json) -> Json:
        return {"name": name, "in": "query", "description": description, "schema": schema}

    # No schema ``default``s: a generated client sends a parameter's default whenever the
    # caller leaves it out, and a default spelled out is not the variant's canonical URL (308)
    # or, for gravity without fit=cover, a 400. The descriptions say what the defaults are.

    return [
        query("format", "convert to this image format (any case; `jpg` means `jpeg`). `auto` picks AVIF, "
              "else WebP, from those the request's `Accept` header names explicitly (`*/*` and `image/*` "
              "promise neither), else keeps the source's format; the answer then carries `Vary: Accept` "
              "and an ETag per choice", typed("string", enum=[*ctx.formats, AUTO])),
        query("fit", "how the image fills the width x height box: `contain` fits it whole inside (the "
              "default), `cover` fills the box and crops the overflow where `gravity` says (needs both "
              "width and height: else 400 COVER_NEEDS_BOX). Never enlarged either way",
              typed("string", enum=list(FITS))),
        query("gravity", "with fit=cover, what the crop keeps: a side or corner (`north`, `southeast`...), "
              "`center` (the default), `attention` (libvips' saliency: skin, saturated colour, edges), "
              "`entropy` (the most detailed part) or `focal` (the point the owner stored with PATCH "
              "/files/{id}; without one, as `attention`). Without fit=cover: 400 GRAVITY_NEEDS_COVER",
              typed("string", enum=list(GRAVITIES))),
        query("dpr", "device pixel ratio, 1 to 4 with at most two decimals: multiplies width and height "
              "(`width=320&dpr=2` is 640 pixels wide), never past the source's size; needs width or height "
              "(DPR_NEEDS_BOX). Part of the variant's ETag", typed("number", minimum=1, maximum=4)),
        query("animated", "an animated GIF or WebP stays animated, every frame resized, when the output can "
              "animate (GIF, WebP; `format=auto` then picks WebP or the source's format); `false` takes "
              "the first frame. An animation of more frames than the server keeps "
              "(MEDIASRV_MAX_ANIMATION_FRAMES), or of more than 4 x MEDIASRV_MAX_IMAGE_PIXELS pixels in all its "
              "frames, is 422 TOO_MANY_FRAMES unless `false`",
              typed("boolean")),
        query("blur", "Gaussian blur sigma in output pixels, 0.3 to 100 (backgrounds, spoilers)",
              typed("number", minimum=0.3, maximum=100)),
        query("sharpen", "unsharp-mask sigma, 0.3 to 10, applied after the resize",
              typed("number", minimum=0.3, maximum=10)),
        query("bg", "the colour (RRGGBB hex) transparency becomes in an output without alpha (JPEG); "
              "default white", typed("string", pattern="^[0-9a-fA-F]{6}$")),
        query("v", "ignored: a cache-buster a page may add to make a new URL for the same variant",
              typed("string")),
        query("quality", "encoder quality of a lossy output; unset, each format's own "
              f"({_quality_defaults()}); PNG and GIF ignore it. Alone it re-encodes at the stored size",
              typed("integer", minimum=1, maximum=100)),
        query(SIGNATURE_PARAM, "transform signature, needed only where the server's owner signs transforms "
              "(MEDIASRV_TRANSFORM_KEY) and this transform is outside the allowed lists: the first 32 hex "
              "digits of HMAC-SHA256(key, `<id>:<spec>`), where `<spec>` is the canonical form, e.g. "
              "`w320-h-fwebp`, `w100-h100-f-q70-cover` (the variant part of the answer's ETag)",
              typed("string", pattern="^[0-9a-fA-F]{32}$")),
    ]


def _media(ctx: DocContext, *, head: bool = False) -> Json:
    responses = _serving(ctx, head=head, download=False)
    vary = {"description": "`Accept` when format=auto chose the output format; a private file's answer "
                           "also names `Authorization, X-Api-Key`", "schema": typed("string")}
    for status in ("200", "206"):
        responses[status]["headers"]["Vary"] = vary
    responses.update({
        "308": {"description": "The same variant under its one URL (`Location`, relative: the id and "
                       "the query as /m writes it: defaults left out, values in their canonical "
                       "spelling, e.g. `format=jpg` is `format=jpeg`, `dpr=2.0` is `dpr=2`), so a cache "
                       "keyed on the URL holds each variant once. Decided from the URL alone.",
                "headers": header_refs(Location="Location")},
        "400": error("A query parameter /m does not take (UNKNOWN_PARAMETER, naming it and the known ones; "
                     "`v`, `expires`, `signature` and `tsig` are the only others), invalid width, height, "
                     "format, fit, quality, gravity, dpr, animated, blur, sharpen or bg (INVALID_FORMAT, "
                     "INVALID_FIT, INVALID_QUALITY, INVALID_GRAVITY, INVALID_DPR, INVALID_ANIMATED, "
                     "INVALID_BLUR, INVALID_SHARPEN, INVALID_BG, COVER_NEEDS_BOX, GRAVITY_NEEDS_COVER, "
                     "DPR_NEEDS_BOX), a parameter name written with a percent-escape "
                     "(INVALID_PARAMETER_NAME), resize parameters on a non-image (NOT_AN_IMAGE), or "
                     "a transform the server's owner does not allow (TRANSFORM_NOT_ALLOWED, "
                     "TRANSFORM_SIGNATURE_REQUIRED, INVALID_TRANSFORM_SIGNATURE)."),
        "422": error("The image cannot be processed (e.g. over the pixel limit or the memory budget, more "
                     "metadata than a transform takes: IMAGE_METADATA_TOO_LARGE, or an animation of more "
                     "frames than the server keeps animated: TOO_MANY_FRAMES)."),
        "503": ref("ServerBusy", "responses")})
    parameters = [ref(name, "parameters") for name in ("FileId", "Width", "Height")]
    parameters += _transform_parameters(ctx)
    parameters += [ref(name, "parameters") for name in ("Expires", "Signature", "Range", "IfNoneMatch")]
    return {"description": "With none of the transform parameters (or only `v`): the stored bytes unchanged. "
                           "With any of them: a resized or converted image (one dimension keeps the "
                           "aspect ratio; both: fit=contain fits inside the box, fit=cover fills it and "
                           "crops; never enlarged), using one of "
                           f"{ctx.resize_slots} concurrent resize slots. Browser-executable content "
                           "(HTML, SVG, XML) is never served to run on this origin. A server's owner may "
                           "limit the transforms it makes to listed values, signed ones (`tsig`), or both.",
            "parameters": parameters,
            "responses": responses}


def _download(ctx: DocContext, *, head: bool = False) -> Json:
    names = ("FileId", "Expires", "Signature", "Range", "IfNoneMatch")
    return {"description": "The stored bytes with `Content-Disposition: attachment`.",
            "parameters": [ref(name, "parameters") for name in names],
            "responses": _serving(ctx, head=head, download=True)}


# ---------------------------------------------------------------------------- routes

MEDIA_LIMIT = Limit("media", 400, "ip", proxy_counted=True)
"""/m per client address; the nginx sidecar counts it itself and reads its size from the
for-agents document (`mediasrv sidecar`)."""
_DELIVERY = {"deps": "delivery"}

ROUTES: tuple[Route, ...] = (
    Route("GET", "/m/{id}", OPTIONAL, MediaHandler, "serving", "getMedia",
          "Serve a file inline, optionally resized, cropped, filtered or converted", _media,
          MEDIA_LIMIT, args=_DELIVERY),
    Route("HEAD", "/m/{id}", OPTIONAL, MediaHandler, "serving", "headMedia", "Headers of GET /m/{id} without the body",
          partial(_media, head=True), MEDIA_LIMIT, args=_DELIVERY),
    Route("GET", "/d/{id}", OPTIONAL, DownloadHandler, "serving", "downloadFile", "Download a file as an attachment",
          _download, declared_unlimited=True, args=_DELIVERY),
    Route("HEAD", "/d/{id}", OPTIONAL, DownloadHandler, "serving", "headDownload",
          "Headers of GET /d/{id} without the body", partial(_download, head=True), declared_unlimited=True,
          args=_DELIVERY),
)
