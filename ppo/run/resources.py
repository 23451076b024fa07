"""Settings sized by the machine, checked against it before anything starts: thread counts against its
CPUs, and the memory that `env.num_envs` simulators and their rollout buffer take against what is
free. Past them a run would abort inside envpool or libgomp, or grow until the machine swaps."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ppo.config import ConfigError, TrainSettings

# Resident memory per simulated env, measured with 512 envpool envs (0.72-0.82 MB: HalfCheetah, Ant,
# Humanoid v4) and 64 gymnasium ones (1.09-1.19 MB), rounded up.
# MuJoCo Warp's per-world arrays: 26 KB (Ant) and 37 KB (Humanoid) with 1024 worlds, rounded up; they
# live on the run's device (counted with the buffer there).
SIMULATOR_BYTES = {"envpool": 1 << 20, "gymnasium": 3 << 19, "mjwarp": 1 << 16}
# Float32 numbers a sample keeps in the rollout buffer and its flattened copy (buffers.RolloutBuffer):
# observation and action twice, and a dozen scalars (log-prob, value, reward, advantage, ...).
SCALARS_PER_SAMPLE = 12
# Refuse what needs more than this share of the free memory: the process has more to hold.
USABLE = 0.8


def check_resources(settings: TrainSettings, device: torch.device, observation_action_size=None) -> None:
    """A ConfigError naming the setting and the value that fits, where a thread count passes the CPUs or
    the envs and their buffer pass the free memory. `observation_action_size`: a callable giving the
    task's observation plus action size, asked only where a guess of 1,024 would not fit."""
    cpus = os.cpu_count() or 1
    for key, threads in (("env.num_threads", settings.env.num_threads), ("torch_threads", settings.torch_threads)):
        if threads > cpus:
            raise ConfigError(f"`{key}={threads}` asks for more threads than this machine's {cpus} CPUs "
                              f"(past them threads only wait, and envpool and OpenMP abort at thousands): "
                              f"at most {cpus}, or 0 for the default")
    num_envs, num_steps = settings.env.num_envs, settings.ppo.num_steps
    simulator = SIMULATOR_BYTES.get(settings.env.backend, max(SIMULATOR_BYTES.values()))
    host, gpu = free_host_memory(), free_gpu_memory(device)
    worlds_on_device = gpu is not None and settings.env.backend == "mjwarp"

    def per_env(size: int) -> tuple[int, int]:
        """Bytes an env takes in host memory and on the GPU, for observations and actions of `size`."""
        buffer = 4 * num_steps * (2 * size + SCALARS_PER_SAMPLE)
        if gpu is None:
            return simulator + buffer, 0
        return (0, simulator + buffer) if worlds_on_device else (simulator, buffer)

    def fits(size: int) -> bool:
        on_host, on_gpu = per_env(size)
        return num_envs * on_host <= USABLE * host and (gpu is None or num_envs * on_gpu <= USABLE * gpu)

    if fits(1024):
        return
    size = observation_action_size() if observation_action_size else 1024
    if fits(size):
        return
    on_host, on_gpu = per_env(size)
    most = min(int(USABLE * host) // on_host if on_host else num_envs,
               int(USABLE * gpu) // on_gpu if on_gpu else num_envs)
    buffer = 4 * num_steps * (2 * size + SCALARS_PER_SAMPLE)
    where = f"{_gb(host)} free in memory and {_gb(gpu)} on {device}" if gpu is not None else f"{_gb(host)} free"
    raise ConfigError(
        f"`env.num_envs={num_envs}` needs about {_gb(num_envs * (simulator + buffer))} (the simulators "
        f"~{simulator / 2**20:.2f} MB an env{' on the GPU' if worlds_on_device else ''}, the rollout buffer "
        f"~{buffer / 2**20:.2f} MB an env at ppo.num_steps={num_steps}); this machine has {where}: at most "
        f"{max(most, 0):,} envs fit")


def free_host_memory() -> int:
    """Bytes this process may still take: the kernel's MemAvailable, or less under a cgroup's limit."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def free_gpu_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA `device`; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0]


def _gb(size: float) -> str:
    return f"{size / 2**30:,.1f} GB"
