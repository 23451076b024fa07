"""Checkpoints: written durably, restored exactly, and a resume is the run it continues."""

import math
import os
import random
import re

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo.run.checkpoint
from ppo.agent import Agent
from ppo.config import settings_from_dict
from ppo.normalize import ObservationNormalizer, RewardScaler, ValueNormalizer
from ppo.run.checkpoint import load_checkpoint, restore_training_state, save_checkpoint, training_state
from ppo.update import make_optimizer, ppo_update
from tests.conftest import filled_buffer
from tests.toy_env import TOY_ID, register_toy_envs

CPU = torch.device("cpu")


def test_checkpoints_are_flushed_to_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(ppo.run.checkpoint.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
                        or real_fsync(fd))
    path = save_checkpoint(tmp_path, {"x": torch.zeros(3)})
    assert synced == [str(path.with_suffix(".tmp")), str(path.parent)]
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(3))


def fresh_run_state(seed: int):
    """A run's parts after a few updates: settings, agent, optimiser, normalisers and generator."""
    settings = settings_from_dict({"ppo": {"num_minibatches": 4, "update_epochs": 2, "normalize_values": True}})
    torch.manual_seed(seed)
    values = ValueNormalizer(CPU)
    agent = Agent(5, 2, value_normalizer=values)
    optimizer = make_optimizer(agent, settings.ppo, CPU, graphs=False)
    normalizers = {"obs_normalizer": ObservationNormalizer(5, CPU), "reward_scaler": RewardScaler(16, 0.99, CPU),
                   "value_normalizer": values}
    generator = torch.Generator().manual_seed(seed)
    return settings, agent, optimizer, normalizers, generator


def draws(generator: torch.Generator) -> list:
    """The next numbers of every random stream a run uses."""
    return [torch.rand(3, generator=generator), torch.rand(3), np.random.rand(3), random.random()]


