# A CUDA PyTorch image that trains by default. Runs land in /app/runs, so mount a host dir there:
#   docker run --gpus all -v "$PWD/runs:/app/runs" ppo-triton env=Hopper-v4
#   docker run --gpus all -v "$PWD/runs:/app/runs" --entrypoint python ppo-triton scripts/evaluate.py runs/Hopper-v4/<run>
# torch 2.11 with Triton 3.6, as on the GPU host docs/benchmarks.md measures on (Triton 3.1-3.4
# cannot build the GAE kernel; pyproject.toml says why).
FROM pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
WORKDIR /app
# libegl1/libgl1: MuJoCo's rendering libraries, which gymnasium's MuJoCo envs load. gcc: Triton builds
# a small C launcher the first time a kernel runs on a GPU (the GAE scan, the fused update, torch.compile's
# kernels), and PyTorch's CUDA runtime images long shipped without one (pytorch/pytorch#116696).
RUN apt-get update && apt-get install -y --no-install-recommends libegl1 libgl1 gcc && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY kernels kernels
COPY buffers buffers
COPY ppo ppo
COPY configs configs
COPY scripts scripts
COPY examples examples
COPY train.py hydra_edge.py ./
RUN pip install --no-cache-dir -e .
ENTRYPOINT ["python", "train.py", "device=cuda"]
