"""Host time of the pure-Python pieces of a bf16 flash_attn_varlen_func call that runs the one
packed device call, on the CPU, with no GPU: 64 sequences (bench_varlen.py's encoder_64_short:
Hq = Hkv = 16, D = 64, noncausal), CPU int32 cu_seqlens made outside inference_mode, calls under
torch.inference_mode as bench/profile_varlen.py --forward makes them.

    PYTHONPATH=<package dir> python dev/host_pieces/bf16_varlen.py [iterations]

Pieces (µs per call, best of 5 rounds of N iterations):
  api   fp4attn.flash_attn_varlen_func with torch_ops.varlen_forward_device stubbed to return
        fixed outputs: the argument checks, the cu_seqlens checks, the lengths.
  plan  torch_ops._packed_plan on the arguments api passed to varlen_forward_device, q and k a
        Tensor subclass that reports device cuda:0 (torch functions disabled on it, so no
        __torch_function__ cost), _is_sm90 answering True, _ext.device_forward_supported run and
        its False (no GPU) taken as True; cu_seqlens the same subclass, so
        _device_cu_seqlens takes its "already on the device" branch.
  api_new  api with a new cu_seqlens tensor (two clones) each call: nothing kept can serve it.
  call  _PackedCall.forward of that plan with _ext.forward_device a no-op and the CUDA stream and
        device lookups stubbed: its allocations are CPU ones here.
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "bench")]
from bench_varlen import CASES  # noqa: E402
from rounds import best  # noqa: E402

import fp4attn
from fp4attn import _ext, _host, torch_ops

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
_, lens, hq, hkv, d, _ = next(c for c in CASES if c[0] == "encoder_64_short")
total = sum(lens)
cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
q = torch.randn(total, hq, d, dtype=torch.bfloat16)
k = torch.randn(total, hkv, d, dtype=torch.bfloat16)
v = torch.randn(total, hkv, d, dtype=torch.bfloat16)
top = max(lens)
fixed = (torch.empty_like(q), torch.empty(hq, total))
seen = {}


def stub(*args, **kw):
    seen.setdefault("args", (args, kw))
    return fixed


torch_ops.varlen_forward_device = stub
with torch.inference_mode():
    api = best(lambda: fp4attn.flash_attn_varlen_func(q, k, v, cu, cu, top, top), N)
    api_new = best(lambda: fp4attn.flash_attn_varlen_func(q, k, v, cu.clone(), cu.clone(), top, top), N)


class AsCuda(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)


(args, kw) = seen["args"]
_q, _k, _v, _cq, _ck, lens_q, lens_k, s = args[:8]
qf, kf, cuf = (x.as_subclass(AsCuda) for x in (q, k, cu))
torch_ops._is_sm90 = lambda index: True
# Without a GPU the library answers False; its checks still run (and cost what they cost).
_supported = _ext.device_forward_supported
_ext.device_forward_supported = lambda shape, opt: _supported(shape, opt) or True
with torch.inference_mode():
    plan = torch_ops._packed_plan(qf, kf, cuf, cuf, lens_q, lens_k, s, False, False)
    assert plan is not None and len(plan) == 1, plan
    plan_t = best(lambda: torch_ops._packed_plan(qf, kf, cuf, cuf, lens_q, lens_k, s, False, False), N)

call = plan[0][4]
_ext_forward = _ext.forward_device
_ext.forward_device = lambda *a, **kw: None
torch_ops._on_device = lambda device: torch_ops._NO_SWITCH
torch_ops._current_stream = lambda device: 0
with torch.inference_mode():
    call_t = best(lambda: call.forward(q, k, v), N)

print(f"torch {torch.__version__}, {N} iterations x 5 rounds, lens_q passed as {type(lens_q).__name__}")
for name, (lo, med) in (("api", api), ("plan", plan_t), ("call", call_t), ("api_new", api_new)):
    print(f"  {name:8s} {lo:7.2f} us/call (median round {med:.2f})")
print(f"  api + plan + call {api[0] + plan_t[0] + call_t[0]:7.2f} us/call (sum of bests)")
