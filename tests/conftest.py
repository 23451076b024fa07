"""Test setup: without a GPU, Triton kernels run under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, first.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gae_by_reference(monkeypatch):
    """compute_gae on CPU tensors by the pure-torch reference, as outside the tests, not by the kernel
    under the interpreter. The cache of planned calls starts empty: its entries were decided without this."""
    import kernels.gae

    monkeypatch.setattr(kernels.gae, "_runs", {})
    monkeypatch.setattr(kernels.gae, "_INTERPRET", False)
    return kernels.gae
