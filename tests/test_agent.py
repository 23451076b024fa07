"""The actor-critic: separate networks or one shared trunk, and what each call returns."""

import pytest
import torch

from ppo.agent import SIDE_BY_SIDE_MAX_MINIBATCH, Agent, make_agent, side_by_side_pays
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


@pytest.mark.parametrize("hidden_sizes,activation,act_dim", [((64, 64), "tanh", 8), ((16, 8, 4), "elu", 3),
                                                              ((7,), "relu", 1), ((5, 6), "tanh", 2)])
def test_side_by_side_networks_compute_what_the_separate_ones_do(hidden_sizes, activation, act_dim):
    # The same parameters run as one network (for the compiled loss): outputs and gradients must match
    # the two separate networks', for one to three hidden layers of different widths and an actor
    # with one output (nothing to pad the critic's row to).
    torch.manual_seed(0)
    separate = Agent(5, act_dim, hidden_sizes=hidden_sizes, activation=activation)
    side = Agent(5, act_dim, hidden_sizes=hidden_sizes, activation=activation, side_by_side=True)
    side.load_state_dict(separate.state_dict())
    assert side.side_by_side and not separate.side_by_side
    with torch.no_grad():  # nonzero biases, so a bias in the wrong network would show
        for p in list(side.parameters()) + list(separate.parameters()):
            p.add_(0.01 * torch.arange(p.numel()).reshape(p.shape).sin())
    obs, action = torch.randn(13, 5), torch.randn(13, act_dim)
    results = []
    for agent in (separate, side):
        _, log_prob, _, value = agent.get_action_and_value(obs, action)
        (log_prob.sum() + value.square().sum()).backward()
        results.append((log_prob, value, [p.grad for p in agent.parameters()]))
    (lp_a, v_a, g_a), (lp_b, v_b, g_b) = results
    torch.testing.assert_close(lp_b, lp_a)
    torch.testing.assert_close(v_b, v_a)
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(b, a)


def test_side_by_side_is_for_small_minibatches_on_a_gpu():
    # Its batched weight gradients lose to two plain products past SIDE_BY_SIDE_MAX_MINIBATCH samples.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert side_by_side_pays(cuda, 1024) and side_by_side_pays(cuda, SIDE_BY_SIDE_MAX_MINIBATCH)
    assert not side_by_side_pays(cuda, SIDE_BY_SIDE_MAX_MINIBATCH + 1) and not side_by_side_pays(cuda, 262_144)
    assert not side_by_side_pays(cpu, 64)


def test_side_by_side_applies_only_to_separate_networks_with_hidden_layers():
    assert not Agent(5, 3, hidden_sizes=(8,), shared_trunk=True, side_by_side=True).side_by_side
    assert not Agent(5, 3, hidden_sizes=(), side_by_side=True).side_by_side
    assert make_agent(5, 3, ModelSettings(hidden_sizes=(8,)), side_by_side=True).side_by_side
