"""Timing on CUDA, shared by `scripts/benchmark_gae.py` and the profiling scripts beside this file.

Two clocks: the time a loop of calls takes, launches included (`median_time_us`, `paired_time_us`:
what a training loop pays), and the GPU's time per call with the launches hidden (`queued_time_us`:
calls queued behind a GPU sleep, so they run back to back). `copy_time_us` is the floor every
bandwidth fraction is measured against. Compare numbers only inside one run: a shared host's launch
cost drifts by 1.5x within minutes.
"""

from __future__ import annotations

import statistics
import time

import torch
import triton


@triton.jit
def _empty_kernel(x_ptr):  # the launch-cost yardstick
    pass


_empty_argument: list[torch.Tensor] = []


def empty_launch() -> None:
    """Launch an empty one-argument Triton kernel: the cheapest launch there is."""
    if not _empty_argument:
        _empty_argument.append(torch.empty(1, device="cuda"))
    _empty_kernel[(1,)](_empty_argument[0])


def warm_up_gpu() -> None:
    """Raise the GPU's clocks from idle before timing anything (200 copies of 256 MB)."""
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    big_out = torch.empty_like(big)
    for _ in range(200):
        big_out.copy_(big)
    torch.cuda.synchronize()


def median_time_us(fn, calls: int, repeats: int = 15) -> float:
    """Median over `repeats` of (CUDA-event time of `calls` back-to-back fn() calls) / calls."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def paired_time_us(fn, yardstick, calls: int, repeats: int = 15) -> tuple[float, float, float]:
    """`(median us per fn(), median us per yardstick(), median of their ratios)`, each timed as in
    `median_time_us` in alternating blocks, so each ratio compares calls a few ms apart."""
    fn()
    yardstick()
    torch.cuda.synchronize()
    times: dict[int, list[float]] = {0: [], 1: []}
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for _ in range(repeats):
        for which, f in enumerate((fn, yardstick)):
            events[0].record()
            for _ in range(calls):
                f()
            events[1].record()
            events[1].synchronize()
            times[which].append(events[0].elapsed_time(events[1]) * 1e3 / calls)
    ratios = [a / b for a, b in zip(times[0], times[1], strict=True)]
    return statistics.median(times[0]), statistics.median(times[1]), statistics.median(ratios)


def queued_time_us(fn, calls: int, repeats: int = 15) -> float:
    """GPU time per fn() call: `calls` eager calls enqueued while the GPU sleeps, then timed.

    The host gets ahead of the GPU, so the calls run back to back and the events measure GPU time,
    launch costs hidden. Retries with a longer sleep if the sleep ended before the host had queued
    every call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    host_us = (time.perf_counter() - host_start) * 1e6  # enqueue time of the calls, at worst
    cycles = int(2.0 * host_us * 2000) + 100_000  # ~2 GHz: twice the host time, in cycles
    asleep = torch.cuda.Event(enable_timing=True)
    samples = []
    while len(samples) < repeats:
        asleep.record()
        torch.cuda._sleep(cycles)
        enqueue_start = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        enqueued_us = (time.perf_counter() - enqueue_start) * 1e6
        end.synchronize()
        slept_us = asleep.elapsed_time(start) * 1e3
        if enqueued_us > 0.9 * slept_us:  # the GPU caught up with the host: sleep longer
            if cycles > 1e11:
                raise RuntimeError(f"queued_time_us: the host never got ahead of the GPU ({enqueued_us:.0f} us)")
            cycles *= 2
            continue
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def copy_time_us(nbytes: int, calls: int) -> float:
    """GPU time of a device-to-device copy moving `nbytes` (read plus write)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return queued_time_us(lambda: dst.copy_(src), calls)


def host_us(fn, calls: int = 2000) -> float:
    """Host time per fn() call: `calls` calls back to back, then one sync (the GPU may lag behind)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6
