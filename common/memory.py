"""Giving freed heap memory back to the operating system, for the commands that load a
whole model once (hf-import, hf-export).

Two allocators keep memory a process has freed, and both matter when a model's weights
stream in tensor by tensor (measured on the 1.36B bf16 checkpoint of
benchmarks/hf_checkpoint_memory.py, 2.73 GB of weights):

- TensorFlow's oneDNN CPU allocator (`MklCPUAllocator`, the default of the x86 wheels
  while oneDNN is on) serves every tensor of 256 KB or more from a BFC pool it never
  returns: the old buffers of the assigned variables and the loader's temporaries stay
  resident, 0.76 GB after the load. `TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1` (read once, at
  TensorFlow's first allocation) sends them to malloc instead; oneDNN's kernels stay on.
  `use_system_allocator()` sets it, for a process that has not imported TensorFlow yet.
- glibc's malloc keeps freed chunks below its (dynamic) mmap threshold in its arenas:
  0.42 GB after the same load. `release_free_memory()` returns them (`malloc_trim(0)`,
  glibc >= 2.8 also releases the free pages inside the heap).

Together they took the peak RSS of `deepseek-tfx hf-import` of that checkpoint from 6.25
to about 4.7 GB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

SYSTEM_ALLOCATOR_ENV = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"


def use_system_allocator() -> bool:
    """Makes TensorFlow allocate tensors with malloc, not oneDNN's pool, unless the
    environment already says otherwise. Only takes effect before TensorFlow is imported.

    Returns:
      True when it can take effect (TensorFlow not imported yet), else False.
    """
    os.environ.setdefault(SYSTEM_ALLOCATOR_ENV, "1")
    return "tensorflow" not in sys.modules


def release_free_memory() -> bool:
    """Returns the free pages of malloc's arenas to the operating system (glibc's
    `malloc_trim(0)`). Live memory is untouched; a no-op where libc has no malloc_trim
    (macOS, musl).

    Returns:
      True when malloc_trim ran and released memory, else False.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
