"""IQ2_XXS and IQ2_S: portable kernels; IQ2_S on its LUT4 layout with AVX2 (IQ2_XXS: lut4.py)."""
