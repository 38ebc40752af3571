"""What an image's loader will hold besides its pixels, read in pure Python before libvips runs.

A loader keeps an image's metadata in memory: PNG text and ICC chunks inflated, JPEG APPn
segments (EXIF, XMP, ICC, IPTC), WebP's EXIF/XMP/ICCP chunks, every TIFF tag's values. The
pixel estimate (``cost``) knows nothing of it, and PNG's zTXt, iTXt and iCCP chunks are deflated:
a 430 KB PNG with 60 zTXt chunks of 7 MiB each made libvips hold 1.5 GB for a 64x48 picture.
So every transform starts here (``pipeline.check_metadata``): the container is walked (chunk and
segment headers, never the pixels), compressed metadata is inflated only as far as the budget
allows, and an image over budget is refused (422 IMAGE_METADATA_TOO_LARGE) before any libvips
call. The same walk reads a JPEG's or WebP's EXIF orientation, which ``pipeline`` needs to pick
the decoder's shrink before it opens the image (once).

Two budgets, because the two kinds of metadata cost differently: bytes stored as they are cost
at most the file's own size (a camera's 7 MB XMP is real and is served); deflated bytes cost up
to 1,032 times their size, and real images carry little of it (an ICC profile, an XMP packet).
A job reserves memory for the metadata a file of its kind usually has (``cost``); one that
finds more here has the difference reserved before libvips runs (``ReservationTooSmall``).
"""
from __future__ import annotations

import contextlib
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from mediasrv.base.errors import UnprocessableImage
from mediasrv.images.headers import is_jpeg_frame, is_standalone_marker, jpeg_layout
from mediasrv.images.layout import PixelLayout

__all__ = [
    "INFLATED_BUDGET_BYTES",
    "INFLATED_COPIES",
    "MAX_FRAMES_COUNTED",
    "MAX_METADATA_ITEMS",
    "RAW_BUDGET_BYTES",
    "RAW_COPIES",
    "JpegFrame",
    "MetadataFacts",
    "ReadAt",
    "check_metadata",
    "scan_metadata",
]

RAW_BUDGET_BYTES = 64 * 1024 * 1024
"""Metadata stored uncompressed (JPEG APPn, WebP chunks, TIFF tags, PNG tEXt/eXIf) one image
may carry and still be transformed: real files reach a few MB (7.3 MB of Adobe XMP seen in a
photograph from a public set); a loader holds it about twice (its buffer and the image's copy)."""
INFLATED_BUDGET_BYTES = 4 * 1024 * 1024
"""Deflated metadata (PNG zTXt, compressed iTXt, iCCP), measured inflated: an ICC profile is
3 KB to 1 MB, an XMP packet some KB; beyond this a file is refused, whatever its size."""
RAW_COPIES = 2
"""Metadata stored as it is, held about twice (measured, libvips 8.18: a JPEG with 30 MB of APP1
segments costs 29 MB at the header read and as much again at the decode)."""
INFLATED_COPIES = 5
"""Deflated metadata, held about five times inflated (libspng's text and libvips' string copy,
at the header read and again at the decode: 4 MiB of zTXt cost 21 MB)."""
MAX_FRAMES_COUNTED = 100_001
"""An animation's frames are counted up to this (one more than MEDIASRV_MAX_ANIMATION_FRAMES'
ceiling): enough to refuse any longer one, and the walk of a file of tiny frames stays bounded."""
MAX_METADATA_ITEMS = 4096
"""Metadata chunks or segments walked at most: each is a read here and an allocation in the
loader, so a file of a million empty text chunks is refused as over budget too."""
_INFLATE_STEP = 64 * 1024

ReadAt = Callable[[int, int], bytes]
"""``read_at(offset, n)``: up to ``n`` bytes of the file from ``offset`` (fewer at its end)."""

_PROGRESSIVE_FRAMES = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_ICC_SIGNATURE = b"ICC_PROFILE\x00"


@dataclass(frozen=True)
class JpegFrame:
    """A JPEG's first frame header (SOFn), as the segment walk found it: what ``jpeg`` needs to
    know before it decodes (which decoder, how much memory)."""

    marker: int
    """The SOFn code: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ..."""
    precision: int
    components: tuple[tuple[int, int], ...]
    """Each component's (horizontal, vertical) sampling factors, in frame order."""

    @property
    def progressive(self) -> bool:
        return self.marker in _PROGRESSIVE_FRAMES

    @property
    def layout(self) -> PixelLayout:
        return jpeg_layout(self.precision, len(self.components))


