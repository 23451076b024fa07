"""Random rollouts for GAE tests: flags, bootstrap values and layouts as a real buffer makes them."""

from __future__ import annotations

import torch


def random_rollout(
    num_envs: int,
    num_steps: int,
    *,
    density: float = 0.05,
    time_major: bool = False,
    flag_dtype: torch.dtype = torch.bool,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """`[N, T]` rewards, values, terminateds, truncateds and bootstrap_values.

    About `density` of the steps end an episode, half terminated and half truncated (never both).
    `bootstrap_values` is nonzero exactly at truncated steps and in the last column. With
    `time_major`, every tensor is the `.T` view of a contiguous `[T, N]` buffer.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (num_steps, num_envs) if time_major else (num_envs, num_steps)

    def make(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device)
        return x.T if time_major else x

    done = torch.rand(shape, generator=g) < density
    terminated = done & (torch.rand(shape, generator=g) < 0.5)
    truncated = done & ~terminated
    bootstrap = torch.where(truncated, torch.randn(shape, generator=g), torch.zeros(()))
    last = (slice(None), -1) if not time_major else (-1, slice(None))
    bootstrap[last] = torch.where(terminated[last], 0.0, torch.randn(num_envs, generator=g))
    return {
        "rewards": make(torch.randn(shape, generator=g)),
        "values": make(torch.randn(shape, generator=g)),
        "terminateds": make(terminated.to(flag_dtype)),
        "truncateds": make(truncated.to(flag_dtype)),
        "bootstrap_values": make(bootstrap),
    }


def poisoned_like(x: torch.Tensor) -> torch.Tensor:
    """A NaN-filled tensor with the shape and strides of `x`, so an unwritten element cannot pass."""
    return torch.full_like(x, float("nan"))


def oracle(
    rollout: dict[str, torch.Tensor], gamma: float, lam: float, **overrides
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-torch reference in float64 on the CPU."""
    from kernels.reference import gae_reference

    args = {**rollout, **overrides}
    values = args["values"].detach().cpu().double()

    def f64(name: str) -> torch.Tensor | None:
        x = args.get(name)
        return None if x is None else x.detach().cpu().double()

    def flags(name: str) -> torch.Tensor | None:
        x = args.get(name)
        return None if x is None else x.detach().cpu()

    advantages, returns = torch.empty_like(values), torch.empty_like(values)
    gae_reference(f64("rewards"), values, flags("terminateds"), flags("truncateds"), f64("bootstrap_values"),
                  f64("last_value"), gamma, lam, advantages, returns)
    return advantages, returns


NON_FINITE_KINDS = ("nan_reward", "inf_reward", "inf_value", "-inf_value", "inf_bootstrap")


def poison_one_step_per_row(rollout: dict[str, torch.Tensor], seed: int = 0) -> torch.Tensor:
    """Write a non-finite number into each row that has an episode boundary, at a random step after
    its first one (the kinds of `NON_FINITE_KINDS` in turn), in place. Returns the `[N, T]` mask of
    the steps whose advantage depends on it: from the start of its episode segment (the step after
    the last done step before it) through the poisoned step."""
    g = torch.Generator().manual_seed(seed)
    done = (rollout["terminateds"] != 0) | (rollout["truncateds"] != 0)
    num_envs, num_steps = done.shape
    affected = torch.zeros(num_envs, num_steps, dtype=torch.bool)
    for row in range(num_envs):
        boundaries = done[row].nonzero().flatten().tolist()
        if not boundaries or boundaries[0] == num_steps - 1:
            continue
        kind = NON_FINITE_KINDS[row % len(NON_FINITE_KINDS)]
        if kind == "inf_bootstrap":  # at a truncation after the first boundary, or in the last column
            candidates = [t for t in (rollout["truncateds"][row] != 0).nonzero().flatten().tolist()
                          if t > boundaries[0]]
            step = candidates[0] if candidates else num_steps - 1
            if rollout["terminateds"][row, step] != 0:
                continue  # a terminal last column reads no bootstrap value
            rollout["bootstrap_values"][row, step] = float("inf")
        else:
            step = int(torch.randint(boundaries[0] + 1, num_steps, (1,), generator=g))
            name, number = {"nan_reward": ("rewards", "nan"), "inf_reward": ("rewards", "inf"),
                            "inf_value": ("values", "inf"), "-inf_value": ("values", "-inf")}[kind]
            rollout[name][row, step] = float(number)
        start = max(t for t in boundaries if t < step) + 1
        affected[row, start:step + 1] = True
    return affected
