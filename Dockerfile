# A CUDA PyTorch image that trains by default: docker run --gpus all ppo-triton env=Hopper-v4
# torch 2.11 with Triton 3.6, as on the H200 host that docs/benchmarks.md measured on (the 2.5.1 image
# this file named before had Triton 3.1, which cannot build the GAE kernel; pyproject.toml says why).
FROM pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends libegl1 libgl1 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY kernels kernels
COPY buffers buffers
COPY ppo ppo
COPY configs configs
COPY train.py .
RUN pip install --no-cache-dir -e .
ENTRYPOINT ["python", "train.py", "device=cuda"]
