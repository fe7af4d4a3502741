"""torch tensors as stored values: which tensors may be stored, the numpy array each is stored as, and the tensor
built back from it. torch is imported only when a tensor is stored or read, never by importing shmcache.

A tensor is stored as the numpy array over its contiguous data plus a dtype code (codec.py's ``T`` tag and ext 4):
``AS_HEADER``, the tensor's dtype is the array's (bool, int8-64, uint8-64, float16/32/64, complex64/128); ``BFLOAT16``,
the array is ``<u2`` and holds the bfloat16 bit patterns (numpy has no bfloat16, so its bits travel unchanged and are
viewed back as bfloat16, exact). What the array cannot say without loss (a gradient, a device, a sparse or quantized
layout, float8 and complex32) is refused with a TypeError that says what to store instead.
"""

from __future__ import annotations

import sys

import numpy as np

AS_HEADER = 0  # the tensor's dtype is the array header's numpy dtype
BFLOAT16 = 1  # the array header says <u2; the data are bfloat16 bit patterns

# The numpy dtypes torch.from_numpy takes, in native byte order (the only order a host writes).
_FROM_NUMPY = frozenset(np.dtype(c) for c in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8",
                                              "c8", "c16"))
_BFLOAT16_BITS = np.dtype("u2")


def is_tensor(obj) -> bool:
    """Whether ``obj`` is a torch.Tensor; never imports torch (a process that has not imported it holds none)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, getattr(torch, "Tensor", ()))


def to_array(t) -> tuple[int, np.ndarray]:
    """The dtype code and the C-contiguous numpy array that store tensor ``t`` (sharing its memory when it is
    contiguous already). Raises TypeError for a tensor that cannot be stored as it is, saying what to store."""
    import torch

    if t.requires_grad:
        raise TypeError("cannot store a tensor that requires grad: store t.detach() (or t.detach().cpu()); "
                        "the autograd graph is not cached")
    if t.is_quantized:
        raise TypeError(f"cannot store a quantized tensor ({t.dtype}): store t.dequantize(), or t.int_repr() "
                        "with its scale and zero point")
    if t.device.type != "cpu":
        raise TypeError(f"cannot store a tensor on device {t.device}: store t.detach().cpu()")
    if t.layout is not torch.strided or t.is_nested:
        what = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise TypeError(f"cannot store a {what} tensor: store a dense one (t.to_dense(), then .detach().cpu())")
    if t.dtype is torch.bfloat16:
        code, t = BFLOAT16, t.view(torch.uint16)
    else:
        code = AS_HEADER
    t = t.resolve_conj().resolve_neg().contiguous()
    try:
        arr = t.numpy()
    except TypeError:  # float8, complex32, bits...: numpy has no such dtype to carry them
        raise TypeError(f"cannot store a tensor of dtype {t.dtype}: convert it first (t.float(), or t.view() as "
                        "an integer dtype of the same size)") from None
    if arr.dtype not in _FROM_NUMPY:
        raise TypeError(f"cannot store a tensor of dtype {t.dtype}: it has no numpy dtype that torch reads back")
    return code, arr


def check(code: int, dtype: np.dtype) -> None:
    """Raise ValueError unless an array of ``dtype`` stored with ``code`` is a tensor this module could have written
    (without importing torch: ``verify`` checks stored tensors so)."""
    if code == AS_HEADER:
        if dtype not in _FROM_NUMPY or not dtype.isnative:
            raise ValueError(f"a tensor value has array dtype {dtype.str}, which no tensor is stored as")
    elif code == BFLOAT16:
        if dtype != _BFLOAT16_BITS or not dtype.isnative:
            raise ValueError(f"a bfloat16 tensor value has array dtype {dtype.str}, expected <u2")
    else:
        raise ValueError(f"a tensor value has dtype code {code}; known codes are {AS_HEADER} and {BFLOAT16}")


def from_array(code: int, arr: np.ndarray):
    """The tensor stored as ``arr`` with ``code``, sharing ``arr``'s memory. Raises ValueError for a pair this module
    never writes, ModuleNotFoundError if torch is not installed."""
    check(code, arr.dtype)
    torch = _torch()
    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if code == BFLOAT16 else t


def _torch():
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "from_numpy"):
        return torch
    try:
        import torch
    except ImportError as exc:
        raise ModuleNotFoundError("this value was stored as a torch.Tensor: reading it needs torch in this process "
                                  "(pip install torch)", name="torch") from exc
    return torch
