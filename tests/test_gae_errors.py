"""Every bad input to compute_gae raises a TypeError/ValueError that names the argument."""

import os
import subprocess
import sys

import pytest
import torch

import kernels.gae
from kernels import compute_gae
from tests.conftest import ROOT
from tests.rollouts import random_rollout


def rollout(**overrides):
    args = random_rollout(3, 8, density=0.2, seed=1)
    args.update(overrides)
    return args


BAD_INPUTS = [
    ("rewards not a tensor", {"rewards": [[0.0] * 8] * 3}, TypeError, "`rewards` must be a torch.Tensor"),
    ("values 1-D", {"values": torch.zeros(8)}, ValueError, r"`values` must be 2-D"),
    ("values int", {"values": torch.zeros(3, 8, dtype=torch.int32)}, TypeError, "`values` must be float32"),
    ("values float16", {"values": torch.zeros(3, 8, dtype=torch.float16)}, TypeError, "`values` must be float32"),
    ("rewards wrong shape", {"rewards": torch.zeros(3, 7)}, ValueError, r"`rewards` must have shape \(3, 8\)"),
    ("terminateds wrong shape", {"terminateds": torch.zeros(8, 3, dtype=torch.bool)}, ValueError,
     r"`terminateds` must have shape \(3, 8\) \[num_envs, seq_len\], got \(8, 3\)"),
    ("rewards float64 beside float32 values", {"rewards": torch.zeros(3, 8, dtype=torch.float64)}, TypeError,
     r"`rewards` must have the dtype of `values` \(torch.float32\), got torch.float64"),
    ("terminateds int64", {"terminateds": torch.zeros(3, 8, dtype=torch.int64)}, TypeError,
     "`terminateds` must be bool, uint8, float32 or float64, got torch.int64"),
    ("truncateds without bootstrap", {"bootstrap_values": None}, ValueError,
     "`truncateds` needs `bootstrap_values`"),
    ("last_value with bootstrap", {"last_value": torch.zeros(3)}, ValueError,
     "either `last_value` or `bootstrap_values`, not both"),
    ("last_value wrong shape", {"truncateds": None, "bootstrap_values": None, "last_value": torch.zeros(3, 1)},
     ValueError, r"`last_value` must have shape \(3,\) \[num_envs\]"),
    ("bootstrap wrong dtype", {"bootstrap_values": torch.zeros(3, 8, dtype=torch.float64)}, TypeError,
     "`bootstrap_values` must have the dtype of `values`"),
    ("gamma above 1", {"gamma": 1.5}, ValueError, r"`gamma` must be in \[0, 1\], got 1.5"),
    ("lam negative", {"lam": -0.1}, ValueError, r"`lam` must be in \[0, 1\], got -0.1"),
    ("lam nan", {"lam": float("nan")}, ValueError, "`lam` must be in"),
    ("gamma a string", {"gamma": "0.99"}, TypeError, "`gamma` must be a float"),
    ("gamma a tensor", {"gamma": torch.tensor(0.99)}, TypeError, "`gamma` must be a float"),
    ("advantages wrong shape", {"advantages": torch.zeros(3, 9)}, ValueError, "`advantages` must have shape"),
    ("returns wrong dtype", {"returns": torch.zeros(3, 8, dtype=torch.float64)}, TypeError,
     "`returns` must have the dtype of `values`"),
    ("advantages expanded", {"advantages": torch.zeros(3, 1).expand(3, 8)}, ValueError, "zero stride"),
]


