"""The device backward with and without the forward's kept operands (recipe fp8, D = 128, H = 16,
B·S = 32k), each for `secs` seconds of back-to-back calls in two rounds (order reversed in the second),
with nvidia-smi sampling the SM clock and board power every 20 ms: what the kept operands save under
sustained load, and whether the shorter backward runs at another clock. A diagnostic of ours against
ours (the cuDNN comparisons are in bench_bwd.py and bench_torch_step.py).

    python3 bench/saved_operands_sustained.py build/libfp4attn_capi.so S causal secs
"""
import subprocess, sys, time, statistics, torch
sys.path.insert(0, "bench")
from bench_bwd import Ours, load_bwd_lib
lib, ll3, ll6 = load_bwd_lib(sys.argv[1])
S, causal, secs = int(sys.argv[2]), bool(int(sys.argv[3])), float(sys.argv[4])
D, H = 128, 16; B = 32768 // S
sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4)) for _ in range(2)]
impl = {"nos": Ours(lib, ll3, ll6, sets, B, H, S, D, causal, "fp8", False),
        "sav": Ours(lib, ll3, ll6, sets, B, H, S, D, causal, "fp8", True)}
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "20"], stdout=subprocess.PIPE, text=True)
spans = []
for rnd in range(2):
    for name in (["nos", "sav"] if rnd == 0 else ["sav", "nos"]):
        o = impl[name]
        torch.cuda.synchronize(); t0 = time.time(); n = 0
        start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
        start.record()
        while time.time() - t0 < secs:
            for _ in range(10):
                o.backward(n); n += 1
            torch.cuda.synchronize()
        end.record(); torch.cuda.synchronize()
        spans.append((name, t0 + 0.3, time.time(), start.elapsed_time(end) / n))
time.sleep(0.1); smi.terminate(); out = smi.communicate()[0]
samples = []
for line in out.strip().splitlines():
    ts, clk, pw = [x.strip() for x in line.split(",")]
    t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
    samples.append((t, float(clk), float(pw)))
for name, a, b, ms in spans:
    sel = [(c, p) for t, c, p in samples if a <= t <= b]
    print(f"S={S} causal={int(causal)} {name}: {ms:.3f} ms per backward, SM clock {statistics.mean(c for c, _ in sel):.0f} MHz, "
          f"power {statistics.mean(p for _, p in sel):.0f} W ({len(sel)} samples)")
