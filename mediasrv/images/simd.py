"""libvips' SIMD targets, detected once per process instead of once per operation.

libvips 8.15 and later pick their vector code with Highway, and ``vips_vector_isenabled``, which
the resize and convolution operations ask each time they are built, calls Highway's
``SupportedTargets``. That detects the CPU again on every call, with a series of ``cpuid``
instructions, unless a fixed set of targets has been given. On a virtual machine each ``cpuid``
is a trap to the hypervisor: measured on this project's 2-core VM, detection was 14% of building
a Lanczos3 resize (0.41 -> 0.35 ms) and 0.9% of the CPU of a small JPEG's whole 400 px
transform (``perf record``: the samples on the detecting function's instructions).

``pin_targets`` hands libvips the targets it detects now (``vips_vector_disable_targets(0)``,
the call its ``VIPS_VECTOR`` environment variable makes at start-up): nothing is disabled, and
every later build reads the fixed set. pyvips does not expose the call, so it is made with
ctypes on the libvips this process has already loaded; a libvips older than 8.15 (Orc: no
detection per build, and no such call) is left as it is.
"""
from __future__ import annotations

__all__ = ["pin_targets"]


def pin_targets(library: str) -> int | None:
    """Fix the SIMD targets of the libvips loaded from ``library`` (its path, already mapped into
    this process) to those detected now; the pinned bitfield, or None when there is no library
    or no such call. Call once, before any image work starts."""
    import ctypes  # here, not at the top: only a process that does image work needs it

    if not library:
        return None
    try:
        lib = ctypes.CDLL(library)  # already loaded: dlopen returns the same library
        disable, supported = lib.vips_vector_disable_targets, lib.vips_vector_get_supported_targets
    except (OSError, AttributeError):
        return None
    disable.argtypes, disable.restype = [ctypes.c_int64], None
    supported.argtypes, supported.restype = [], ctypes.c_int64
    disable(0)
    return int(supported())