@dataclass(frozen=True)
class MetadataFacts:
    """What a walk of the container found: metadata bytes by kind, and the EXIF orientation."""

    raw_bytes: int = 0
    inflated_bytes: int = 0
    items: int = 0
    orientation: int = 1
    """EXIF orientation 1..8 (JPEG APP1 Exif, WebP EXIF chunk); 1 when there is none."""
    frame: tuple[int, int] | None = None
    """A JPEG's (width, height) from its first frame header, found by walking the segments
    (however much metadata precedes it), or None."""
    jpeg: JpegFrame | None = None
    """The rest of that frame header: coding, precision, components."""
    icc: tuple[tuple[int, int], ...] = ()
    """A JPEG's ICC profile, as (offset, length) of each APP2 chunk's data, in sequence order."""
    frames: int = 1
    """Frames of an animated GIF (image descriptors) or WebP (ANMF chunks), as far as the walk
    counted them (``MAX_FRAMES_COUNTED``); 1 for every other image."""

    @property
    def held_bytes(self) -> int:
        """What the loader holds for this metadata, at its peak (``RAW_COPIES``, ``INFLATED_COPIES``)."""
        return RAW_COPIES * self.raw_bytes + INFLATED_COPIES * self.inflated_bytes

    @property
    def over_budget(self) -> bool:
        return _over_budget(self.raw_bytes, self.inflated_bytes, self.items)


def _over_budget(raw: int, inflated: int, items: int) -> bool:
    return raw > RAW_BUDGET_BYTES or inflated > INFLATED_BUDGET_BYTES or items > MAX_METADATA_ITEMS


class _Tally:
    """The running totals of one walk; stops early once any budget is passed."""

    def __init__(self) -> None:
        self.raw = self.inflated = self.items = 0
        self.orientation = 1
        self.frame: tuple[int, int] | None = None
        self.jpeg: JpegFrame | None = None
        self.icc: list[tuple[int, int, int]] = []  # (sequence number, offset, length)
        self.frames = 0

    def add_raw(self, n: int) -> None:
        self.raw += max(0, n)
        self.items += 1

    @property
    def inflate_room(self) -> int:
        return max(0, INFLATED_BUDGET_BYTES - self.inflated)

    @property
    def done(self) -> bool:
        """Asked before every segment or chunk: the totals alone, not a ``facts()`` built each time."""
        return _over_budget(self.raw, self.inflated, self.items)

    def facts(self) -> MetadataFacts:
        icc = tuple((offset, length) for _seq, offset, length in sorted(self.icc))
        return MetadataFacts(self.raw, self.inflated, self.items, self.orientation, self.frame, self.jpeg, icc,
                             max(1, self.frames))


def scan_metadata(read_at: ReadAt, size: int, fmt: str | None) -> MetadataFacts:
    """Walk a ``fmt`` image (the names ``sniff.image_format`` gives) of ``size`` bytes and
    total its metadata, and count an animation's frames; stops as soon as a budget is passed.
    Formats whose loader keeps no metadata worth pricing (GIF: libnsgif keeps no comments, only
    its frames are counted; HEIF: its EXIF/XMP items are stored as they are, bounded by the file)
    give zeros. A malformed container is walked as far
    as it is readable: the loader refuses it later, with the file's bytes and not ours."""
    walk = _WALKERS.get(fmt or "")
    tally = _Tally()
    if walk is not None:
        with contextlib.suppress(struct.error, IndexError, ValueError):
            walk(read_at, size, tally)
    return tally.facts()


def check_metadata(read_at: ReadAt, size: int, fmt: str | None) -> MetadataFacts:
    """``scan_metadata``, refusing an image over budget with UnprocessableImage."""
    facts = scan_metadata(read_at, size, fmt)
    if facts.over_budget:
        raise UnprocessableImage(
            "The image carries too much metadata (text, EXIF, XMP or ICC) to be resized or converted",
            code="IMAGE_METADATA_TOO_LARGE")
    return facts


# ---------------------------------------------------------------------------- PNG

_PNG_RAW_CHUNKS = frozenset({b"tEXt", b"eXIf"})


def _png(read_at: ReadAt, size: int, tally: _Tally) -> None:
    """Every chunk, before and after the image data (a libpng-based loader reads text at the
    end too): tEXt and eXIf as stored, zTXt, iTXt and iCCP inflated."""
    pos = 8
    while pos + 8 <= size and not tally.done:
        length, kind = struct.unpack(">I4s", read_at(pos, 8))
        body = pos + 8
        if kind == b"IEND":
            return
        if kind in _PNG_RAW_CHUNKS:
            tally.add_raw(length)
        elif kind in (b"zTXt", b"iCCP", b"iTXt"):
            _png_text(read_at, kind, body, min(length, size - body), tally)
        pos = body + length + 4  # data, then the CRC


