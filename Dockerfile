# A CUDA PyTorch image that trains by default: docker run --gpus all ppo-triton env=Hopper-v4
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
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
