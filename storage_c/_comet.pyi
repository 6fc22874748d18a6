# The cffi extension module built by storage_c/_build.py, for the type checker.
# ``lib`` holds the C functions and constants of the cdef there, which cffi does
# not describe to a type checker; so do the fields of the structs ``ffi.new``
# allocates.  Every ``char *`` this package reads is bytes.
from typing import Any

from _cffi_backend import FFI, CType, _CDataBase

class _FFI(FFI):
    def new(self, cdecl: str | CType, init: Any = ...) -> Any: ...
    def string(self, cdata: _CDataBase, maxlen: int = -1) -> bytes: ...
    def unpack(self, cdata: _CDataBase, length: int) -> bytes: ...

ffi: _FFI
lib: Any