def test_a_restored_run_is_the_saved_one_in_every_part_its_random_streams_included(tmp_path):
    settings, agent, optimizer, normalizers, generator = fresh_run_state(0)
    for seed in range(2):
        buffer = filled_buffer(seed)
        normalizers["obs_normalizer"](buffer.observations.reshape(-1, 5))
        normalizers["reward_scaler"](buffer.rewards[0], buffer.terminateds[0])
        normalizers["value_normalizer"].update(buffer.returns, buffer.valid)
        ppo_update(agent, optimizer, buffer, settings.ppo, generator)
    torch.manual_seed(11), np.random.seed(12), random.seed(13)
    path = save_checkpoint(tmp_path, training_state(settings, 2, 256, agent, optimizer, normalizers, generator,
                                                    [["", [5]]], [(4.0, 1.5)]))
    expected = draws(generator)
    saved = load_checkpoint(path, CPU)

    _, agent2, optimizer2, normalizers2, generator2 = fresh_run_state(1)  # other weights, other streams
    np.random.seed(99), random.seed(99)
    restore_training_state(saved, agent2, optimizer2, normalizers2, generator2)
    again = training_state(settings, 2, 256, agent2, optimizer2, normalizers2, generator2, [["", [5]]], [(4.0, 1.5)])
    for key in ("agent", "obs_normalizer", "reward_scaler", "value_normalizer"):
        assert saved[key].keys() == again[key].keys()
        assert all(torch.equal(saved[key][name], again[key][name]) for name in saved[key]), key
    for state, restored in zip(saved["optimizer"]["state"].values(), again["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(state[name], restored[name]) for name in state)
    assert saved["recent_episodes"] == [[4.0, 1.5]] and saved["observation_layout"] == [["", [5]]]
    assert saved["numpy_rng"]["keys"].dtype == torch.int64  # numbers, which a weights-only load reads
    assert saved["cuda_rng"] is None if not torch.cuda.is_available() else len(saved["cuda_rng"]) > 0
    for got, want in zip(draws(generator2), expected, strict=True):  # every stream continues where it stood
        assert np.array_equal(np.asarray(got), np.asarray(want))


def scalars(run_dir) -> dict[str, dict[int, float]]:
    """Every scalar of the run's TensorBoard files but its timings and rates, by tag and step."""
    found: dict[str, dict[int, float]] = {}
    for file in sorted(run_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            if not tag.startswith(("time/", "charts/SPS")):
                found.setdefault(tag, {}).update({e.step: e.value for e in events.Scalars(tag)})
    return found


def test_a_run_stopped_and_resumed_is_the_uninterrupted_run_bit_for_bit(tmp_path, monkeypatch):
    # On a task whose episodes restart at the resume point (the toy chain's 7-step cycle: episodes of 2
    # and 3 steps and their dummies; 7-step rollouts end on its boundary), nothing tells a resumed run from
    # the uninterrupted one: weights, Adam's state, every normaliser, every random stream, every logged
    # number and the final score. Simulators that cannot be saved (envpool's, MuJoCo's) restart their
    # episodes elsewhere; there the resumed run goes on from the same state into other episodes.
    from ppo import trainer

    register_toy_envs()

    def settings(total: int, resume: str | None = None):
        return settings_from_dict({
            "total_timesteps": total, "device": "cpu", "seed": 5, "resume": resume, "checkpoint": {"every": 0},
            "env": {"id": TOY_ID, "num_envs": 3, "backend": "gymnasium"},
            "ppo": {"num_steps": 7, "num_minibatches": 3, "update_epochs": 2, "normalize_values": True,
                    "ent_coef": 0.01}})

    class StoppedAfterThreeIterations(trainer.StopOnSignal):
        """As a SIGTERM during the third iteration: the run saves after it and ends (its schedule still
        aims at the whole run's steps)."""

        def agreed(self, device) -> bool:
            self.asked = getattr(self, "asked", 0) + 1
            if self.asked == 4:
                self.requested = "SIGTERM"
            return self.requested is not None

    whole, split = tmp_path / "whole", tmp_path / "split"
    score = trainer.train(settings(6 * 21), str(whole), CPU)
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "StopOnSignal", StoppedAfterThreeIterations)
        trainer.train(settings(6 * 21), str(split), CPU)
    assert load_checkpoint(split / "checkpoints" / "last.pt", CPU)["global_step"] == 3 * 21
    resumed_score = trainer.train(settings(6 * 21, resume=str(split)), str(split), CPU)
    assert resumed_score == score
    a, b = (load_checkpoint(d / "checkpoints" / "last.pt", CPU) for d in (whole, split))
    assert (a["global_step"], a["iteration"], a["recent_episodes"]) == (b["global_step"], b["iteration"],
                                                                        b["recent_episodes"])
    for key in ("agent", "obs_normalizer", "reward_scaler", "value_normalizer"):
        assert all(torch.equal(a[key][name], b[key][name]) for name in a[key]), key
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(x[name], y[name]) for name in x)
    for key in ("generator", "torch_rng"):
        assert torch.equal(a[key], b[key])
    logged, resumed_logged = scalars(whole), scalars(split)
    assert len(list(split.glob("events.out.tfevents.*"))) == 2 and logged == resumed_logged
    assert len(logged["charts/episodic_return"]) == 6 and len(logged["losses/policy_loss"]) == 6


@pytest.mark.parametrize("resumed", [False, True])
def test_the_first_observations_of_a_resumed_run_are_normalised_not_folded_in_again(resumed):
    # The restored statistics already hold the last step's observations; a fresh run's start adds its own.
    from ppo.collect import Collector
    from ppo.config import EnvSettings
    from ppo.envs import make_envs
    from tests.test_collect import KnownPolicy

    register_toy_envs()
    envs = make_envs(EnvSettings(id=TOY_ID, num_envs=2, backend="gymnasium"), CPU, seed=0)
    normalizer = ObservationNormalizer(1, CPU)
    Collector(envs, KnownPolicy(), normalizer, RewardScaler(2, 0.99, CPU), CPU, seed=0,
              **({"resumed": True} if resumed else {}))  # a fresh collector by default
    envs.close()
    assert normalizer.rms.count.item() == pytest.approx(1e-4 if resumed else 2 + 1e-4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real checkpoint of a few updates, written by save_checkpoint, and its path."""
    settings, agent, optimizer, normalizers, generator = fresh_run_state(3)
    ppo_update(agent, optimizer, filled_buffer(0), settings.ppo, generator)
    directory = tmp_path_factory.mktemp("run")
    return save_checkpoint(directory, training_state(settings, 1, 128, agent, optimizer, normalizers, generator,
                                                     [["", [5]]]))


def refused(path, device=CPU) -> str:
    from ppo.run.checkpoint import CheckpointError

    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path, device)
    return str(error.value)


def test_what_is_not_a_checkpoint_is_named_for_what_it_is(saved, tmp_path):
    import zipfile

    (tmp_path / "log.pt").write_text("a log\n")
    assert refused(tmp_path / "log.pt") == (f"{tmp_path / 'log.pt'} is not a checkpoint: not a file torch.save wrote "
                                            "(a log, say), or a copy of one cut short")
    (tmp_path / "cut.pt").write_bytes(saved.read_bytes()[:-100])
    assert refused(tmp_path / "cut.pt").startswith(f"{tmp_path / 'cut.pt'} is not a checkpoint: not a file")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("x/other.txt", "not torch's")
    assert "not a file torch.save wrote" in refused(tmp_path / "other.zip")
    torch.save({"agent": {}}, tmp_path / "few.pt")
    assert refused(tmp_path / "few.pt") == (f"{tmp_path / 'few.pt'} is not a checkpoint of train.py: a torch file "
                                            "without `settings`, `iteration`, `global_step`, ... (it writes <run "
                                            "dir>/checkpoints/last.pt)")
    torch.save([1, 2], tmp_path / "list.pt")
    assert "a torch file without `settings`, `iteration`, `global_step`, ..." in refused(tmp_path / "list.pt")
    state = torch.load(saved, weights_only=True)
    torch.save({k: v for k, v in state.items() if k != "python_rng"}, tmp_path / "one.pt")
    assert refused(tmp_path / "one.pt").endswith("a torch file without `python_rng` (it writes <run "
                                                 "dir>/checkpoints/last.pt)")


@pytest.mark.parametrize(("key", "value", "said"), [
    ("settings", {"ppo": {}}, "`settings` is dict {'ppo': {}}, not a dict of settings"),
    ("iteration", -1, "`iteration` is int -1, not a count of iterations"),
    ("iteration", 2.0, "`iteration` is float 2.0, not a count of iterations"),
    ("global_step", True, "`global_step` is bool True, not a count of steps"),
    ("agent", {}, "`agent` is an empty dict, not the model's weights"),
    ("agent", {"w": [1.0]}, "`agent` is dict {'w': [1.0]}, not the model's weights"),
    ("optimizer", {"state": {}, "param_groups": []}, "`optimizer` is dict {'state': {}, 'param_groups': []}, not an "
                                                     "optimiser state"),
    ("optimizer", {"state": [], "param_groups": [{}]}, "`optimizer` is dict {'state': [], 'param_groups': [{}]}, "
                                                       "not an optimiser state"),
    ("obs_normalizer", [], "`obs_normalizer` is an empty list, not a normaliser state"),
    ("reward_scaler", "x", "`reward_scaler` is str 'x', not a normaliser state"),
    ("generator", torch.zeros(0, dtype=torch.uint8), "`generator` is a torch.uint8 tensor of shape (0,), not a "
                                                     "generator state"),
    ("torch_rng", torch.zeros(4), "`torch_rng` is a torch.float32 tensor of shape (4,), not a generator state"),
    ("torch_rng", torch.zeros(2, 2, dtype=torch.uint8), "`torch_rng` is a torch.uint8 tensor of shape (2, 2), not a "
                                                        "generator state"),
])
def test_a_checkpoint_whose_part_is_of_the_wrong_form_names_the_part_and_the_form(saved, tmp_path, key, value, said):
    state = torch.load(saved, weights_only=True)
    state[key] = value
    torch.save(state, tmp_path / "damaged.pt")
    assert refused(tmp_path / "damaged.pt") == (f"{tmp_path / 'damaged.pt'} is not a whole checkpoint of train.py: "
                                                f"its {said} (a damaged or edited file; an earlier copy of the run, if "
                                                "any, is the one to use)")


def test_a_long_value_is_cut_to_eighty_characters_in_the_message():
    from ppo.run.checkpoint import _kind

    assert _kind("x" * 200) == ("str '" + "x" * 200)[:80] and len(_kind("x" * 200)) == 80


@pytest.mark.parametrize(("part", "where"), [
    ("obs_normalizer", "`obs_normalizer` (mean)"), ("reward_scaler", "`reward_scaler` (var)"),
    ("value_normalizer", "`value_normalizer` (count)"), ("agent", "`agent` (critic.0.bias)")])
def test_every_part_that_training_makes_is_checked_finite_where_it_is_loaded_and_saved(saved, tmp_path, part, where):
    from ppo.run.checkpoint import NonFiniteState, non_finite_part

    state = torch.load(saved, weights_only=True)
    assert non_finite_part(state) is None
    name = where.split("(")[1].rstrip(")")
    state[part][name].view(-1)[0] = -math.inf
    assert non_finite_part(state) == where
    torch.save(state, tmp_path / "inf.pt")
    assert refused(tmp_path / "inf.pt") == (f"{tmp_path / 'inf.pt'} holds NaN or inf in {where}: no policy or resume "
                                            "can come of it (a damaged or edited file; an earlier copy of the run, if "
                                            "any, is the one to use)")
    with pytest.raises(NonFiniteState, match=rf"^{re.escape(where)} holds NaN or inf$"):
        save_checkpoint(tmp_path / "run", state)
    assert not (tmp_path / "run").exists()  # nothing written, not even the dir


def test_the_finite_check_reads_floats_lists_and_nested_dicts_and_skips_integers_and_strings():
    from ppo.run.checkpoint import non_finite_part

    assert non_finite_part({"optimizer": {"param_groups": [{"lr": 3e-4, "name": "x", "step": 5}]}}) is None
    assert non_finite_part({"optimizer": {"param_groups": [{"lr": math.nan}]}}) == "`optimizer` (param_groups.0.lr)"
    assert non_finite_part({"agent": {"steps": torch.tensor([2**62])}}) is None
    assert non_finite_part({"generator": torch.tensor([math.nan])}) is None  # not a part training makes
    assert non_finite_part({}) is None


def test_resolve_checkpoint_takes_a_file_or_a_run_dir_and_names_the_runs_below_a_dir(saved, tmp_path):
    import time as clock

    from ppo.run.checkpoint import resolve_checkpoint, run_dir_of, runs_below

    assert resolve_checkpoint(str(saved)) == saved and resolve_checkpoint(str(saved.parent.parent)) == saved
    assert run_dir_of(saved) == saved.parent.parent and run_dir_of(tmp_path / "x.pt") == tmp_path
    with pytest.raises(FileNotFoundError) as missing:
        resolve_checkpoint(str(tmp_path / "none"))
    assert str(missing.value) == (f"no checkpoint at {tmp_path / 'none'} (give a checkpoint file or a run dir holding "
                                  "checkpoints/last.pt)")
    runs = []
    for name in ("a/one", "a/two", "b/three", "four", "c/d/deep"):  # "deep" is three levels down: not searched
        path = tmp_path / "runs" / name / "checkpoints" / "last.pt"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
        runs.append(path.parent.parent)
        clock.sleep(0.01)  # newer each
    assert runs_below(tmp_path / "runs") == runs[3::-1]
    with pytest.raises(FileNotFoundError) as listed:
        resolve_checkpoint(str(tmp_path / "runs"))
    assert str(listed.value) == (f"no checkpoint at {tmp_path / 'runs' / 'checkpoints' / 'last.pt'}; run dirs below "
                                 f"it, newest first: {runs[3]}, {runs[2]}, {runs[1]} and 1 more")
    assert runs_below(tmp_path / "runs", depth=3)[0] == runs[4]


def test_a_stale_temporary_file_is_removed_and_a_failed_save_leaves_none(saved, tmp_path, monkeypatch):
    from ppo.run.checkpoint import remove_stale_temporary

    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / "last.tmp"
    stale.write_bytes(b"cut short")
    remove_stale_temporary(tmp_path)
    assert not stale.exists()
    remove_stale_temporary(tmp_path)  # none there: nothing to do

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ppo.run.checkpoint.torch, "save", full)
    with pytest.raises(OSError) as error:
        save_checkpoint(tmp_path, {"x": torch.zeros(1)})
    assert error.value.filename == str(stale) and not stale.exists()


def test_an_older_checkpoint_with_numpys_array_loads_and_other_objects_do_not(saved, tmp_path):
    import fractions

    state = torch.load(saved, weights_only=True)
    older = dict(state, numpy_rng=np.random.get_state())  # numpy's own tuple, with an array: as before 2026-12-04
    torch.save(older, tmp_path / "older.pt")
    loaded = load_checkpoint(tmp_path / "older.pt", CPU)
    np.random.seed(0)
    ppo.run.checkpoint.set_numpy_rng_state(loaded["numpy_rng"])
    assert np.array_equal(np.random.get_state()[1], older["numpy_rng"][1])
    torch.save(dict(state, extra=fractions.Fraction(1, 3)), tmp_path / "objects.pt")
    assert refused(tmp_path / "objects.pt") == (
        f"{tmp_path / 'objects.pt'} is not a checkpoint of train.py: it holds objects a checkpoint does not "
        "(fractions.Fraction), which loading would run code to rebuild")


def test_a_pickle_that_no_unpickler_reads_is_one_line(saved, tmp_path):
    import zipfile

    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(tmp_path / "garbled.pt", "w") as archive:
        for name in source.namelist():
            archive.writestr(name, b"garbled" if name.endswith("/data.pkl") else source.read(name))
    said = refused(tmp_path / "garbled.pt")
    assert said.startswith(f"{tmp_path / 'garbled.pt'} is not a checkpoint: torch.load cannot read it (")
    assert "\n" not in said and ". " not in said.split("(", 1)[1]


def test_a_model_that_does_not_fit_is_named_by_its_first_mismatch():
    from ppo.config import ConfigError
    from ppo.run.checkpoint import load_agent_weights

    small, large = Agent(5, 2), Agent(7, 2)
    with pytest.raises(ConfigError) as error:
        load_agent_weights(small, large.state_dict(), "resume: it does not fit")
    assert str(error.value).startswith("resume: it does not fit (size mismatch for ") and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"^x \(Missing key\(s\) in state_dict: "):
        load_agent_weights(small, {}, "x")


def test_an_observation_layout_in_another_order_is_refused_and_other_differences_are_left_to_the_weights():
    from ppo.config import ConfigError
    from ppo.run.checkpoint import check_observation_layout

    dict_layout = [["position", [5]], ["velocity", [6]]]
    check_observation_layout({"observation_layout": dict_layout}, dict_layout, "x")  # the same
    check_observation_layout({}, [["", [11]]], "x")  # from before layouts were recorded
    check_observation_layout({"observation_layout": [["", [12]]]}, [["", [11]]], "x")  # another count: the weights
    with pytest.raises(ConfigError) as error:
        check_observation_layout({"observation_layout": dict_layout}, [["", [11]]], "resume=r")
    assert str(error.value) == ("resume=r: its agent saw observations as position (5,), velocity (6,); here they come "
                                "as one array (11,): the same 11 numbers laid out otherwise, which it would read as "
                                "other features")
    with pytest.raises(ConfigError, match=r"as one array \(2, 3\); here they come as a \(6,\)"):
        check_observation_layout({"observation_layout": [["", [2, 3]]]}, [["a", [6]]], "x")


def test_a_part_torch_refuses_to_restore_is_named():
    from ppo.config import ConfigError

    settings, agent, optimizer, normalizers, generator = fresh_run_state(0)
    state = training_state(settings, 0, 0, agent, optimizer, normalizers, generator, [["", [5]]])
    state["generator"] = state["generator"][:8]
    with pytest.raises(ConfigError) as error:
        restore_training_state(state, agent, optimizer, normalizers, generator)
    assert str(error.value).startswith("resume: the checkpoint's `generator` does not restore (")
    assert str(error.value).endswith("): a damaged or edited file")
    older = training_state(settings, 0, 0, agent, optimizer, normalizers, generator, [["", [5]]])
    del older["value_normalizer"]  # from before value normalisation: restores without it
    restore_training_state(older, agent, optimizer, normalizers, generator)


@pytest.mark.parametrize(("part", "damage"), [
    ("optimizer", lambda state: state["optimizer"]["param_groups"].clear()),
    ("torch_rng", lambda state: state.update(torch_rng=state["torch_rng"][:8])),
    ("numpy_rng", lambda state: state.update(numpy_rng={**state["numpy_rng"],
                                                        "keys": torch.zeros(3, dtype=torch.int64)})),
    ("python_rng", lambda state: state.update(python_rng=(3, (1, 2), None)))])
def test_each_part_that_does_not_restore_is_named(saved, part, damage):
    from ppo.config import ConfigError

    state = torch.load(saved, weights_only=True)
    damage(state)
    settings, agent, optimizer, normalizers, generator = fresh_run_state(3)
    with pytest.raises(ConfigError, match=rf"^resume: the checkpoint's `{part}` does not restore \(.*\): a damaged "
                                          "or edited file$"):
        restore_training_state(state, agent, optimizer, normalizers, generator)


def test_a_model_of_another_shape_is_refused_as_the_resumes_own_words_say(saved):
    from ppo.config import ConfigError

    state = torch.load(saved, weights_only=True)
    _, _, optimizer, normalizers, generator = fresh_run_state(3)
    with pytest.raises(ConfigError, match=r"^resume: the checkpoint's model does not fit this env/model config "
                                          r"\(size mismatch for "):
        restore_training_state(state, Agent(7, 2), optimizer, normalizers, generator)


def test_a_checkpoint_goes_into_a_run_dir_not_made_yet(tmp_path):
    path = save_checkpoint(tmp_path / "runs" / "new", {"x": torch.ones(2)})
    assert path == tmp_path / "runs" / "new" / "checkpoints" / "last.pt" and path.is_file()


def test_a_run_at_its_very_start_is_a_whole_checkpoint(saved):
    from ppo.run.checkpoint import wrong_contents

    state = torch.load(saved, weights_only=True)
    state.update(iteration=0, global_step=0, generator=torch.tensor([7], dtype=torch.uint8))
    assert wrong_contents(state) is None  # zero counts, and a random state of any non-empty length, pass the form
