"""IQ3_XXS and IQ3_S: portable kernels; IQ3_XXS position-major with AVX-512 (LUT4: lut4.py)."""
