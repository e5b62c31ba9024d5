"""Gradient compression for the wire, with BytePS's interface: ``compress(t) -> (t', ctx)``,
``decompress(t', ctx) -> t``. Any object with those two static methods works (byteps.torch's own
``Compression.none`` / ``Compression.fp16`` included)."""
from __future__ import annotations


class NoneCompressor:
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor:
    @staticmethod
    def compress(tensor):
        import torch

        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    none = NoneCompressor
    fp16 = FP16Compressor
