"""Pure-torch GAE: the CPU path of `compute_gae` and the oracle the Triton kernels are tested against.

Vectorised over environments, a plain loop over time. Arguments are validated by `compute_gae`;
this function trusts them. The semantics are documented once, in `kernels/README.md`.
"""

from __future__ import annotations

import torch


def gae_reference(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None,
    bootstrap_values: torch.Tensor | None,
    last_value: torch.Tensor | None,
    gamma: float,
    lam: float,
    advantages: torch.Tensor,
    returns: torch.Tensor,
) -> None:
    """Write GAE advantages and returns into `advantages` and `returns` (all `[N, T]`).

    `bootstrap_values` and `last_value` are mutually exclusive; with neither, `V(s_T) = 0`.
    Computes in the dtype of `values`.
    """
    num_steps = rewards.shape[1]
    if num_steps == 0:
        return
    dtype = values.dtype
    terminated = terminateds != 0
    done = terminated if truncateds is None else terminated | (truncateds != 0)

    # V_next_t: values[t+1] inside the window, the caller's continuation value at its edge
    # and (through `bootstrap_values`) at truncated steps.
    next_values = torch.empty_like(values)
    next_values[:, :-1] = values[:, 1:]
    if bootstrap_values is not None:
        next_values[:, -1] = bootstrap_values[:, -1]
        if truncateds is not None:
            next_values = torch.where(truncateds != 0, bootstrap_values.to(dtype), next_values)
    elif last_value is not None:
        next_values[:, -1] = last_value
    else:
        next_values[:, -1] = 0
    # `where`, not a multiplication: the value after a terminal step may be anything, even inf.
    next_values = torch.where(terminated, torch.zeros((), dtype=dtype), next_values)

    deltas = rewards.to(dtype) + gamma * next_values - values
    decays = (~done).to(dtype) * (gamma * lam)
    # A zero decay cuts the chain: `where`, so that a non-finite advantage after a done step stays
    # in its own episode (0 * inf is NaN).
    cuts = decays == 0

    advantage = torch.zeros(rewards.shape[0], dtype=dtype, device=values.device)  # A_T = 0
    for t in range(num_steps - 1, -1, -1):
        advantage = torch.where(cuts[:, t], deltas[:, t], deltas[:, t] + decays[:, t] * advantage)
        advantages[:, t] = advantage
    returns.copy_(advantages + values)
