"""IQ4_XS: portable and AVX2 kernels (avx2.py also holds Q8_0's AVX2 kernel)."""
