"""Data parallel on CPU with two gloo workers: after an update both ranks hold the same parameters,
equal to one worker's update on the combined batch; normaliser statistics merge; torchrun runs."""

import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any group exists, as distributed.start has it (why: there)
import torch.multiprocessing as mp

from buffers import RolloutBuffer
from ppo.agent import Agent
from ppo.config import PPOSettings
from ppo.normalize import RunningMeanStd
from ppo.update import ppo_update
from tests.conftest import ROOT, filled_buffer

NUM_STEPS, NUM_ENVS, OBS, ACT = 8, 3, 4, 2
# One full-batch minibatch and no advantage normalisation: the mean loss over the combined batch is
# then exactly the mean of the two workers' losses, so their averaged gradient is its gradient.
SETTINGS = PPOSettings(num_minibatches=1, update_epochs=2, norm_adv="off")


def worker_buffer(seed: int) -> RolloutBuffer:
    """One worker's rollout; every step valid, so that the two workers' losses weigh alike."""
    return filled_buffer(seed, NUM_STEPS, NUM_ENVS, OBS, ACT, invalid_fraction=0.0)


def combined_buffer() -> RolloutBuffer:
    parts = [worker_buffer(seed) for seed in (10, 11)]
    buffer = RolloutBuffer(NUM_STEPS, 2 * NUM_ENVS, OBS, ACT, torch.device("cpu"))
    for name in ("observations", "actions", "log_probs", "values", "advantages", "returns", "valid"):
        getattr(buffer, name).copy_(torch.cat([getattr(p, name) for p in parts], dim=1))
    return buffer


def worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    agent = Agent(OBS, ACT)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    ppo_update(agent, optimizer, worker_buffer(10 + rank), SETTINGS, torch.Generator().manual_seed(rank))
    rms = RunningMeanStd((OBS,), torch.device("cpu"))
    rms.update(worker_buffer(20 + rank).observations.reshape(-1, OBS))
    torch.save({"agent": agent.state_dict(), "rms": rms.state_dict()}, f"{out_dir}/rank{rank}.pt")
    # Both ranks done before either tears its connections down, as ppo/distributed.py does.
    dist.barrier()
    dist.destroy_process_group()


def test_two_workers_match_each_other_and_one_worker_with_the_combined_batch(tmp_path):
    mp.spawn(worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for key, value in ranks[0]["agent"].items():
        torch.testing.assert_close(ranks[1]["agent"][key], value, rtol=0, atol=0)

    torch.manual_seed(0)
    agent = Agent(OBS, ACT)
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2, eps=1e-5)
    ppo_update(agent, optimizer, combined_buffer(), SETTINGS, torch.Generator().manual_seed(0))
    for key, value in agent.state_dict().items():
        torch.testing.assert_close(ranks[0]["agent"][key], value, rtol=1e-5, atol=1e-6)

    rms = RunningMeanStd((OBS,), torch.device("cpu"))
    rms.update(torch.cat([worker_buffer(20 + r).observations.reshape(-1, OBS) for r in (0, 1)]))
    for r in (0, 1):
        torch.testing.assert_close(ranks[r]["rms"]["mean"], rms.mean)
        torch.testing.assert_close(ranks[r]["rms"]["var"], rms.var)


def two_workers(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`script` run by torchrun as two workers on this host, from the repo root (importable there)."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script, *args],
        # faulthandler: a worker that aborts prints where it was
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": search_path()})


def search_path() -> str:
    """The repo root ahead of the caller's own PYTHONPATH, which may hold the packages (kept, not replaced)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def torchrun(*overrides: str) -> subprocess.CompletedProcess:
    return two_workers("train.py", "env=InvertedPendulum-v4", "env.num_envs=4", "env.num_threads=1", "ppo.num_steps=64",
                       "ppo.num_minibatches=4", "ppo.update_epochs=1", "device=cpu", *overrides)


def output(result: subprocess.CompletedProcess) -> str:
    return f"{result.stdout[-2000:]}\n--- stderr ---\n{result.stderr[-6000:]}"


def test_torchrun_trains_with_two_workers_one_run_dir_and_resumes(tmp_path):
    # Each worker's Hydra makes a run dir, the default's at `${now:...}` of its own clock read: here each
    # is given another dir, as when the second worker's read comes a second after rank 0's. Rank 0's
    # dir holds the run; the other worker removes its own, which holds only `.hydra/`.
    first = torchrun("total_timesteps=1024", f"hydra.run.dir={tmp_path / 'a'}" + "${oc.env:RANK}")
    assert first.returncode == 0, output(first)
    assert "x 2 workers" in first.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a0"]
    checkpoint = torch.load(tmp_path / "a0" / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["global_step"] == 1024 and checkpoint["iteration"] == 2  # 2 workers x 256 steps x 2
    assert len(list((tmp_path / "a0").glob("events.out.tfevents.*"))) == 1  # rank 0 alone writes

    second = torchrun("total_timesteps=2048", f"resume={tmp_path / 'a0'}", f"hydra.run.dir={tmp_path / 'b'}")
    assert second.returncode == 0, output(second)
    resumed = torch.load(tmp_path / "b" / "checkpoints" / "last.pt", weights_only=True)
    assert (resumed["global_step"], resumed["iteration"]) == (2048, 4)


# A torchrun worker that joins the group, builds an optimiser (whose first construction imports
# torch._dynamo, and with it torch.distributed.nn, as train.py's does), and leaves the group.
_JOIN_AND_LEAVE = """
import os
import sys
import torch
from ppo import distributed

def gloo_threads():
    # Gloo's threads name themselves (pt_gloo_runloop, and gloo_tcp_loop on newer torch); other
    # libraries start threads of their own meanwhile (on a GPU host's CUDA build, one named
    # cuda00002c0000c by the time the group had left), so a plain count would blame gloo.
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended while we listed them
            pass
    return sum("gloo" in name for name in names)

before = gloo_threads()
distributed.start(torch.device("cpu"))
# A worker names itself when it starts, which under load can come after the group is made; one has
# run this all-reduce, so it has a name by the time the call returns.
torch.distributed.all_reduce(torch.zeros(1))
joined = gloo_threads()
torch.optim.Adam(torch.nn.Linear(2, 2).parameters())
distributed.stop()
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
    f.write(f"{before} {joined} {gloo_threads()}")
"""


def test_leaving_the_group_ends_its_gloo_threads_before_the_interpreter_shuts_down(tmp_path):
    # Left running into the interpreter's shutdown, a gloo thread that drops a finished all-reduce's
    # tensors there needs the GIL and aborts the process (distributed.start says how they were kept).
    script = tmp_path / "join_and_leave.py"
    script.write_text(_JOIN_AND_LEAVE)
    result = two_workers(str(script), str(tmp_path), timeout=120)
    assert result.returncode == 0, output(result)
    for rank in (0, 1):
        before, joined, after = map(int, (tmp_path / f"rank{rank}").read_text().split())
        assert before == 0 and joined > 0, f"rank {rank}: {before} gloo threads before joining, {joined} in the group"
        assert after == 0, f"rank {rank}: {after} gloo threads still running after leaving the group"
