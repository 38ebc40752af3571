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
1/8 may be decoded with a 2x2 IDCT, which reads AC terms. The walk reads the stream as libjpeg
does (RSTn and TEM have no length, a scan ends at the next marker) and checks each scan it
leaves out as libjpeg would (one component, a defined table, coefficients 1-63, successive
approximation in order); a stream it cannot read so, a truncated one, or a component whose
scans never send a coefficient in 1-9 (libjpeg-turbo smooths its DC terms in the whole stream
too) is not shortened: the whole stream decides, as before. What no walk sees is damage inside
the entropy-coded data of a left-out scan: such a file is answered at 1/8 where libjpeg-turbo
would have warned (libvips, which then decodes the whole file, accepts most such files too).
"""
from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator

from mediasrv.images.headers import is_jpeg_frame, is_standalone_marker

__all__ = ["DC_SCALE", "dc_scans_only"]

DC_SCALE = 8
"""The libjpeg scale (1/8) at which a full-resolution block is its DC term alone."""

_PROGRESSIVE_HUFFMAN = 0xC2
_SOI, _SOS, _EOI, _DHT = 0xD8, 0xDA, 0xD9, 0xC4
_KEPT_APPS = frozenset({0xE0, 0xEE})
"""JFIF and Adobe: they tell libjpeg the colour space. Other APPn and COM segments (EXIF, XMP,
ICC: read from the original by ``metadata``) are not copied to the shorter stream."""
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")
"""The end of a scan's entropy-coded data: 0xFF not stuffed (00) nor a restart (D0-D7). A fill
byte (FF FF) matches too and is skipped by the walk."""

EOB_RUN_MAX = 32767
"""The longest end-of-band run one symbol codes (EOB14: 2^14 + 14 more bits)."""
_NO_RESTARTS = b"\xff\xdd\x00\x04\x00\x00"


class _Malformed(Exception):
    """The stream is not one this walk reads exactly as libjpeg does: nothing is left out."""


def dc_scans_only(data: bytes | mmap.mmap) -> bytes | None:
    """``data`` without the AC scans of its full-resolution components, each replaced by a
    stand-in scan (see above), for a decode at 1/8; None when there is nothing to leave out
    (not a Huffman progressive JPEG, no such scan) or the stream is not well formed."""
    try:
        return _shortened(data)
    except (_Malformed, IndexError, struct.error, ValueError):
        return None  # the decoder reads the whole stream and says what it makes of it


def _segments(data: bytes | mmap.mmap) -> Iterator[tuple[int, int, int]]:
    """(marker code, start, end) of each marker segment after SOI, as libjpeg reads them: a
    scan runs to the next marker, RSTn and TEM have no length, fill bytes are skipped; the
    walk ends at EOI (not yielded). Anything else (bytes between segments, a bad length, a
    truncated stream) is ``_Malformed``."""
    size = len(data)
    if data[:2] != b"\xff\xd8":
        raise _Malformed
    pos = 2
    while pos + 2 <= size:
        if data[pos] != 0xFF:
            raise _Malformed  # libjpeg skips to the next marker with a warning
        code = data[pos + 1]
        if code == 0xFF:
            pos += 1
            continue
        if code == _EOI:
            return
        if is_standalone_marker(code):  # (an SOI here ends the walk in ``_shortened``)
            yield code, pos, pos + 2
            pos += 2
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        end = pos + 2 + length
        if length < 2 or end > size:
            raise _Malformed
        if code == _SOS:
            found = _MARKER.search(data, end)
            if found is None:
                raise _Malformed  # no marker after the scan: truncated
            end = found.start()
        yield code, pos, end
        pos = end
    raise _Malformed  # no EOI


def _shortened(data: bytes | mmap.mmap) -> bytes | None:
    """The walk of ``dc_scans_only``, copying what is kept."""
    parts: list[bytes] = [b"\xff\xd8"]
    progression: _Progression | None = None
    for code, start, end in _segments(data):
        if code == _SOI or (is_jpeg_frame(code) and (code != _PROGRESSIVE_HUFFMAN or progression is not None)):
            return None  # another frame type, or a second frame
        if code == _PROGRESSIVE_HUFFMAN:
            progression = _Progression(data[start + 4:end])
        if code == _DHT and progression is not None:
            progression.define_tables(data[start + 4:end])
        if code == _SOS:
            if progression is None:
                return None
            if progression.leaves_out(data[start + 4:end]):
                continue
        if not (0xE1 <= code <= 0xEF or code == 0xFE) or code in _KEPT_APPS:
            parts.append(data[start:end])
    if progression is None or not (left_out := progression.left_out()):
        return None
    stand_ins = (_stand_in_scan(cid, progression.blocks[cid]) for cid in left_out)
    return b"".join([*parts, _NO_RESTARTS, *stand_ins, b"\xff\xd9"])


class _Progression:
    """The frame's full-resolution components and what the AC scans left out have sent of
    each coefficient (libjpeg's ``coef_bits``: -1 never, else the last shift), to check those
    scans as libjpeg would have: a scan it warns about or refuses is not left out."""

    def __init__(self, sof: bytes) -> None:
        height, width, count = struct.unpack_from(">HHB", sof, 1)
        if count == 0 or len(sof) != 6 + 3 * count or not (width and height):
            raise _Malformed
        sampling = {sof[6 + 3 * k]: sof[7 + 3 * k] for k in range(count)}
        if len(sampling) != count or any(not (1 <= s >> 4 <= 4 and 1 <= s & 15 <= 4) for s in sampling.values()):
            raise _Malformed
        widest = max(s >> 4 for s in sampling.values())
        tallest = max(s & 15 for s in sampling.values())
        self.blocks = {cid: -(-width // 8) * -(-height // 8) for cid, s in sampling.items()
                       if s >> 4 == widest and s & 15 == tallest}
        """Each full-resolution component's count of 8x8 blocks in a scan of its own."""
        self.sent = {cid: [-1] * 64 for cid in self.blocks}
        self.ac_tables: set[int] = set()

    def define_tables(self, dht: bytes) -> None:
        """DHT: which AC tables are defined (a segment may hold several)."""
        pos = 0
        while pos < len(dht):
            kind = dht[pos]
            if kind >> 4 == 1:
                self.ac_tables.add(kind & 15)
            pos += 17 + sum(dht[pos + 1:pos + 17])

    def leaves_out(self, sos: bytes) -> bool:
        """Whether this scan is an AC scan of a full-resolution component, checked as libjpeg
        checks it (one component, a table defined, coefficients 1-63, successive
        approximation in order after the DC scan): then it is left out. A DC scan only
        records that the DC terms were sent."""
        count = sos[0]
        spectral_start, spectral_end, shifts = sos[1 + 2 * count:4 + 2 * count]
        high, low = shifts >> 4, shifts & 15
        if spectral_start == 0:
            for k in range(count):
                if sos[1 + 2 * k] in self.sent:
                    self.sent[sos[1 + 2 * k]][0] = low
            return False
        component = sos[1]
        if count != 1 or component not in self.sent:
            return False
        sent = self.sent[component]
        if (sos[2] & 15) not in self.ac_tables or not spectral_start <= spectral_end <= 63 or \
                (low > 13 if high == 0 else low != high - 1) or sent[0] < 0 or \
                any(max(sent[k], 0) != high for k in range(spectral_start, spectral_end + 1)):
            raise _Malformed  # libjpeg refuses or warns about it: the whole stream decides
        sent[spectral_start:spectral_end + 1] = [low] * (spectral_end - spectral_start + 1)
        return True

    def left_out(self) -> list[int]:
        """The components whose AC scans were left out. Any of them whose scans never sent a
        coefficient in 1-9 is one libjpeg-turbo treats as "DC only" in the whole stream too
        (it smooths its DC terms): then the stream is not shortened."""
        out = [cid for cid, sent in self.sent.items() if any(bits >= 0 for bits in sent[1:])]
        if any(all(bits < 0 for bits in self.sent[cid][1:10]) for cid in out):
            raise _Malformed
        return out


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
