"""Rollout storage on the run's device."""

from buffers.rollout import Minibatch, RolloutBuffer, SampleTable, normalized_advantages

__all__ = ["Minibatch", "RolloutBuffer", "SampleTable", "normalized_advantages"]
