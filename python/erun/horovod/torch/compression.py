"""Gradient compression as Horovod's ``hvd.Compression``: a compressor's
``compress(tensor)`` returns ``(compressed, ctx)`` and ``decompress(tensor,
ctx)`` gives the tensor back in its dtype. A program's own compressor with
these two methods works too."""
from __future__ import annotations

from typing import Any, Tuple

import torch


class Compressor:
    """The interface: compress before the collective, decompress after."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (others as they are). On CPU
    erun reduces float16 through float32, so this rounds the values as
    Horovod does without saving bandwidth there; NCCL reduces float16 itself."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        if tensor.is_floating_point() and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``."""
    none = NoneCompressor
    fp16 = FP16Compressor
