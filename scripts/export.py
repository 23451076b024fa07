"""Export a run's deterministic policy as one self-contained file, for use without this project.

    python scripts/export.py runs/Ant-v4/seed1_2026-11-29_10-00-00 --format onnx         # <run dir>/policy.onnx
    python scripts/export.py <run dir> --format torchscript --output ant.pt

The file maps raw observations (a leading batch dimension; a Dict task's parts as separate inputs) to
the actions `scripts/evaluate.py` takes: observations normalised with the run's frozen statistics,
the actor's mean, clipped to the task's bounds. Load it with onnxruntime
(`InferenceSession(path).run(None, {"observation": obs})`) or `torch.jit.load(path)(obs)`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

import ppo.policy
from ppo.config import ConfigError
from ppo.policy.export import FORMATS, describe, export
from ppo.run.checkpoint import CheckpointError, resolve_checkpoint, run_dir_of
from ppo.run.records import check_tool_output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run dir or a checkpoint file")
    parser.add_argument("--format", choices=list(FORMATS), required=True)
    parser.add_argument("--output", help="the file to write (default: policy.onnx or policy.pt in the run dir)")
    args = parser.parse_args()
    try:
        checkpoint = resolve_checkpoint(args.checkpoint)
        policy = ppo.policy.load_policy(args.checkpoint, "cpu")
    except FileNotFoundError as error:
        sys.exit(f"error: {args.checkpoint}: {error}")
    except (ConfigError, CheckpointError) as error:
        sys.exit(f"error: {error}")
    output = Path(args.output) if args.output else run_dir_of(checkpoint) / f"policy{FORMATS[args.format]}"
    try:
        check_tool_output(output, checkpoint)
    except ConfigError as error:
        sys.exit(f"error: {error}")
    if args.format == "onnx":
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
        except ImportError:
            sys.exit('error: --format onnx needs the onnx extra: pip install -e ".[export]"')
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its notes on optional torchvision ops
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            path = export(policy, args.format, output)
        except OSError as error:
            sys.exit(f"error: cannot write {output}: {error.strerror or error}")
    print(describe(policy, path))


if __name__ == "__main__":
    main()
