"""What the benchmark drivers share: the ctypes binding of libfp4attn_capi.so,
the CUDA-event timer (warm-up, then the median of the timed runs) and a
per-kernel breakdown of one call."""
import ctypes
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile


def load_lib(path):
    """Loads the C ABI and declares every entry point's signature; returns (lib, ll3)
    where ll3 is the ctypes type of a (B, S, H) stride triple."""
    lib = ctypes.CDLL(path)
    lib.fp4attn_last_error.restype = ctypes.c_char_p
    lib.fp4attn_plan_create.restype = ctypes.c_void_p
    lib.fp4attn_plan_create.argtypes = [ctypes.c_int] * 9 + [ctypes.c_float]
    lib.fp4attn_plan_destroy.argtypes = [ctypes.c_void_p]
    lib.fp4attn_plan_set_direct_p.argtypes = [ctypes.c_void_p, ctypes.c_int]
    ll3 = ctypes.c_longlong * 3
    lib.fp4attn_quantize.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ll3, ll3, ll3, ctypes.c_void_p]
    lib.fp4attn_check_finite.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.fp4attn_attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ll3, ctypes.c_void_p, ctypes.c_void_p]
    return lib, ll3


def check(lib, rc):
    if rc != 0:
        raise RuntimeError(lib.fp4attn_last_error().decode())


def time_ms(fn, reps, warmup, queued=False):
    """Median milliseconds of fn(i) over reps runs, each between two CUDA events.
    Each run waits for the previous one, unless `queued`: then the runs are queued
    back to back and the GPU never idles for the host, whatever a call's host overhead."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    events = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        if not queued:
            end.synchronize()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def host_gap_us(fn, reps):
    """Mean GPU idle per call, in µs, when each call waits for the previous one
    (time_ms's pattern): wall time per call minus the call's event time."""
    torch.cuda.synchronize()
    total_event = 0.0
    t0 = time.perf_counter()
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        total_event += start.elapsed_time(end)
    wall_ms = (time.perf_counter() - t0) * 1e3
    return (wall_ms - total_event) / reps * 1e3


def peak_mib(impls) -> dict:
    """Device memory each implementation's call takes at its peak beyond what was allocated
    before it (MiB; its outputs, workspaces and, under autograd, what it saves)."""
    peaks = {}
    for n, fn in impls.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn(0)
        torch.cuda.synchronize()
        peaks[n] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
    return peaks


def kernel_launches(fn, calls=5):
    """(launches per call, mean µs per call) of every kernel that fn launches (CUPTI via
    torch.profiler), longest first."""
    fn(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            launches, us = totals.get(e.name, (0, 0.0))
            totals[e.name] = (launches + 1, us + e.device_time / calls)
    return {n: (launches / calls, us) for n, (launches, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def kernel_breakdown(fn, calls=5):
    """Mean µs per call of every kernel that fn launches (CUPTI via torch.profiler), longest first."""
    return {n: round(us, 1) for n, (_, us) in kernel_launches(fn, calls).items()}


def with_consumers(fn, n):
    """fn with the FP8 forward's consumer warpgroups a CTA forced to n (FP4ATTN_FWD_CONSUMERS, read by the
    launcher at every call, which applies it where a kernel of n consumers exists): A/B rows of the
    kernels in one process."""
    def run(i):
        before = os.environ.get("FP4ATTN_FWD_CONSUMERS")
        os.environ["FP4ATTN_FWD_CONSUMERS"] = str(n)
        try:
            return fn(i)
        finally:
            if before is None:
                del os.environ["FP4ATTN_FWD_CONSUMERS"]
            else:
                os.environ["FP4ATTN_FWD_CONSUMERS"] = before
    return run
