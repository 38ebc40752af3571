"""What an image's header declares, read in pure Python from the first bytes of a file.

The size of the first frame (``header_dimensions``) lets the upload path refuse pixel bombs
and record a file's width and height without libvips; its pixel layout (``header_layout``:
bands and bytes per sample) lets ``cost`` price a transform before anything is decoded. Which
parser reads a file is ``sniff.image_format``'s answer. Every parser takes a possibly truncated
prefix and gives None rather than guess when the bytes it needs are missing or invalid.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from mediasrv.images import sniff
from mediasrv.images.layout import MAX_SAMPLE_BYTES, UNKNOWN_LAYOUT, WORST_LAYOUTS, PixelLayout

__all__ = ["JpegFrameScanner", "header_dimensions", "header_layout", "is_jpeg_frame", "jpeg_layout"]

# ---------------------------------------------------------------------------- dimensions


def _be16(b: bytes, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


def _jpeg_dimensions(b: bytes) -> tuple[int, int] | None:
    frame = _jpeg_frame(b)
    return (frame[0], frame[1]) if frame else None


def _jpeg_frame(b: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, precision, components) from the first SOFn frame header."""
    n = len(b)
    i = 2
    while True:
        # Find the next marker: 0xFF followed by a non-zero, non-0xFF code. Like libjpeg,
        # tolerate stray bytes and fill bytes between segments.
        while i < n and b[i] != 0xFF:
            i += 1
        while i < n and b[i] == 0xFF:
            i += 1
        if i >= n:
            return None
        marker = b[i]
        if marker == 0x00 or is_standalone_marker(marker):
            i += 1  # stuffed byte, RSTn, SOI, TEM: no length field
            continue
        if marker in (0xD9, 0xDA):
            return None  # EOI or start of scan before any frame header
        if i + 2 >= n:
            return None
        length = _be16(b, i + 1)
        if length < 2:
            return None
        if is_jpeg_frame(marker):
            # SOFn: length(2) precision(1) height(2) width(2) components(1)
            if i + 8 > n or length < 7:
                return None
            height, width = _be16(b, i + 4), _be16(b, i + 6)
            components = b[i + 8] if i + 8 < n else 4  # unknown: the widest JPEG (CMYK)
            return (width, height, b[i + 3], components) if width and height else None
        i += 1 + length


class JpegFrameScanner:
    """A JPEG's first frame size from a stream of chunks, reading segment headers only.

    An upload keeps only its first bytes, and a frame header may lie behind megabytes of APPn
    metadata (7.3 MB of Adobe XMP in a real photograph): ``feed`` every chunk and ``frame`` is
    (width, height) once the SOFn segment has gone by, without anything but the few bytes of
    the next segment header being held. It gives up at the first scan or at anything that is
    not a segment boundary (then ``frame`` stays None, as ``header_dimensions`` would say).
    """

    def __init__(self) -> None:
        self.frame: tuple[int, int] | None = None
        self._next = 2  # offset of the next marker: just after SOI
        self._seen = 0  # bytes fed so far
        self._tail = b""  # bytes from ``_next`` on, while a segment header is incomplete
        self._done = False

    def feed(self, chunk: bytes) -> None:
        chunk_at, self._seen = self._seen, self._seen + len(chunk)
        while not self._done and self._next < self._seen:
            if self._next >= chunk_at:
                header = chunk[self._next - chunk_at:self._next - chunk_at + 9]
            else:  # begun in an earlier chunk, whose bytes from ``_next`` on are the tail
                header = (self._tail + chunk)[:9]
            if len(header) < 4 or (is_jpeg_frame(header[1]) and len(header) < 9):
                self._tail = header  # every byte from ``_next`` to what was fed: wait for more
                return
            self._tail = b""
            self._step(header)

    def snapshot(self) -> tuple[int, int, bytes, bool, tuple[int, int] | None]:
        """Where the scan stands, to go on in another request (a resumable upload)."""
        return self._next, self._seen, self._tail, self._done, self.frame

    @classmethod
    def resumed(cls, snapshot: tuple[int, int, bytes, bool, tuple[int, int] | None]) -> JpegFrameScanner:
        scanner = cls()
        scanner._next, scanner._seen, scanner._tail, scanner._done, scanner.frame = snapshot
        return scanner

    def _step(self, header: bytes) -> None:
        """One segment header (marker, length[, SOF fields]) at ``_next``."""
        if header[0] != 0xFF or header[1] in (0xDA, 0xD9, 0x00, 0xFF):
            self._done = True  # a scan, the end, or not a boundary (fill bytes are not expected)
            return
        if is_standalone_marker(header[1]):
            self._next += 2
            return
        if is_jpeg_frame(header[1]):
            height, width = _be16(header, 5), _be16(header, 7)
            self.frame = (width, height) if width and height else None
            self._done = True
            return
        self._next += 2 + _be16(header, 2)


