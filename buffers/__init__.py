"""Rollout storage on the run's device."""

from buffers.rollout import Minibatch, RolloutBuffer

__all__ = ["Minibatch", "RolloutBuffer"]
