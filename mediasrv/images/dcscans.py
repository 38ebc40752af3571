"""A progressive JPEG decoded at 1/8 needs only its DC scans: the same pixels from a shorter stream.

At libjpeg's 1/8 scale each 8x8 block of a full-resolution component becomes one pixel, its DC
term (``jpeg_idct_1x1``): the AC coefficients are decoded and then never used. A baseline JPEG
interleaves them with the DC terms, so they cannot be skipped; a progressive one sends them in
scans of their own, which are skipped here by not handing them to the decoder. libjpeg-turbo
then Huffman-decodes about a sixth of the data (a real 3840x2400 wallpaper: 227 KB of 1.55 MB).

One catch keeps the pixels identical. A progressive component with no AC data at all is "DC
only" to libjpeg-turbo (2.1 and later), which then smooths its DC terms over a 5x5 block
neighbourhood (``decompress_smooth_data``'s ``change_dc``): different pixels. So each component
whose AC scans were left out gets one scan in their place that codes all 63 AC terms of every
block as exactly zero (end-of-band runs, a two-symbol Huffman table). Every coefficient is then
known to full precision, libjpeg applies no smoothing at all, and the 1x1 IDCT reads the DC
terms it would have read. ``tests/images/test_dcscans.py`` compares the pixels with the whole
stream's for each sampling and progression. The decode of that wallpaper at 1/8 went from 78
to 47 ms (24 ms with huge pages, ``allocator``; Pillow's, as thumbor decodes it: 68 ms).

Only the scans of components at full resolution are left out: a subsampled chroma component at
1/8 may be decoded with a 2x2 IDCT, which reads AC terms. A stream whose scans do not end where
its markers say (truncated, no EOI) is not shortened: the whole one decides, as before.
"""
from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator

__all__ = ["DC_SCALE", "dc_scans_only"]

DC_SCALE = 8
"""The libjpeg scale (1/8) at which a full-resolution block is its DC term alone."""

_PROGRESSIVE_HUFFMAN = 0xC2
_OTHER_FRAMES = frozenset({0xC0, 0xC1, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_SOS, _EOI = 0xDA, 0xD9
_KEPT_APPS = frozenset({0xE0, 0xEE})
"""JFIF and Adobe: they tell libjpeg the colour space. Other APPn and COM segments (EXIF, XMP,
ICC: read from the original by ``metadata``) are not copied to the shorter stream."""
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")
"""The end of a scan's entropy-coded data: 0xFF not stuffed (00) nor a restart (D0-D7). A fill
byte (FF FF) matches too and is skipped by the walk."""

EOB_RUN_MAX = 32767
"""The longest end-of-band run one symbol codes (EOB14: 2^14 + 14 more bits)."""
_NO_RESTARTS = b"\xff\xdd\x00\x04\x00\x00"


def dc_scans_only(data: bytes | mmap.mmap) -> bytes | None:
    """``data`` without the AC scans of its full-resolution components, each replaced by a
    stand-in scan (see above), for a decode at 1/8; None when there is nothing to leave out
    (not a Huffman progressive JPEG, no such scan) or the stream is not well formed."""
    try:
        return _shortened(data)
    except (IndexError, struct.error):
        return None  # a segment runs past the end: the decoder reads the whole stream and says


def _shortened(data: bytes | mmap.mmap) -> bytes | None:
    """The walk of ``dc_scans_only``: segments, then each scan's entropy-coded data to the next
    marker, copying what is kept."""
    size = len(data)
    if data[:2] != b"\xff\xd8":
        return None
    parts: list[bytes] = [b"\xff\xd8"]
    blocks: dict[int, int] | None = None  # full-resolution component id -> its blocks
    left_out: dict[int, int] = {}
    pos = 2
    while pos + 2 <= size:
        if data[pos] != 0xFF:
            return None
        code = data[pos + 1]
        if code == 0xFF:  # fill byte
            pos += 1
            continue
        if code == _EOI:
            if blocks is None or not left_out:
                return None
            return b"".join([*parts, _NO_RESTARTS, *(_stand_in_scan(cid, n) for cid, n in left_out.items()),
                             b"\xff\xd9"])
        end = pos + 2 + struct.unpack_from(">H", data, pos + 2)[0]
        if code in _OTHER_FRAMES or (code == _PROGRESSIVE_HUFFMAN and blocks is not None):
            return None
        if code == _PROGRESSIVE_HUFFMAN:
            blocks = _full_resolution_blocks(data[pos + 4:end])
        if code != _SOS:
            if not (0xE1 <= code <= 0xEF or code == 0xFE) or code in _KEPT_APPS:
                parts.append(data[pos:end])
            pos = end
            continue
        if blocks is None:
            return None
        found = _MARKER.search(data, end)
        if found is None:
            return None  # no marker after the scan: truncated
        component = _ac_component(data[pos + 4:end])
        if component in blocks:
            left_out[component] = blocks[component]
        else:
            parts.append(data[pos:found.start()])
        pos = found.start()
    return None


def _full_resolution_blocks(sof: bytes) -> dict[int, int]:
    """SOF2: each full-resolution component's id and its count of 8x8 blocks in a scan of its
    own (ceil(width / 8) x ceil(height / 8))."""
    height, width, count = struct.unpack_from(">HHB", sof, 1)
    sampling = {sof[6 + 3 * k]: sof[7 + 3 * k] for k in range(count)}
    widest = max(s >> 4 for s in sampling.values())
    tallest = max(s & 15 for s in sampling.values())
    return {cid: -(-width // 8) * -(-height // 8) for cid, s in sampling.items()
            if s >> 4 == widest and s & 15 == tallest}


def _ac_component(sos: bytes) -> int | None:
    """The component an AC scan (spectral start above 0; one component, as the standard
    requires) codes, or None for a DC scan."""
    count = sos[0]
    spectral_start = sos[1 + 2 * count]
    return sos[1] if spectral_start > 0 and count == 1 else None


def _eob_runs(blocks: int) -> Iterator[int]:
    while blocks > 0:
        run = min(blocks, EOB_RUN_MAX)
        yield run
        blocks -= run


def _stand_in_scan(component: int, blocks: int) -> bytes:
    """A DHT and an AC-first scan of coefficients 1-63, no shift, coding every block of
    ``component`` as an end-of-band run: EOBn symbols (n << 4) with 2-bit codes, each followed
    by n bits of the run length above 2^n."""
    runs = list(_eob_runs(blocks))
    symbols = sorted({(run.bit_length() - 1) << 4 for run in runs})
    table = b"\x10" + bytes([0, len(symbols)] + [0] * 14) + bytes(symbols)  # AC table 0; 2-bit codes
    bits, count = 0, 0
    for run in runs:
        extra = run.bit_length() - 1
        bits = (bits << 2 + extra) | (symbols.index(extra << 4) << extra) | (run - (1 << extra))
        count += 2 + extra
    pad = -count % 8
    bits = (bits << pad) | ((1 << pad) - 1)  # padded with 1 bits, as the standard says
    entropy = bits.to_bytes((count + pad) // 8, "big").replace(b"\xff", b"\xff\x00")
    return b"".join((b"\xff\xc4", struct.pack(">H", 2 + len(table)), table,
                     b"\xff\xda", struct.pack(">HBBBBBB", 8, 1, component, 0x00, 1, 63, 0),
                     entropy))