def _png_text(read_at: ReadAt, kind: bytes, body: int, length: int, tally: _Tally) -> None:
    """A zTXt or iCCP (keyword, NUL, method, deflated data) or an iTXt (keyword, NUL, flag,
    method, language, NUL, translated keyword, NUL, text deflated when the flag is set)."""
    head = read_at(body, min(length, 80 + 2 + 160))
    keyword_end = head.find(b"\x00")
    if keyword_end < 0:
        tally.add_raw(length)  # malformed: the loader skips it; priced as stored
        return
    start = keyword_end + 2
    compressed = True
    if kind == b"iTXt":
        compressed = head[keyword_end + 1:keyword_end + 2] == b"\x01"
        language_end = head.find(b"\x00", keyword_end + 3)
        translated_end = head.find(b"\x00", language_end + 1) if language_end >= 0 else -1
        if translated_end < 0:
            tally.add_raw(length)
            return
        start = translated_end + 1
    if not compressed:
        tally.add_raw(length)
        return
    tally.items += 1
    tally.inflated += _inflated_size(read_at, body + start, length - start, tally.inflate_room)


def _inflated_size(read_at: ReadAt, start: int, length: int, room: int) -> int:
    """The inflated size of ``length`` deflated bytes at ``start``, or ``room + 1`` as soon as
    it passes ``room``: inflating stops there, so the work of a whole walk is bounded by the
    budget, however many chunks claim what."""
    if length <= 0:
        return 0
    inflater = zlib.decompressobj()
    total, offset = 0, start
    try:
        while offset < start + length and total <= room and not inflater.eof:
            block = read_at(offset, min(_INFLATE_STEP, start + length - offset))
            if not block:
                break
            offset += len(block)
            data = block
            while data and total <= room:
                total += len(inflater.decompress(data, room + 1 - total))
                data = inflater.unconsumed_tail
    except zlib.error:
        pass  # corrupt: the loader refuses or skips it; what inflated so far counts
    return total


# ---------------------------------------------------------------------------- JPEG


def _jpeg(read_at: ReadAt, size: int, tally: _Tally) -> None:
    """APPn and COM segments up to the first scan (where libjpeg's header read stops), the
    orientation from an APP1 Exif segment, where the ICC profile's APP2 chunks lie, and the
    first frame header."""
    pos = 2
    while pos + 4 <= size and not tally.done:
        marker = read_at(pos, 4)
        if marker[0] != 0xFF:
            return  # not a segment boundary: the loader decides what this file is
        code = marker[1]
        if code == 0xFF:
            pos += 1  # fill byte
            continue
        if is_standalone_marker(code):
            pos += 2
            continue
        if code in (0xDA, 0xD9):
            return
        length = struct.unpack(">H", marker[2:4])[0]
        if is_jpeg_frame(code) and tally.frame is None:
            _jpeg_frame(read_at(pos + 4, min(length - 2, 6 + 3 * 255)), code, tally)
        if 0xE0 <= code <= 0xEF or code == 0xFE:
            tally.add_raw(length - 2)
            if code == 0xE2 and length - 2 > len(_ICC_SIGNATURE) + 2:
                head = read_at(pos + 4, len(_ICC_SIGNATURE) + 2)
                if head.startswith(_ICC_SIGNATURE):
                    body = len(_ICC_SIGNATURE) + 2  # the signature, then sequence number and count
                    tally.icc.append((head[-2], pos + 4 + body, length - 2 - body))
            if code == 0xE1 and tally.orientation == 1:
                segment = read_at(pos + 4, min(length - 2, 64 * 1024))
                if segment.startswith(b"Exif\x00\x00"):
                    tally.orientation = exif_orientation(segment[6:])
        pos += 2 + length


def _jpeg_frame(sof: bytes, code: int, tally: _Tally) -> None:
    """SOFn: precision, height, width, component count, then (id, sampling, table) each."""
    precision, height, width, count = struct.unpack(">BHHB", sof[:6])
    if not (width and height):
        return
    tally.frame = (width, height)
    sampling = tuple((sof[7 + 3 * k] >> 4, sof[7 + 3 * k] & 15) for k in range(count))
    tally.jpeg = JpegFrame(code, precision, sampling)


# ---------------------------------------------------------------------------- WebP

_WEBP_METADATA = frozenset({b"ICCP", b"EXIF", b"XMP "})


