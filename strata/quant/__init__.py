"""Block formats shared by both tiers (`gguf.quants` is the reference codec)."""

from strata.quant.activation import quantize_q8_0, quantize_q8_K, roundtrip
from strata.quant.formats import FORMATS, MODEL_TYPES, QK_K, BlockFormat, UnsupportedType, fmt
from strata.quant.synth_blocks import random_quantized

__all__ = [
    "FORMATS",
    "MODEL_TYPES",
    "QK_K",
    "BlockFormat",
    "UnsupportedType",
    "fmt",
    "quantize_q8_0",
    "quantize_q8_K",
    "random_quantized",
    "roundtrip",
]
