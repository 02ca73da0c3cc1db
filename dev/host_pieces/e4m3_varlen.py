"""Host time of the pure-Python pieces of an E4M3-input flash_attn_varlen_func call that runs the one
packed device call, on the CPU, with no GPU: 64 sequences (bench_varlen.py's encoder_64_short:
Hq = Hkv = 16, D = 64, noncausal), float8_e4m3fn q8, k8, v8 (total, H, D), float32 (B, Hkv)
descales, int32 cu_seqlens made outside inference_mode, calls under torch.inference_mode as
bench/host_varlen.py makes them.

    PYTHONPATH=<package dir> python dev/host_pieces/e4m3_varlen.py [iterations]

Pieces (µs per call, best of 5 rounds of N iterations; the median round beside it):
  api     fp4attn.flash_attn_varlen_func(q8, k8, v8, cu, cu, top, top, causal=False, q_descale=dq, ...)
          on CPU tensors with torch_e4m3._e4m3_varlen_impl stubbed to return fixed outputs: api.py's
          argument checks and settings, torch_e4m3.varlen_forward's checks (e4m3.check_varlen, the
          max_seqlen and cu_seqlens checks), the eager-call test.
  impl    torch_e4m3._e4m3_varlen_impl on the arguments api passed to it, q8, k8, v8, cu and the
          descales a Tensor subclass that reports device cuda:0 (torch functions disabled on it, so
          no __torch_function__ cost; its attribute reads cost ~0.07 µs more than a plain tensor's;
          its .to() drops a device argument, as the data are on the CPU: a Python frame more where a
          tree converts cu_seqlens that are already int32 on the device), _is_sm90
          answering True, _ext.device_e4m3_supported run and its False (no GPU) taken as True,
          torch.cuda.is_current_stream_capturing answering False (it raises without a driver),
          _on_device and _current_stream stubbed, _ext.forward_e4m3_device a no-op, and torch.empty
          on the meta device (its dispatch without an allocation: ~3 µs each, three a call): the
          settings, the kept cu_seqlens checks (e4m3.host_lengths), the device-path test, the
          allocations, cu_seqlens and descales as the device reads them, strides and pointers.
  api_new api with new cu_seqlens tensors (two clones) each call: nothing kept can serve them (the
          clones' own cost included).
  impl_new impl with new cu_seqlens tensors (two clones, as the subclass) each call.
"""
import os
import sys
import types

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "bench")]
from bench_varlen import CASES  # noqa: E402
from rounds import best  # noqa: E402

import fp4attn
from fp4attn import _ext, torch_e4m3, torch_ops

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
_, lens, hq, hkv, d, _ = next(c for c in CASES if c[0] == "encoder_64_short")
B = len(lens)
total = sum(lens)
torch.manual_seed(0)
cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
q8, k8, v8 = (torch.randn(total, h, d).to(torch.float8_e4m3fn) for h in (hq, hkv, hkv))
dq, dk, dv = (torch.rand(B, hkv) + 0.5 for _ in range(3))
top = max(lens)
fixed = (torch.empty(total, hq, d, dtype=torch.bfloat16), torch.empty(hq, total))
seen = {}


def stub(*args):
    seen.setdefault("args", args)
    return fixed


def call(cu_q, cu_k):
    return fp4attn.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, top, top, causal=False, q_descale=dq,
                                          k_descale=dk, v_descale=dv)


impl = torch_e4m3._e4m3_varlen_impl
torch_e4m3._e4m3_varlen_impl = stub
with torch.inference_mode():
    call(cu, cu)
    api = best(lambda: call(cu, cu), N)
    api_new = best(lambda: call(cu.clone(), cu.clone()), N)
torch_e4m3._e4m3_varlen_impl = impl


CUDA0 = torch.device("cuda", 0)


class AsCuda(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):  # one object, as cheap to hand out as a real tensor's device
        return CUDA0

    @property
    def is_cuda(self):
        return True

    def to(self, *args, **kwargs):
        kwargs.pop("device", None)
        return torch.Tensor.to(self, *args, **kwargs)


def as_cuda(x):
    return x.as_subclass(AsCuda)


def empty_on_meta(*args, device=None, **kwargs):
    return torch.empty(*args, device="meta", **kwargs)


# torch as torch_e4m3 sees it: the same attributes (module lookups as fast), torch.empty on the meta
# device: the dispatch without an allocation (the CPU's malloc of O's 41 MB is an mmap a call, where
# the CUDA caching allocator hands back a kept block).
torch_here = types.ModuleType("torch")
torch_here.__dict__.update(torch.__dict__)
torch_here.empty = empty_on_meta
torch_e4m3.torch = torch_here
torch.cuda.is_current_stream_capturing = lambda: False
torch_ops._is_sm90 = lambda index: True
_supported = _ext.device_e4m3_supported
_ext.device_e4m3_supported = lambda shape, opt: _supported(shape, opt) or True
_ext.forward_e4m3_device = lambda *a, **kw: None
torch_ops._on_device = lambda device: torch_ops._NO_SWITCH
torch_ops._current_stream = lambda device: 0

args = list(seen["args"])
assert args[0] is q8 and args[3] is cu and args[7] is dq, "the impl's arguments moved"
args[:5] = [as_cuda(x) for x in args[:5]]
args[7:10] = [as_cuda(x) for x in args[7:10]]
cu_cuda = args[3]
args[4] = cu_cuda
with torch.inference_mode():
    o, lse = impl(*args)
    assert o.shape == (total, hq, d) and o.dtype == torch.bfloat16 and lse.shape == (hq, total)
    impl_t = best(lambda: impl(*args), N)

    def new_cu():
        args[3], args[4] = as_cuda(cu.clone()), as_cuda(cu.clone())
        return impl(*args)

    impl_new = best(new_cu, N)

print(f"torch {torch.__version__}, {N} iterations x 5 rounds, package {fp4attn.__file__}")
for name, (lo, med) in (("api", api), ("impl", impl_t), ("api_new", api_new), ("impl_new", impl_new)):
    print(f"  {name:9s} {lo:7.2f} us/call (median round {med:.2f})")
print(f"  api + impl {api[0] + impl_t[0]:7.2f} us/call (sum of bests)")
