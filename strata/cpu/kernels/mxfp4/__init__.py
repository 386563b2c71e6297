"""MXFP4 (gpt-oss experts): portable and AVX2 kernels against a Q8_0 activation."""
