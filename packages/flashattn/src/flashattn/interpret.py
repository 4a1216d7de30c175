"""Running flashattn's Triton kernels on the CPU under ``TRITON_INTERPRET=1``.

Triton 3.6's interpreter has two faults, handled here (this module is imported only when the kernels were
defined for the interpreter; :mod:`flashattn.portable.launch` installs the fix then):

- with numpy >= 2.4 every launch dies with ``TypeError('only 0-dimensional arrays can be converted to Python
  scalars')``: the interpreter turns one-element arrays into Python ints (loop bounds, indices) with
  ``int(array)``, which numpy 2.4 refuses. The fix (as in later Triton releases) converts the single element
  instead; it is installed once, only where numpy refuses ``int`` of a one-element array.
- numpy has no bfloat16, and the interpreter's bfloat16 emulation returns wrong values (around 1e9) without an
  error, so bfloat16 is refused with a clear message; float16 and float32 are emulated faithfully.

The interpreter must be switched on before ``flashattn`` is imported: ``@triton.jit`` reads
``TRITON_INTERPRET`` when the kernels are defined.
"""

import numpy as np
import torch
from torch import Tensor

INTERPRETED_DTYPES = (torch.float16, torch.float32)

_installed = False


def _numpy_refuses_int_of_one_element() -> bool:
    try:
        int(np.zeros(1))
    except TypeError:
        return True
    return False


def install_numpy_fix() -> None:
    """Make the interpreter's ``tensor.__index__`` convert a one-element array's element (idempotent)."""
    global _installed
    if _installed or not _numpy_refuses_int_of_one_element():
        return
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    interpreter._patch_lang_tensor = patch_lang_tensor
    _installed = True


def interpreter_reason(q: Tensor) -> str | None:
    """Why the interpreted kernels cannot take ``q`` (a dtype the interpreter gets wrong), or None."""
    if q.dtype not in INTERPRETED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in INTERPRETED_DTYPES)
        return (f"q has dtype {q.dtype}, which Triton's interpreter (TRITON_INTERPRET=1) does not emulate "
                f"faithfully; supported under the interpreter: {names}")  # fmt: skip
    return None