def is_jpeg_frame(marker: int) -> bool:
    """SOF0..SOF15, except DHT (C4), JPG (C8) and DAC (CC), which share the range."""
    return 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC)


def is_standalone_marker(marker: int) -> bool:
    """RST0..RST7, SOI and TEM: markers with no length field after them (libjpeg reads them as
    two bytes wherever they stand)."""
    return 0xD0 <= marker <= 0xD8 or marker == 0x01


def _png_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 24 or b[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", b[16:24])
    return (width, height) if width and height else None


def _gif_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 10:
        return None
    width, height = struct.unpack("<HH", b[6:10])
    # The first frame may extend past the logical screen; decoders then grow the canvas.
    # Look for its image descriptor within the prefix and take the larger extent.
    n = len(b)
    i = 13
    if n > 10 and b[10] & 0x80:
        i += 3 * (2 << (b[10] & 0x07))
    while i < n:
        block = b[i]
        if block == 0x21:  # extension: label, then data sub-blocks until a zero length
            i += 2
            while i < n and b[i]:
                i += b[i] + 1
            i += 1
        elif block == 0x2C:  # image descriptor: left, top, width, height
            if i + 9 > n:
                break
            left, top, fw, fh = struct.unpack("<HHHH", b[i + 1:i + 9])
            width, height = max(width, left + fw), max(height, top + fh)
            break
        else:
            break
    return (width, height) if width and height else None


def _webp_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 30:
        return None
    chunk = b[12:16]
    if chunk == b"VP8 ":
        if b[23:26] != b"\x9d\x01\x2a":
            return None
        width = struct.unpack("<H", b[26:28])[0] & 0x3FFF
        height = struct.unpack("<H", b[28:30])[0] & 0x3FFF
    elif chunk == b"VP8L":
        if b[20] != 0x2F:
            return None
        bits = struct.unpack("<I", b[21:25])[0]
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif chunk == b"VP8X":
        width = int.from_bytes(b[24:27], "little") + 1
        height = int.from_bytes(b[27:30], "little") + 1
    else:
        return None
    return (width, height) if width and height else None


def _tiff_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 8:
        return None
    endian = "<" if b[:2] == b"II" else ">"
    ifd = struct.unpack(endian + "I", b[4:8])[0]
    if ifd + 2 > len(b):
        return None
    count = struct.unpack(endian + "H", b[ifd:ifd + 2])[0]
    found: dict[int, int] = {}
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(b):
            break
        tag, typ = struct.unpack(endian + "HH", b[entry:entry + 4])
        if tag not in (256, 257):
            continue
        if typ == 3:  # SHORT
            found[tag] = struct.unpack(endian + "H", b[entry + 8:entry + 10])[0]
        elif typ == 4:  # LONG
            found[tag] = struct.unpack(endian + "I", b[entry + 8:entry + 12])[0]
    width, height = found.get(256), found.get(257)
    return (width, height) if width and height else None


def _boxes(b: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """Yield (type, payload start, payload end) of ISO-BMFF boxes in b[start:end]."""
    i = start
    end = min(end, len(b))
    while i + 8 <= end:
        size, kind = struct.unpack(">I4s", b[i:i + 8])
        header = 8
        if size == 1:
            if i + 16 > end:
                return
            size = struct.unpack(">Q", b[i + 8:i + 16])[0]
            header = 16
        elif size == 0:
            size = end - i
        if size < header:
            return
        yield kind, i + header, min(i + size, end)
        i += size


def _heif_dimensions(b: bytes) -> tuple[int, int] | None:
    """Size of the primary item from the 'ispe' property (before any 'irot' rotation)."""
    meta = next(((s, e) for kind, s, e in _boxes(b, 0, len(b)) if kind == b"meta"), None)
    if meta is None:
        return None
    primary: int | None = None
    properties: list[tuple[int, int] | None] = []
    associations: dict[int, list[int]] = {}
    for kind, s, e in _boxes(b, meta[0] + 4, meta[1]):  # meta is a full box
        if kind == b"pitm" and e - s >= 6:
            primary = _be16(b, s + 4) if b[s] == 0 else (
                struct.unpack(">I", b[s + 4:s + 8])[0] if e - s >= 8 else None)
        elif kind == b"iprp":
            for sub, ss, se in _boxes(b, s, e):
                if sub == b"ipco":
                    for prop, ps, pe in _boxes(b, ss, se):
                        if prop == b"ispe" and pe - ps >= 12:
                            properties.append(struct.unpack(">II", b[ps + 4:ps + 12]))
                        else:
                            properties.append(None)
                elif sub == b"ipma":
                    associations.update(_ipma(b, ss, se))
    sizes = [p for p in properties if p and p[0] and p[1]]
    if not sizes:
        return None
    if primary is not None:
        for index in associations.get(primary, []):
            ispe = properties[index - 1] if 1 <= index <= len(properties) else None
            if ispe:
                width, height = ispe
                if width and height:
                    return width, height
    return max(sizes, key=lambda wh: wh[0] * wh[1])


def _ipma(b: bytes, s: int, e: int) -> dict[int, list[int]]:
    result: dict[int, list[int]] = {}
    if e - s < 8:
        return result
    version, flags = b[s], int.from_bytes(b[s + 1:s + 4], "big")
    count = struct.unpack(">I", b[s + 4:s + 8])[0]
    i = s + 8
    id_size = 2 if version < 1 else 4
    wide = flags & 1
    for _ in range(count):
        if i + id_size + 1 > e:
            break
        item = int.from_bytes(b[i:i + id_size], "big")
        i += id_size
        n = b[i]
        i += 1
        indexes = []
        for _ in range(n):
            if wide:
                if i + 2 > e:
                    break
                indexes.append(_be16(b, i) & 0x7FFF)
                i += 2
            else:
                if i + 1 > e:
                    break
                indexes.append(b[i] & 0x7F)
                i += 1
        result[item] = indexes
    return result


_DIMENSIONS: dict[str, Callable[[bytes], tuple[int, int] | None]] = {
    "png": _png_dimensions, "gif": _gif_dimensions, "jpeg": _jpeg_dimensions,
    "webp": _webp_dimensions, "tiff": _tiff_dimensions, "heif": _heif_dimensions,
}


def header_dimensions(prefix: bytes) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a file, in pure Python; no libvips.

    ``prefix`` may be a truncated start of the file (e.g. the first 256 KiB of an upload).
    Understands PNG (IHDR), GIF (logical screen, grown by the first frame's extent), JPEG
    (first SOFn, skipping APPn and other segments by length), WebP (VP8, VP8L, VP8X), TIFF
    (first IFD) and AVIF/HEIF ('ispe' of the primary item). None when the format is unknown
    or the needed bytes are missing or invalid.
    """
    fmt = sniff.image_format(bytes(prefix[:sniff.SNIFF_BYTES]))
    if fmt is None:
        return None
    try:
        return _DIMENSIONS[fmt](bytes(prefix))
    except (IndexError, struct.error, ValueError):
        return None


# ---------------------------------------------------------------------------- pixel layout

_PNG_BANDS = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}  # colour type -> channels (palette: RGB + tRNS alpha)


def _png_layout(b: bytes) -> PixelLayout | None:
    if len(b) < 26 or b[12:16] != b"IHDR":
        return None
    depth, colour = b[24], b[25]
    bands = _PNG_BANDS.get(colour)
    if bands is None:
        return None
    return PixelLayout(bands, 2 if depth == 16 and colour != 3 else 1)


def jpeg_layout(precision: int, components: int) -> PixelLayout:
    """What a JPEG frame of ``precision`` bits and ``components`` decodes to: 8-bit samples, or
    16-bit ones for 12-bit JPEG."""
    return PixelLayout(components, 2 if precision > 8 else 1)


def _jpeg_layout(b: bytes) -> PixelLayout | None:
    frame = _jpeg_frame(b)
    return jpeg_layout(frame[2], frame[3]) if frame is not None else None


def _tiff_values(b: bytes, endian: str, typ: int, count: int, field: bytes) -> list[int] | None:
    """The values of one IFD entry (SHORT or LONG), inline or at their offset; None when they
    lie beyond the prefix or have another type."""
    size = {3: 2, 4: 4}.get(typ)
    if size is None or count < 1:
        return None
    code = endian + ("H" if size == 2 else "I") * count
    if size * count <= 4:
        return list(struct.unpack(code, field[:size * count]))
    offset = struct.unpack(endian + "I", field)[0]
    if count > 4096 or offset + size * count > len(b):
        return None
    return list(struct.unpack(code, b[offset:offset + size * count]))


def _tiff_layout(b: bytes) -> PixelLayout | None:
    """From the first IFD: SamplesPerPixel (277), BitsPerSample (258), SampleFormat (339)."""
    if len(b) < 8:
        return None
    endian = "<" if b[:2] == b"II" else ">"
    ifd = struct.unpack(endian + "I", b[4:8])[0]
    if ifd + 2 > len(b):
        return None
    tags: dict[int, list[int] | None] = {}
    for k in range(struct.unpack(endian + "H", b[ifd:ifd + 2])[0]):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(b):
            break
        tag, typ, count = struct.unpack(endian + "HHI", b[entry:entry + 8])
        if tag in (258, 277, 339):
            tags[tag] = _tiff_values(b, endian, typ, count, b[entry + 8:entry + 12])
    bands = (tags.get(277) or [1])[0]
    bits = tags.get(258, [1]) if 258 in tags else [1]
    sample_bytes = MAX_SAMPLE_BYTES if bits is None else max(1, (max(bits) + 7) // 8)
    formats = tags.get(339) or [1]
    return PixelLayout(bands, sample_bytes, floating=any(f in (3, 5, 6) for f in formats))


def _heif_layout(b: bytes) -> PixelLayout:
    """Four bands (an alpha plane may be an auxiliary item); the samples' width from the
    widest 'pixi' property, or 16 bits when there is none (AVIF and HEIC may be 10/12-bit)."""
    depth = 0
    meta = next(((s, e) for kind, s, e in _boxes(b, 0, len(b)) if kind == b"meta"), None)
    for kind, s, e in _boxes(b, meta[0] + 4, meta[1]) if meta else ():
        for sub, ss, se in _boxes(b, s, e) if kind == b"iprp" else ():
            for prop, ps, pe in _boxes(b, ss, se) if sub == b"ipco" else ():
                if prop == b"pixi" and pe - ps >= 5:
                    channels = b[ps + 4]
                    depth = max(depth, *b[ps + 5:min(pe, ps + 5 + channels)], 1)
    return PixelLayout(4, 1 if 0 < depth <= 8 else 2)


_LAYOUTS: dict[str, Callable[[bytes], PixelLayout | None]] = {
    "png": _png_layout, "jpeg": _jpeg_layout, "tiff": _tiff_layout, "heif": _heif_layout,
    "gif": lambda _b: PixelLayout(4, 1), "webp": lambda _b: PixelLayout(4, 1),
}


def header_layout(prefix: bytes, src: str | None) -> PixelLayout:
    """The decoded layout the header of a ``src`` image declares, or the widest that format
    allows when the header (or the format) cannot be read here."""
    parse = _LAYOUTS.get(src or "")
    try:
        layout = parse(bytes(prefix)) if parse is not None else None
    except (IndexError, struct.error, ValueError):
        layout = None
    return layout or WORST_LAYOUTS.get(src or "", UNKNOWN_LAYOUT)

