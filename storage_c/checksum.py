"""CRC-32C (Castagnoli) as the segments use it (storage_c/FORMAT.md), for
tools that check files by hand and for benchmarks: the core's own function,
with the CPU's instruction when there is one."""

from __future__ import annotations

from ._comet import ffi, lib


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The CRC-32C of ``data``, continuing from ``crc`` (unmasked; FORMAT.md
    says where entries store it masked)."""
    return int(lib.comet_crc32c(crc, ffi.from_buffer(data), len(data), 0))
