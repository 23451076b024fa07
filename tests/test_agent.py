"""The actor-critic: separate networks or one shared trunk, and what each call returns."""

import pytest
import torch

from ppo.agent import Agent, make_agent
from ppo.config import ModelSettings


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_calls_agree_on_the_policy_mean_and_value(shared_trunk):
    torch.manual_seed(0)
    agent = Agent(5, 3, hidden_sizes=(16, 8), activation="elu", shared_trunk=shared_trunk)
    obs = torch.randn(11, 5)
    action, log_prob, entropy, value = agent.get_action_and_value(obs)
    assert action.shape == (11, 3) and log_prob.shape == entropy.shape == value.shape == (11,)
    torch.testing.assert_close(value, agent.get_value(obs))
    mean = agent.act_deterministic(obs)
    std = agent.actor_log_std.exp()
    reference = torch.distributions.Normal(mean, std).log_prob(action).sum(-1)
    torch.testing.assert_close(log_prob, reference)


def test_a_shared_trunk_is_one_set_of_parameters_that_both_heads_read():
    torch.manual_seed(0)
    separate = Agent(5, 3, hidden_sizes=(16, 8))
    shared = Agent(5, 3, hidden_sizes=(16, 8), shared_trunk=True)
    count = lambda agent: sum(p.numel() for p in agent.parameters())  # noqa: E731
    trunk = 5 * 16 + 16 + 16 * 8 + 8
    assert count(separate) == 2 * trunk + (8 + 1) + (8 * 3 + 3) + 3
    assert count(shared) == trunk + (8 + 1) + (8 * 3 + 3) + 3
    obs = torch.randn(4, 5)
    before_value, before_mean = shared.get_value(obs), shared.act_deterministic(obs)
    with torch.no_grad():
        shared.trunk[0].weight.add_(0.5)  # one change to the trunk moves both heads' outputs
    assert not torch.allclose(shared.get_value(obs), before_value)
    assert not torch.allclose(shared.act_deterministic(obs), before_mean)


def test_a_shared_agent_round_trips_through_its_state_dict():
    torch.manual_seed(0)
    settings = ModelSettings(hidden_sizes=(16, 8), shared_trunk=True)
    a, b = make_agent(5, 3, settings), make_agent(5, 3, settings)
    b.load_state_dict(a.state_dict())
    obs = torch.randn(4, 5)
    torch.testing.assert_close(b.get_value(obs), a.get_value(obs))
    assert b.critic[0] is b.trunk and b.actor_mean[0] is b.trunk, "loading must not untie the trunk"
