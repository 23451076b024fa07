"""Data-parallel training across processes started by torchrun: each worker steps its own
environments, gradients are averaged every minibatch (one explicit all-reduce), and the running
normalisers see every worker's data. NCCL between GPUs, gloo on CPUs. Without torchrun
(WORLD_SIZE unset or 1) every function here is a no-op on one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Workers:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start(device: torch.device) -> Workers:
    """Join the torchrun group if there is one (before any environment starts)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Workers()
    if not dist.is_initialized():
        # Imported before the group exists, on purpose. torch.distributed.nn's functions default to
        # `group=group.WORLD`, read when the module is imported, and torch imports it lazily (the
        # first optimiser imports torch._dynamo, which imports it). Imported after this call, those
        # defaults hold the group past destroy_process_group, so gloo's threads live on into the
        # interpreter's shutdown. There a thread dropping a finished all-reduce's tensors needs the
        # GIL and is killed inside a destructor: the process aborts ("terminate called without an
        # active exception"; 3 torchrun launches in 113 on a loaded 2-core machine).
        import torch.distributed.nn  # noqa: F401
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Workers(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 without torchrun); known before `start` joins the group."""
    return int(os.environ.get("RANK", "0"))


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over workers, in place; returns `tensor`."""
    if active():
        dist.all_reduce(tensor, dist.ReduceOp.SUM)
    return tensor


def mean_over_workers(tensor: torch.Tensor) -> torch.Tensor:
    """The mean over workers of `tensor` (a new tensor; `tensor` itself when alone)."""
    if not active():
        return tensor
    total = tensor.clone()
    dist.all_reduce(total, dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def average_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Replace every gradient by its mean over workers: one all-reduce of one flat buffer."""
    if not active():
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Start every worker from rank 0's weights."""
    if active():
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, 0)


def broadcast_object(obj):
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, 0)
    return box[0]


def stop() -> None:
    """Leave the group together: no worker tears down while another still works (rank 0 saving)."""
    if active():
        dist.barrier()
        dist.destroy_process_group()
