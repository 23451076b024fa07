"""GAE kernels: `compute_gae` (Triton on CUDA, pure torch on CPU) and its reference."""

from kernels.gae import compute_gae
from kernels.reference import gae_reference

__all__ = ["compute_gae", "gae_reference"]
