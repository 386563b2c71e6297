"""Strata: run Mixture-of-Experts LLMs larger than the GPU on one PC, fast."""

__version__ = "0.1.0"
