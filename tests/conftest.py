"""Test setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, first.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
