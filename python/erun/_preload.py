"""Which CUDA runtime and NCCL the _erun extension binds to.

An erun built with CUDA links libcudart and libnccl by soname and finds them,
through its rpath, in the CUDA toolkit it was built with. A PyTorch from PyPI
brings its own, often newer, copies in the environment's ``nvidia/*/lib``
folders (the nvidia-* wheels) and loads them by full path. The dynamic loader
keeps one library per soname in a process, so whichever loads first serves
both: when ``import erun`` came first, torch got the toolkit's older NCCL and
failed to import (``undefined symbol: ncclCommResume`` with torch 2.15 and
CUDA 13.0's NCCL). Loading the environment's copies first, as torch itself
does, gives both the newer libraries, which keep the older ABI. Without such
wheels (Debian's torch, no torch at all) nothing is loaded here and the
toolkit's libraries serve as before.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import List

# The sonames erun links, as globs over the nvidia-* wheels' layout
# (site-packages/nvidia/<part>/lib/<soname>); the runtime goes first, since
# NCCL depends on it.
_PATTERNS = ("nvidia/*/lib/libcudart.so.*[0-9]", "nvidia/nccl/lib/libnccl.so.*[0-9]")


def environment_cuda_libraries(paths: List[str]) -> List[str]:
    """The CUDA runtime and NCCL libraries of the first entry of ``paths`` (a
    sys.path) that has any, runtime first; [] when none has."""
    for entry in paths:
        if not entry or not os.path.isdir(os.path.join(entry, "nvidia")):
            continue
        found: List[str] = []
        for pattern in _PATTERNS:
            found += sorted(glob.glob(os.path.join(entry, pattern)))
        if found:
            return found
    return []


def load_environment_cuda_libraries() -> List[str]:
    """Loads (RTLD_GLOBAL) the environment's CUDA runtime and NCCL, if it has
    them, before _erun is imported; returns what it loaded. A library that
    does not load is left to the toolkit's copy. ERUN_NO_PRELOAD=1 turns this off."""
    if os.environ.get("ERUN_NO_PRELOAD") == "1":
        return []
    loaded = []
    for path in environment_cuda_libraries(sys.path):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        loaded.append(path)
    return loaded
