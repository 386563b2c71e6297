"""K-quants (Q4_K, Q5_K, Q6_K): portable, AVX2 and AVX-512 row kernels on the GGUF bytes."""
