"""numpy and torch tensors to and from the wire, with no Python-level loop.

numpy arrays: float16 travels (and comes back) as fp16, anything else as
fp32 (float32 out). torch CPU tensors
(float32, float16, bfloat16) travel in their own dtype unless told otherwise:
a bf16 tensor's bits go on the wire unchanged, and a decode whose q is a torch
tensor answers with a torch tensor of q's dtype. torch is imported only when a
torch tensor is seen, so numpy users need no torch."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

import numpy as np


def is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def follow_dtype(x, dtype: Optional[object]) -> object:
    """The wire dtype: `dtype` when given, else the input's own (fp16 and bf16 stay 16-bit)."""
    if dtype is not None:
        return dtype
    if is_torch(x):
        import torch
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(x.dtype, "fp32")
    if isinstance(x, np.ndarray) and x.dtype == np.float16:
        return "fp16"
    return "fp32"


def shaped(x, shape: Sequence[int]):
    """x reshaped (a torch tensor stays one; anything else becomes float32 numpy)."""
    if is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"tensor device: expected cpu, received {x.device}")
        return x.detach().reshape(tuple(shape))
    return np.asarray(x, dtype=np.float32).reshape(tuple(shape))


def torch_bytes(t, wire: int, fp32: int, fp16: int) -> bytes:
    """A torch tensor's little-endian bytes as the wire dtype (RNE conversions by torch)."""
    import torch
    if wire == fp32:
        return t.to(torch.float32).contiguous().numpy().tobytes()
    if wire == fp16:
        return t.to(torch.float16).contiguous().numpy().tobytes()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def torch_from_wire(data: bytes, wire: int, shape: Sequence[int], like, fp32: int, fp16: int):
    """Wire bytes -> a torch tensor of `like`'s dtype and `shape`."""
    import torch
    buf = bytearray(data)  # writable, so torch.frombuffer does not warn
    if wire == fp32:
        t = torch.frombuffer(buf, dtype=torch.float32)
    elif wire == fp16:
        t = torch.frombuffer(buf, dtype=torch.float16)
    else:
        t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
    return t.reshape(tuple(shape)).to(like.dtype if like.dtype.is_floating_point else torch.float32)
