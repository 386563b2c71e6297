"""Quantized dot products of one weight row with one quantized activation row, per format.

Every kernel has the signature `dot_<fmt>(w, r, xq, xd, xb, x8, xf, a) -> float32`: row `r` of
the uint8 matrix `w` (one weight row per matrix row, blocks in file order unless the format is
repacked) against row `a` of the act arrays described in `strata.cpu.quantize`. `dispatch.dot`
picks the kernel by an integer code so one compiled pool serves every format.
"""
