"""Rollout storage on the run's device."""

from buffers.rollout import Minibatch, RolloutBuffer, SampleTable

__all__ = ["Minibatch", "RolloutBuffer", "SampleTable"]
