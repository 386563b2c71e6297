"""Q8_0: the portable kernel (its AVX2 kernel shares helpers with IQ4_XS: iq4/avx2.py)."""
