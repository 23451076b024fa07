"""The PPO loss: dummy samples (weight 0) change nothing, whatever they hold."""

import torch

from buffers import Minibatch
from ppo.agent import Agent
from ppo.config import PPOSettings
from ppo.update import ppo_loss


def random_minibatch(n: int, seed: int) -> Minibatch:
    g = torch.Generator().manual_seed(seed)
    return Minibatch(observations=torch.randn(n, 5, generator=g), actions=torch.randn(n, 2, generator=g),
                     log_probs=torch.randn(n, generator=g) - 2, values=torch.randn(n, generator=g),
                     advantages=torch.randn(n, generator=g), returns=torch.randn(n, generator=g),
                     weights=torch.ones(n))


def test_dummy_samples_do_not_change_the_loss_or_its_gradient():
    torch.manual_seed(0)
    agent = Agent(5, 2)
    settings = PPOSettings(ent_coef=0.01)
    clean = random_minibatch(6, seed=1)
    garbage = random_minibatch(3, seed=2)
    garbage.log_probs[:] = -float("inf")  # a stale log-prob: an inf ratio if not masked
    garbage.advantages[:] = 1e6
    mixed = Minibatch(*(torch.cat([getattr(clean, f), getattr(garbage, f)]) for f in
                        ("observations", "actions", "log_probs", "values", "advantages", "returns")),
                      weights=torch.cat([torch.ones(6), torch.zeros(3)]))

    def loss_and_grad(mb):
        agent.zero_grad()
        loss, stats = ppo_loss(agent, mb, settings)
        loss.backward()
        return loss.detach(), stats, [p.grad.clone() for p in agent.parameters()]

    loss_a, stats_a, grads_a = loss_and_grad(clean)
    loss_b, stats_b, grads_b = loss_and_grad(mixed)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(stats_a, stats_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b)


def test_compiled_loss_matches_eager():
    from ppo import update

    torch.manual_seed(0)
    agent = Agent(5, 2)
    mb = random_minibatch(8, seed=3)
    mb.weights[5:] = 0
    eager_loss, eager_stats = ppo_loss(agent, mb, PPOSettings())
    settings = PPOSettings(compile=True)
    compiled_loss, compiled_stats = update._loss_function(settings)(agent, mb, settings)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_stats, eager_stats, rtol=1e-5, atol=1e-6)
