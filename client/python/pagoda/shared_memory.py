"""Shared-memory tensors for a client on the server's host (docs/design.md §15).

A SharedMemoryRegion is a POSIX shared-memory object this process creates (or
opens) and maps; `tensor()` hands out numpy views over ranges of it (no copy).
Once the region is registered with a server started with
--allow-shared-memory (PagodaClient.register_shared_memory), those tensors go
to decode()/append_kv()/LayerStreams in place of arrays: the request carries
only where they lie, and results named by decode(out=..., lse_out=...) are
written into the region by the server.
"""
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Optional, Sequence

import numpy as np

# Wire dtype numbers (pagoda.v1.DType) and the numpy type each is held in;
# bf16 travels as its 16 bits (uint16).
_NUMPY = {1: np.float32, 2: np.float16, 3: np.uint16}
_WIRE = {"fp32": 1, "float32": 1, "fp16": 2, "float16": 2, "bf16": 3, "bfloat16": 3}


@dataclass
class ShmTensor:
    """A range of a registered region holding one tensor in a wire dtype."""
    region: str             # the name it was registered under
    offset: int             # bytes from the region's start
    dtype: int              # wire dtype number (1 fp32, 2 fp16, 3 bf16)
    array: np.ndarray       # the view: write inputs here, read results here

    @property
    def shape(self):
        return self.array.shape

    @property
    def byte_size(self) -> int:
        return self.array.nbytes


class SharedMemoryRegion:
    """A POSIX shared-memory object, mapped; `key` is its name as the server
    opens it ("/name"). create=True makes it (and unlink() removes it)."""

    def __init__(self, key: str, byte_size: int, create: bool = True):
        if not key.startswith("/") or "/" in key[1:] or len(key) < 2:
            raise ValueError(f"key: expected '/' then a name without '/', received {key!r}")
        self._shm = shared_memory.SharedMemory(name=key[1:], create=create, size=byte_size)
        self.key = key
        self.byte_size = byte_size
        self.name: Optional[str] = None  # set by PagodaClient.register_shared_memory
        self.base = 0                    # where the registered range starts in the object
        self._next = 0

    def view(self, offset: int, shape: Sequence[int], dtype) -> np.ndarray:
        """A numpy view of `shape` in wire dtype `dtype` (number or name) at `offset`."""
        wire = _WIRE[dtype] if isinstance(dtype, str) else int(dtype)
        count = int(np.prod(shape)) if len(shape) else 1
        return np.ndarray(tuple(shape), dtype=_NUMPY[wire], buffer=self._shm.buf, offset=offset,
                          strides=None) if count else np.zeros(tuple(shape), dtype=_NUMPY[wire])

    def tensor(self, shape: Sequence[int], dtype="fp32", align: int = 64) -> ShmTensor:
        """The next free range of the region for a tensor of `shape`, 64-byte aligned."""
        if self.name is None:
            raise ValueError("region: expected a registered region (PagodaClient.register_shared_memory)")
        wire = _WIRE[dtype] if isinstance(dtype, str) else int(dtype)
        size = int(np.prod(shape)) * np.dtype(_NUMPY[wire]).itemsize
        offset = (max(self._next, self.base) + align - 1) // align * align  # in the object
        if offset + size > self.byte_size:
            raise ValueError(f"region {self.key!r}: expected room for {size} more bytes at offset {offset}, "
                             f"the region holds {self.byte_size}")
        self._next = offset + size
        return ShmTensor(self.name, offset - self.base, wire, self.view(offset, shape, wire))

    def reset(self):
        """Hands out ranges from the start again (the earlier tensors' views stay valid views)."""
        self._next = 0

    def close(self):
        self._shm.close()

    def unlink(self):
        self._shm.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