def _webp(read_at: ReadAt, size: int, tally: _Tally) -> None:
    """The RIFF chunks after the header: ICCP, EXIF and XMP as stored, orientation from EXIF, and
    the frames of an animation (ANMF chunks)."""
    pos = 12
    while pos + 8 <= size and not tally.done:
        kind, length = struct.unpack("<4sI", read_at(pos, 8))
        if kind == b"ANMF":
            tally.frames += 1
            if tally.frames >= MAX_FRAMES_COUNTED:
                return
        elif kind in _WEBP_METADATA:
            tally.add_raw(length)
            if kind == b"EXIF":
                exif = read_at(pos + 8, min(length, 64 * 1024))
                tally.orientation = exif_orientation(exif[6:] if exif.startswith(b"Exif\x00\x00") else exif)
        pos += 8 + length + (length & 1)


# ---------------------------------------------------------------------------- GIF

_GIF_WINDOW = 64 * 1024


class _Window:
    """Bytes of the file read ``_GIF_WINDOW`` at a time: a GIF's data is a chain of sub-blocks of at
    most 255 bytes each, and one read per block would be a system call per 255 bytes."""

    def __init__(self, read_at: ReadAt, size: int) -> None:
        self._read_at, self.size = read_at, size
        self._start, self._data = 0, b""

    def byte(self, pos: int) -> int:
        if not self._start <= pos < self._start + len(self._data):
            self._start, self._data = pos, self._read_at(pos, _GIF_WINDOW)
            if not self._data:
                raise IndexError(pos)
        return self._data[pos - self._start]


def _gif(read_at: ReadAt, size: int, tally: _Tally) -> None:
    """The frames of a GIF (image descriptors), walking the blocks: the header and its colour
    table, then extensions and images (each a chain of sub-blocks) up to the trailer. libnsgif
    keeps no comments, so nothing here is priced as metadata."""
    window = _Window(read_at, size)
    flags = window.byte(10)
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    while pos < size:
        block = window.byte(pos)
        if block == 0x3B:  # trailer
            return
        if block == 0x21:  # extension: label, then sub-blocks
            pos += 2
        elif block == 0x2C:  # image: descriptor, local colour table, LZW code size, sub-blocks
            tally.frames += 1
            if tally.frames >= MAX_FRAMES_COUNTED:
                return
            local = window.byte(pos + 9)
            pos += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0) + 1
        else:
            return  # not a block: the loader decides what the rest is
        while (length := window.byte(pos)) != 0:
            pos += length + 1
        pos += 1


# ---------------------------------------------------------------------------- TIFF

_TIFF_TYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8,
                    13: 4, 16: 8, 17: 8, 18: 8}


def _tiff(read_at: ReadAt, size: int, tally: _Tally) -> None:
    """Every value of the first directory (libtiff reads them all, known tags or not): the
    pixel data's offsets are small; XMP, ICC, IPTC and Photoshop blocks are what weighs."""
    head = read_at(0, 8)
    endian = "<" if head[:2] == b"II" else ">"
    ifd = struct.unpack(endian + "I", head[4:8])[0]
    count = struct.unpack(endian + "H", read_at(ifd, 2))[0]
    entries = read_at(ifd + 2, 12 * count)
    for k in range(len(entries) // 12):
        _tag, typ, n = struct.unpack(endian + "HHI", entries[12 * k:12 * k + 8])
        value_bytes = _TIFF_TYPE_BYTES.get(typ, 1) * n
        if value_bytes > 4:
            tally.add_raw(value_bytes)


_WALKERS: dict[str, Callable[[ReadAt, int, _Tally], None]] = {
    "png": _png, "jpeg": _jpeg, "webp": _webp, "tiff": _tiff, "gif": _gif,
}


# ---------------------------------------------------------------------------- EXIF


def exif_orientation(tiff: bytes) -> int:
    """The Orientation tag (0x0112) of IFD0 in an EXIF block (a TIFF structure), 1..8; 1 when
    absent or unreadable."""
    try:
        endian = {b"II": "<", b"MM": ">"}[tiff[:2]]
        ifd = struct.unpack(endian + "I", tiff[4:8])[0]
        count = struct.unpack(endian + "H", tiff[ifd:ifd + 2])[0]
        for k in range(count):
            entry = ifd + 2 + 12 * k
            tag, typ = struct.unpack(endian + "HH", tiff[entry:entry + 4])
            if tag == 0x0112 and typ == 3:
                value = int(struct.unpack(endian + "H", tiff[entry + 8:entry + 10])[0])
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error, IndexError):
        pass
    return 1
