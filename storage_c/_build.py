"""cffi build script: compiles the C core into ``storage_c._comet`` (API mode).

The declarations come from ``include/comet.h`` and ``include/comet_testing.h``
(the test hooks) themselves, with the preprocessor lines turned into what cffi
understands, so the headers stay the one source of truth for the interface.
The sources are every ``.c`` file of ``src/``'s folders (``log/``, ``codec/``,
``port/``), which include each other's headers as ``"port/port.h"``.  The
fast appends (``_fastpath.c``, a CPython module of their own, loaded by
``_native.py``) are compiled into the same shared object: they call the core
directly, and the process holds one copy of it.  They use CPython's full
API, so the module is built for this Python version rather than for the
stable ABI.
"""

from __future__ import annotations

import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
HEADERS = [HERE / "include" / "comet.h", HERE / "include" / "comet_testing.h"]
SOURCES = [*sorted(str(p.relative_to(HERE.parent)) for p in (HERE / "src").glob("*/*.c")),
           str((HERE / "_fastpath.c").relative_to(HERE.parent))]
CFLAGS = ["-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]


def cdef_from_header(text: str) -> str:
    """Keeps declarations; turns each ``#define COMET_X`` into ``#define COMET_X ...``."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'#ifdef __cplusplus.*?#endif', "", text, flags=re.S)
    lines = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            match = re.match(r"#define\s+(COMET_\w+)\s+\S", stripped)
            if match and match.group(1) != "COMET_H":
                lines.append(f"#define {match.group(1)} ...")
            continue
        lines.append(re.sub(r"\[COMET_\w+\]", "[...]", line))
    return "\n".join(lines)


ffibuilder = FFI()
ffibuilder.cdef("\n".join(cdef_from_header(header.read_text()) for header in HEADERS))
ffibuilder.set_source(
    "storage_c._comet",
    '#include "comet.h"\n#include "comet_testing.h"',
    sources=SOURCES,
    include_dirs=[str(HERE / "include"), str(HERE / "src")],
    extra_compile_args=CFLAGS,
    libraries=["zstd", "pthread"],
    py_limited_api=False,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