@pytest.mark.parametrize("after_a_good_call", [False, True], ids=["first_call", "after_a_good_call"])
@pytest.mark.parametrize("case,overrides,error,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_raises_naming_the_argument(case, overrides, error, message, after_a_good_call):
    # After a good call, a bad one with the same tensor signature (bad scalars) finds it among the
    # validated ones: it must still be refused.
    if after_a_good_call:
        good = rollout()
        compute_gae(**good, advantages=torch.empty(3, 8), returns=torch.empty(3, 8))
    args = rollout(**overrides)
    with pytest.raises(error, match=message):
        compute_gae(**args)


@pytest.mark.parametrize("after_a_good_call", [False, True], ids=["first_call", "after_a_good_call"])
def test_outputs_must_not_alias_inputs_or_each_other(after_a_good_call):
    args = rollout()
    if after_a_good_call:  # the same signature as the bad calls below
        compute_gae(**args, advantages=torch.empty(3, 8), returns=torch.empty(3, 8))
    for name in ("rewards", "values", "bootstrap_values"):
        with pytest.raises(ValueError, match="`advantages` must not share memory with an input"):
            compute_gae(**args, advantages=args[name])
        with pytest.raises(ValueError, match="`returns` must not share memory with an input"):
            compute_gae(**args, returns=args[name])
    out = torch.empty(3, 8)
    with pytest.raises(ValueError, match="`advantages` and `returns` must not share memory"):
        compute_gae(**args, advantages=out, returns=out)


def overlapping_outputs(case: str, args: dict) -> dict:
    """Outputs that overlap an input, each other or themselves somewhere other than their first element."""
    if case == "advantages a shifted view of values":
        storage = torch.randn(25)
        args["values"] = storage[:24].view(3, 8)
        return {"advantages": storage[1:].view(3, 8)}
    if case == "returns overlapping rewards by one element":
        storage = torch.randn(47)
        args["rewards"] = storage[:24].view(3, 8)
        return {"returns": storage[23:].view(3, 8)}
    if case == "advantages and returns overlapping":
        storage = torch.empty(3, 9)
        return {"advantages": storage[:, :8], "returns": storage[:, 1:]}
    if case == "advantages overlapping itself (strides 1, 1)":
        return {"advantages": torch.empty(10).as_strided((3, 8), (1, 1))}
    if case == "returns overlapping itself (strides 2, 1)":
        return {"returns": torch.empty(12).as_strided((3, 8), (2, 1))}
    raise AssertionError(case)


OVERLAPS = {
    "advantages a shifted view of values": "`advantages` must not share memory with an input; it overlaps `values`",
    "returns overlapping rewards by one element":
        "`returns` must not share memory with an input; it overlaps `rewards`",
    "advantages and returns overlapping": "`advantages` and `returns` must not share memory; they overlap",
    "advantages overlapping itself (strides 1, 1)": r"`advantages` overlaps itself \(strides \(1, 1\)",
    "returns overlapping itself (strides 2, 1)": r"`returns` overlaps itself \(strides \(2, 1\)",
}


@pytest.mark.parametrize("after_a_good_call", [False, True], ids=["first_call", "after_a_good_call"])
@pytest.mark.parametrize("case", list(OVERLAPS))
def test_outputs_that_overlap_anywhere_are_refused(case, after_a_good_call):
    # Only a shared first element was caught once: these returned wrong numbers, differently on each path.
    args = rollout()
    outputs = overlapping_outputs(case, args)
    if after_a_good_call:
        if "itself" in case:
            pytest.skip("no good call has the signature of a layout that overlaps itself")
        # The same signature as the bad call, with outputs of their own: only the addresses differ.
        compute_gae(**args, **{name: torch.empty_strided(x.shape, x.stride()) for name, x in outputs.items()})
    with pytest.raises(ValueError, match=OVERLAPS[case]):
        compute_gae(**args, **outputs)


@pytest.mark.parametrize("path", ["reference", "kernel"])
def test_interleaved_views_of_one_storage_that_do_not_overlap_are_accepted(path, request, monkeypatch):
    # Their address ranges meet, so the exact check runs, and finds every element apart.
    if path == "reference":
        request.getfixturevalue("gae_by_reference")
    else:
        monkeypatch.setattr(kernels.gae, "_runs", {})
    args = rollout()
    expected_adv, expected_ret = compute_gae(**args)
    storage = torch.full((3, 8, 3), float("nan"))
    storage[..., 0] = args["values"]
    args["values"] = storage[..., 0]
    for _ in range(2):  # the second call finds the addresses known to be apart
        adv, ret = compute_gae(**args, advantages=storage[..., 1], returns=storage[..., 2])
        torch.testing.assert_close(adv, expected_adv)
        torch.testing.assert_close(ret, expected_ret)


def test_tensors_on_a_device_without_data_are_refused_as_such():
    args = {name: x.to("meta") for name, x in rollout().items()}
    with pytest.raises(ValueError, match="runs on CPU and CUDA tensors; `values` is on meta"):
        compute_gae(**args)


def test_a_tensor_reshaped_in_place_after_a_good_call_is_checked_again():
    args = rollout()
    compute_gae(**args)
    args["rewards"].resize_(3, 7)
    with pytest.raises(ValueError, match=r"`rewards` must have shape \(3, 8\)"):
        compute_gae(**args)
    args = rollout(truncateds=None, bootstrap_values=None, last_value=torch.zeros(3))
    compute_gae(**args)
    args["last_value"].unsqueeze_(1)
    with pytest.raises(ValueError, match=r"`last_value` must have shape \(3,\)"):
        compute_gae(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mismatched_devices():
    args = rollout(rewards=random_rollout(3, 8)["rewards"].cuda())
    with pytest.raises(ValueError, match="`rewards` is on cuda:0 but `values` is on cpu"):
        compute_gae(**args)


def test_mismatched_devices_on_meta():
    # A second device without a GPU: the meta device has shapes but no data.
    args = rollout(rewards=torch.zeros(3, 8, device="meta"))
    with pytest.raises(ValueError, match="`rewards` is on meta but `values` is on cpu"):
        compute_gae(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_float64_on_cuda_is_refused():
    args = {k: v.cuda() for k, v in rollout().items()}
    args["values"], args["rewards"] = args["values"].double(), args["rewards"].double()
    args["bootstrap_values"] = args["bootstrap_values"].double()
    with pytest.raises(TypeError, match="float64 is supported on the CPU path only"):
        compute_gae(**args)


class TestCorrectnessChecks:
    @pytest.fixture(autouse=True)
    def checks_on(self, monkeypatch):
        # RL_TRITON_CORRECTNESS_WARNINGS=1 sets this flag when `kernels` is imported.
        monkeypatch.setattr(kernels.gae, "_CORRECTNESS_CHECKS", True)

    def test_clean_rollout_passes(self):
        compute_gae(**rollout())

    def test_step_both_terminated_and_truncated(self):
        args = rollout()
        args["terminateds"] = torch.zeros(3, 8, dtype=torch.bool)
        args["truncateds"] = torch.zeros(3, 8, dtype=torch.bool)
        args["terminateds"][1, 4] = args["truncateds"][1, 4] = True
        args["terminateds"][2, 6] = args["truncateds"][2, 6] = True
        with pytest.raises(ValueError, match="env 1, step 4 is both terminated and truncated"):
            compute_gae(**args)

    def test_stray_bootstrap_value(self):
        args = rollout()
        args["truncateds"] = torch.zeros(3, 8, dtype=torch.bool)
        args["terminateds"] = torch.zeros(3, 8, dtype=torch.bool)
        args["bootstrap_values"] = torch.zeros(3, 8)
        args["bootstrap_values"][:, -1] = 1.0  # the last column is allowed
        args["bootstrap_values"][2, 3] = 0.5
        with pytest.raises(ValueError, match=r"nonzero \(0.5\) at env 2, step 3"):
            compute_gae(**args)

    def test_checks_are_off_by_default(self, monkeypatch):
        monkeypatch.setattr(kernels.gae, "_CORRECTNESS_CHECKS", False)
        args = rollout()
        args["terminateds"] = args["truncateds"] = torch.ones(3, 8, dtype=torch.bool)
        compute_gae(**args)


def test_environment_variable_turns_the_checks_on():
    code = "import kernels.gae as g; print(g._CORRECTNESS_CHECKS)"
    for value, expected in (("1", "True"), ("0", "False")):
        env = {**os.environ, "RL_TRITON_CORRECTNESS_WARNINGS": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=ROOT)
        assert out.stdout.strip() == expected


def test_integer_and_numpy_discounts_are_accepted():
    import numpy as np

    args = rollout()
    a1, _ = compute_gae(**args, gamma=1, lam=np.float64(0.5))
    a2, _ = compute_gae(**args, gamma=1.0, lam=0.5)
    torch.testing.assert_close(a1, a2, rtol=0, atol=0)
