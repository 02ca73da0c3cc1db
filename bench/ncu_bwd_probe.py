"""One deterministic device backward (recipe fp8, Direct-P, bf16, D = 128, H = 16,
B·S = 32k, the forward's operands kept) between cudaProfilerStart/Stop, for
ncu --profile-from-start off:

    ncu --clock-control none --profile-from-start off --metrics ... \
        python3 bench/ncu_bwd_probe.py build/libfp4attn_capi.so S causal
"""
import sys, torch
sys.path.insert(0, "bench")
from bench_bwd import Ours, load_bwd_lib
lib, ll3, ll6 = load_bwd_lib(sys.argv[1])
S = int(sys.argv[2]); causal = bool(int(sys.argv[3])); D = 128; H = 16; B = 32768 // S
sets = [tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))]
o = Ours(lib, ll3, ll6, sets, B, H, S, D, causal)
o.backward(0); torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
o.backward(0); torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
