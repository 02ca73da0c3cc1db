// fp4attn._ext: the nanobind module behind the Python package. It only
// converts: arrays arrive zero-copy through DLPack as C-contiguous host fp32
// (the Python layer has already checked and converted them), options as the
// C++ structs, and results leave as NumPy arrays that own the C++ buffers.
// forward_device is the exception: it takes device pointers (as integers),
// strides and a CUDA stream handle from the PyTorch layer and enqueues the
// sm90 forward there (dispatch::sm90_forward_device); backward_device does the
// same for the backward (dispatch::sm90_backward_device).
// Argument checks live in fp4attn::validate (C++) and fp4attn/_validate.py.
// fp4attn::Error derives from std::invalid_argument, which nanobind raises
// as ValueError with the message, so errors keep naming the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dispatch/head_dim_padding.hpp"
#include "dispatch/sm90_executor.hpp"
#include "fp4attn/attention.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/quantize.hpp"
#include "fp4attn/recipe.hpp"

namespace nb = nanobind;

namespace fp4attn::python {
namespace {

using HostInput = nb::ndarray<const float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
template <class T>
using NumpyArray = nb::ndarray<nb::numpy, T>;

// Hands a result vector to NumPy without copying: the capsule owns it.
template <class T, std::size_t N>
NumpyArray<T> to_numpy(std::vector<T>&& values, const std::array<std::size_t, N>& shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return NumpyArray<T>(owned->data(), N, shape.data(), owner);
}

std::span<const float> span_of(const HostInput& a) { return {a.data(), a.size()}; }
std::int64_t extent(const HostInput& a, std::size_t i) { return static_cast<std::int64_t>(a.shape(i)); }
std::size_t dim(std::int64_t n) { return static_cast<std::size_t>(n); }

nb::tuple forward_host(const HostInput& q, const HostInput& k, const HostInput& v, const AttentionOptions& opt,
                       Executor executor) {
  // (B, S, H, D) tensors: the query shape gives B, Sq, Hq, D; the key shape Sk, Hkv.
  AttentionShape shape;
  shape.B = extent(q, 0);
  shape.Sq = extent(q, 1);
  shape.Hq = extent(q, 2);
  shape.D = extent(q, 3);
  shape.Sk = extent(k, 1);
  shape.Hkv = extent(k, 2);
  ForwardOutput out;
  {
    // The emulator runs for seconds on its own threads; let other Python threads go on.
    nb::gil_scoped_release no_gil;
    out = fp4attn::forward(shape, span_of(q), span_of(k), span_of(v), opt, executor);
  }
  auto o = to_numpy(std::move(out.o), std::array{dim(shape.B), dim(shape.Sq), dim(shape.Hq), dim(shape.D)});
  auto lse = to_numpy(std::move(out.lse), std::array{dim(shape.B), dim(shape.Hq), dim(shape.Sq)});
  return nb::make_tuple(o, lse, out.executor);
}

// (B, Sq, Sk, Hq, Hkv, D), the order in which the Python layer reads the sizes.
using ShapeTuple = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
// Element strides on B, S and H of a (B, S, H, D) view.
using Strides = std::tuple<std::int64_t, std::int64_t, std::int64_t>;

// Packed sequences' (query tokens, key tokens) in all; (0, 0): not packed.
using PackedTokenTuple = std::tuple<std::int64_t, std::int64_t>;

dispatch::PackedTokens packed_of(const PackedTokenTuple& t) { return {std::get<0>(t), std::get<1>(t)}; }

AttentionShape shape_of(const ShapeTuple& t) {
  AttentionShape shape;
  std::tie(shape.B, shape.Sq, shape.Sk, shape.Hq, shape.Hkv, shape.D) = t;
  return shape;
}

template <class Pointer>
Pointer pointer(std::uintptr_t address) {
  return reinterpret_cast<Pointer>(address);  // NOLINT: device addresses arrive as Python ints
}

dispatch::DeviceTensorView device_view(std::uintptr_t data, const Strides& strides) {
  dispatch::DeviceTensorView x;
  x.data = pointer<const void*>(data);
  std::tie(x.stride_b, x.stride_s, x.stride_h) = strides;
  return x;
}

// Validates the call (ValueError naming the argument, as forward would) and
// says whether forward_device can run it: a CUDA build, a Hopper GPU and a
// problem the sm90 executor implements.
bool device_forward_supported(const ShapeTuple& shape_tuple, const AttentionOptions& opt) {
  const AttentionShape shape = shape_of(shape_tuple);
  validate(shape, opt);
  return cuda_built() && sm90_available() && sm90_supports(shape, opt);
}

void forward_device(const ShapeTuple& shape, dispatch::DeviceElement element, std::uintptr_t q,
                    const Strides& q_strides, std::uintptr_t k, const Strides& k_strides, std::uintptr_t v,
                    const Strides& v_strides, std::uintptr_t o, const Strides& o_strides, std::uintptr_t lse,
                    std::uintptr_t workspace, std::size_t workspace_bytes, const AttentionOptions& opt,
                    std::uintptr_t stream, std::uintptr_t saved, std::size_t saved_bytes, std::uintptr_t cu_seqlens_q,
                    std::uintptr_t cu_seqlens_k, std::int64_t lse_pitch, std::int64_t k_tokens) {
  dispatch::DeviceForwardArgs a;
  a.shape = shape_of(shape);
  a.element = element;
  a.q = device_view(q, q_strides);
  a.k = device_view(k, k_strides);
  a.v = device_view(v, v_strides);
  a.o = pointer<void*>(o);
  std::tie(a.o_stride_b, a.o_stride_s, a.o_stride_h) = o_strides;
  a.lse = pointer<float*>(lse);
  a.workspace = pointer<void*>(workspace);
  a.workspace_bytes = workspace_bytes;
  a.saved = pointer<void*>(saved);
  a.saved_bytes = saved_bytes;
  a.cu_seqlens_q = pointer<const int*>(cu_seqlens_q);
  a.cu_seqlens_k = pointer<const int*>(cu_seqlens_k);
  a.lse_pitch = lse_pitch;
  a.k_tokens = k_tokens;
  nb::gil_scoped_release no_gil;  // only enqueues work; other Python threads may go on
  dispatch::sm90_forward_device(a, opt, pointer<void*>(stream));
}

using HostCodes = nb::ndarray<const std::uint8_t, nb::ndim<4>, nb::c_contig, nb::device::cpu>;
using HostDescale = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

std::span<const float> descale_span(const std::optional<HostDescale>& d) {
  return d ? std::span<const float>(d->data(), d->size()) : std::span<const float>{};
}

// Recipe fp8 on caller-quantized E4M3 codes (uint8, (B, S, H, D)) with
// optional (B, Hkv) descales; returns (o, lse, executor) as forward does.
nb::tuple forward_e4m3_host(const HostCodes& q, const HostCodes& k, const HostCodes& v,
                            const std::optional<HostDescale>& q_descale, const std::optional<HostDescale>& k_descale,
                            const std::optional<HostDescale>& v_descale, const AttentionOptions& opt,
                            Executor executor) {
  AttentionShape shape;
  shape.B = static_cast<std::int64_t>(q.shape(0));
  shape.Sq = static_cast<std::int64_t>(q.shape(1));
  shape.Hq = static_cast<std::int64_t>(q.shape(2));
  shape.D = static_cast<std::int64_t>(q.shape(3));
  shape.Sk = static_cast<std::int64_t>(k.shape(1));
  shape.Hkv = static_cast<std::int64_t>(k.shape(2));
  const E4m3Inputs in{{q.data(), q.size()}, {k.data(), k.size()}, {v.data(), v.size()},
                      descale_span(q_descale), descale_span(k_descale), descale_span(v_descale)};
  ForwardOutput out;
  {
    nb::gil_scoped_release no_gil;
    out = fp4attn::forward_e4m3(shape, in, opt, executor);
  }
  auto o = to_numpy(std::move(out.o), std::array{dim(shape.B), dim(shape.Sq), dim(shape.Hq), dim(shape.D)});
  auto lse = to_numpy(std::move(out.lse), std::array{dim(shape.B), dim(shape.Hq), dim(shape.Sq)});
  return nb::make_tuple(o, lse, out.executor);
}

// Validates an E4M3-input call (ValueError naming the argument) and says
// whether forward_e4m3_device can run it here.
bool device_e4m3_supported(const ShapeTuple& shape_tuple, const AttentionOptions& opt) {
  const AttentionShape shape = shape_of(shape_tuple);
  validate_e4m3(shape, opt);
  return cuda_built() && sm90_runs_e4m3(shape, opt);
}

void forward_e4m3_device(const ShapeTuple& shape, std::uintptr_t q, const Strides& q_strides, std::uintptr_t k,
                         const Strides& k_strides, std::uintptr_t v, const Strides& v_strides,
                         std::uintptr_t q_descale, std::uintptr_t k_descale, std::uintptr_t v_descale,
                         std::uintptr_t o, const Strides& o_strides, std::uintptr_t lse, std::uintptr_t workspace,
                         std::size_t workspace_bytes, const AttentionOptions& opt, std::uintptr_t stream,
                         std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_k, std::int64_t lse_pitch,
                         std::int64_t k_tokens) {
  dispatch::DeviceE4m3ForwardArgs a;
  a.shape = shape_of(shape);
  a.q = device_view(q, q_strides);
  a.k = device_view(k, k_strides);
  a.v = device_view(v, v_strides);
  a.q_descale = pointer<const float*>(q_descale);
  a.k_descale = pointer<const float*>(k_descale);
  a.v_descale = pointer<const float*>(v_descale);
  a.o = pointer<void*>(o);
  std::tie(a.o_stride_b, a.o_stride_s, a.o_stride_h) = o_strides;
  a.lse = pointer<float*>(lse);
  a.workspace = pointer<void*>(workspace);
  a.workspace_bytes = workspace_bytes;
  a.cu_seqlens_q = pointer<const int*>(cu_seqlens_q);
  a.cu_seqlens_k = pointer<const int*>(cu_seqlens_k);
  a.lse_pitch = lse_pitch, a.k_tokens = k_tokens;
  nb::gil_scoped_release no_gil;  // only enqueues work
  dispatch::sm90_forward_device_e4m3(a, opt, pointer<void*>(stream));
}

using HostLse = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

// Gradients of the forward on host arrays: q, o, d_o (B, Sq, Hq, D), k, v
// (B, Sk, Hkv, D), lse (B, Hq, Sq); fp4attn::backward checks every size.
nb::tuple backward_host(const HostInput& q, const HostInput& k, const HostInput& v, const HostInput& o,
                        const HostLse& lse, const HostInput& d_o, const AttentionOptions& opt, Executor executor) {
  AttentionShape shape;
  shape.B = extent(q, 0);
  shape.Sq = extent(q, 1);
  shape.Hq = extent(q, 2);
  shape.D = extent(q, 3);
  shape.Sk = extent(k, 1);
  shape.Hkv = extent(k, 2);
  BackwardOutput out;
  {
    nb::gil_scoped_release no_gil;
    out = fp4attn::backward(shape, span_of(q), span_of(k), span_of(v), span_of(o), {lse.data(), lse.size()},
                            span_of(d_o), opt, executor);
  }
  const auto q_shape = std::array{dim(shape.B), dim(shape.Sq), dim(shape.Hq), dim(shape.D)};
  const auto kv_shape = std::array{dim(shape.B), dim(shape.Sk), dim(shape.Hkv), dim(shape.D)};
  auto dq = to_numpy(std::move(out.dq), q_shape);
  auto dk = to_numpy(std::move(out.dk), kv_shape);
  auto dv = to_numpy(std::move(out.dv), kv_shape);
  return nb::make_tuple(dq, dk, dv, out.executor);
}

// Validates the call and says whether backward_device can run it.
bool device_backward_supported(const ShapeTuple& shape_tuple, const AttentionOptions& opt) {
  const AttentionShape shape = shape_of(shape_tuple);
  validate(shape, opt);
  if (!spec_of(opt.recipe).has_backward)
    throw Error("recipe", std::string(to_string(opt.recipe)) + " is inference only: no backward");
  return cuda_built() && sm90_available() && dispatch::sm90_backward_supports(shape, opt);
}

void backward_device(const ShapeTuple& shape, dispatch::DeviceElement element, std::uintptr_t q,
                     const Strides& q_strides, std::uintptr_t k, const Strides& k_strides, std::uintptr_t v,
                     const Strides& v_strides, std::uintptr_t o, const Strides& o_strides, std::uintptr_t d_o,
                     const Strides& d_o_strides, std::uintptr_t lse, std::uintptr_t dq, const Strides& dq_strides,
                     std::uintptr_t dk, const Strides& dk_strides, std::uintptr_t dv, const Strides& dv_strides,
                     std::uintptr_t workspace, std::size_t workspace_bytes, const AttentionOptions& opt,
                     bool deterministic, std::uintptr_t stream, std::uintptr_t saved, std::size_t saved_bytes,
                     std::uintptr_t cu_seqlens_q, std::uintptr_t cu_seqlens_k, std::int64_t lse_pitch,
                     std::int64_t k_tokens) {
  dispatch::DeviceBackwardArgs a;
  a.shape = shape_of(shape);
  a.element = element;
  a.q = device_view(q, q_strides);
  a.k = device_view(k, k_strides);
  a.v = device_view(v, v_strides);
  a.o = device_view(o, o_strides);
  a.d_o = device_view(d_o, d_o_strides);
  a.lse = pointer<const float*>(lse);
  a.dq = pointer<void*>(dq);
  std::tie(a.dq_stride_b, a.dq_stride_s, a.dq_stride_h) = dq_strides;
  a.dk = pointer<void*>(dk);
  std::tie(a.dk_stride_b, a.dk_stride_s, a.dk_stride_h) = dk_strides;
  a.dv = pointer<void*>(dv);
  std::tie(a.dv_stride_b, a.dv_stride_s, a.dv_stride_h) = dv_strides;
  a.workspace = pointer<void*>(workspace);
  a.workspace_bytes = workspace_bytes;
  a.saved = pointer<const void*>(saved);
  a.saved_bytes = saved_bytes;
  a.cu_seqlens_q = pointer<const int*>(cu_seqlens_q);
  a.cu_seqlens_k = pointer<const int*>(cu_seqlens_k);
  a.lse_pitch = lse_pitch;
  a.k_tokens = k_tokens;
  nb::gil_scoped_release no_gil;  // only enqueues work
  dispatch::sm90_backward_device(a, opt, deterministic, pointer<void*>(stream));
}

QuantizedTensor quantize_host(const HostInput& x, TensorFormat format, BlockAxis axis, const QuantizeOptions& opt,
                              const std::string& name) {
  nb::gil_scoped_release no_gil;
  return fp4attn::quantize(span_of(x), extent(x, 0), extent(x, 1), extent(x, 2), extent(x, 3), format, axis, opt, name);
}

// Shape of QuantizedTensor::scales, as documented beside the struct.
std::vector<std::size_t> scale_shape(const QuantizedTensor& t) {
  const std::int64_t s_blocks = (t.S + t.block - 1) / t.block;
  if (t.format == TensorFormat::fp8_e4m3) {
    if (t.axis == BlockAxis::along_d) return {dim(t.B), dim(t.H), dim(s_blocks)};
    return {dim(t.B), dim(t.H), dim(t.D)};
  }
  if (t.axis == BlockAxis::along_d) return {dim(t.B), dim(t.S), dim(t.H), dim(t.D / t.block)};
  return {dim(t.B), dim(s_blocks), dim(t.H), dim(t.D)};
}

// A NumPy view of a buffer inside the QuantizedTensor `self`; the view holds a
// reference to `self`, so the buffer outlives every view of it.
template <class T>
NumpyArray<T> view(nb::handle self, std::vector<T>& data, const std::vector<std::size_t>& shape) {
  return NumpyArray<T>(data.data(), shape.size(), shape.data(), self);
}

void bind_enums(nb::module_& m) {
  nb::enum_<Recipe>(m, "Recipe")
      .value("fp8", Recipe::fp8)
      .value("mxfp4", Recipe::mxfp4)
      .value("nvfp4", Recipe::nvfp4)
      .value("mxfp4_train", Recipe::mxfp4_train);
  nb::enum_<Target>(m, "Target").value("sm90", Target::sm90).value("sm100", Target::sm100);
  nb::enum_<MaskKind>(m, "MaskKind")
      .value("none", MaskKind::none)
      .value("causal", MaskKind::causal)
      .value("causal_top_left", MaskKind::causal_top_left);
  nb::enum_<MxScaleRule>(m, "MxScaleRule")
      .value("round_up", MxScaleRule::round_up)
      .value("ocp_floor", MxScaleRule::ocp_floor);
  nb::enum_<TensorFormat>(m, "TensorFormat")
      .value("fp8_e4m3", TensorFormat::fp8_e4m3)
      .value("mxfp4", TensorFormat::mxfp4)
      .value("nvfp4", TensorFormat::nvfp4);
  nb::enum_<BlockAxis>(m, "BlockAxis").value("along_d", BlockAxis::along_d).value("along_s", BlockAxis::along_s);
  nb::enum_<Executor>(m, "Executor")
      .value("automatic", Executor::automatic)
      .value("emulator", Executor::emulator)
      .value("sm90", Executor::sm90);
  nb::enum_<dispatch::DeviceElement>(m, "DeviceElement")
      .value("float32", dispatch::DeviceElement::f32)
      .value("float16", dispatch::DeviceElement::f16)
      .value("bfloat16", dispatch::DeviceElement::bf16);
}

// The options the Python API sets, and the emulator's model of the backward's
// dQ mode (dq_ds_rows: 64 for the two passes, 128 for the one pass), which
// tests set to compare either mode with its model; the others keep their C++
// defaults.
void bind_options(nb::module_& m) {
  nb::class_<AttentionOptions>(m, "AttentionOptions")
      .def(nb::init<>())
      .def_rw("recipe", &AttentionOptions::recipe)
      .def_rw("mask", &AttentionOptions::mask)
      .def_rw("softmax_scale", &AttentionOptions::softmax_scale)
      .def_rw("smooth_k", &AttentionOptions::smooth_k)
      .def_rw("direct_p", &AttentionOptions::direct_p)
      .def_rw("target", &AttentionOptions::target)
      .def_rw("dq_ds_rows", &AttentionOptions::dq_ds_rows)
      // The sliding window's bounds (recipe.hpp's Window), -1 for none.
      .def_prop_rw(
          "window_left", [](const AttentionOptions& o) { return o.window.left; },
          [](AttentionOptions& o, std::int64_t v) { o.window.left = v; })
      .def_prop_rw(
          "window_right", [](const AttentionOptions& o) { return o.window.right; },
          [](AttentionOptions& o, std::int64_t v) { o.window.right = v; });
  nb::class_<QuantizeOptions>(m, "QuantizeOptions")
      .def(nb::init<>())
      .def_rw("fp8_token_block", &QuantizeOptions::fp8_token_block)
      .def_rw("mx_scale_rule", &QuantizeOptions::mx_scale_rule);
}

void bind_quantized_tensor(nb::module_& m) {
  nb::class_<QuantizedTensor>(m, "QuantizedTensor")
      .def_ro("format", &QuantizedTensor::format)
      .def_ro("axis", &QuantizedTensor::axis)
      .def_ro("block", &QuantizedTensor::block)
      .def_ro("tensor_scale", &QuantizedTensor::tensor_scale)
      .def_prop_ro("shape", [](const QuantizedTensor& t) { return nb::make_tuple(t.B, t.S, t.H, t.D); })
      .def_prop_ro("codes",
                   [](nb::handle self) {
                     QuantizedTensor& t = nb::cast<QuantizedTensor&>(self);
                     return view(self, t.codes, {dim(t.B), dim(t.S), dim(t.H), dim(t.D)});
                   })
      .def_prop_ro("scales",
                   [](nb::handle self) {
                     QuantizedTensor& t = nb::cast<QuantizedTensor&>(self);
                     return view(self, t.scales, scale_shape(t));
                   })
      .def_prop_ro("scale_codes",
                   [](nb::handle self) -> nb::object {
                     QuantizedTensor& t = nb::cast<QuantizedTensor&>(self);
                     if (t.scale_codes.empty()) return nb::none();  // FP8 scales are plain fp32
                     return nb::cast(view(self, t.scale_codes, scale_shape(t)));
                   })
      .def("dequantize", [](const QuantizedTensor& t) {
        return to_numpy(t.dequantize(), std::array{dim(t.B), dim(t.S), dim(t.H), dim(t.D)});
      });
}

}  // namespace
}  // namespace fp4attn::python

NB_MODULE(_ext, m) {
  namespace py = fp4attn::python;
  using fp4attn::Executor;
  m.doc() = "fp4attn C++ core (see the fp4attn package for the Python API)";
  py::bind_enums(m);
  py::bind_options(m);
  py::bind_quantized_tensor(m);
  m.def("forward", &py::forward_host, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("options"),
        nb::arg("executor") = Executor::automatic,
        "Attention on (B, S, H, D) fp32 host arrays; returns (o, lse, executor).");
  m.def("quantize", &py::quantize_host, nb::arg("x"), nb::arg("format"), nb::arg("axis"), nb::arg("options"),
        nb::arg("name"), "Quantize a (B, S, H, D) fp32 host array.");
  m.attr("DEVICE_MAX_BATCH") = fp4attn::dispatch::kSm90MaxBatch;  // batch entries or packed sequences per device call
  m.def("device_forward_supported", &py::device_forward_supported, nb::arg("shape"), nb::arg("options"),
        "Validates a (B, Sq, Sk, Hq, Hkv, D) call; True when forward_device can run it.");
  m.def("device_workspace_bytes",
        [](const py::ShapeTuple& shape, fp4attn::Recipe recipe, const py::PackedTokenTuple& packed) {
          return fp4attn::dispatch::sm90_device_workspace_bytes(py::shape_of(shape), recipe, py::packed_of(packed));
        },
        nb::arg("shape"), nb::arg("recipe") = fp4attn::Recipe::fp8, nb::arg("packed") = py::PackedTokenTuple{0, 0},
        "Device bytes of forward_device's workspace for a (B, Sq, Sk, Hq, Hkv, D) call of `recipe`; packed: "
        "(total_q, total_k) of packed sequences ((0, 0): none).");
  m.def("forward_device", &py::forward_device, nb::arg("shape"), nb::arg("element"), nb::arg("q"),
        nb::arg("q_strides"), nb::arg("k"), nb::arg("k_strides"), nb::arg("v"), nb::arg("v_strides"), nb::arg("o"),
        nb::arg("o_strides"), nb::arg("lse"), nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("options"),
        nb::arg("stream"), nb::arg("saved") = 0, nb::arg("saved_bytes") = 0, nb::arg("cu_seqlens_q") = 0,
        nb::arg("cu_seqlens_k") = 0, nb::arg("lse_pitch") = 0, nb::arg("k_tokens") = 0,
        "Forward (recipes fp8, mxfp4_train, mxfp4) on device pointers (q, k, v of one element type; O bf16; "
        "LSE fp32), "
        "enqueued on the CUDA stream handle `stream` without host synchronisation. `saved` (recipes fp8 and "
        "mxfp4_train, device_saved_bytes bytes; 0: none) receives Q's and K's operands for backward_device. "
        "cu_seqlens_q / cu_seqlens_k (device int32 pointers, B + 1 each; recipe fp8): packed sequences, shape's "
        "Sq and Sk the longest, O packed (total_q, Hq, D), the LSE (Hq, lse_pitch = total_q), k_tokens = total_k.");
  m.def("forward_e4m3", &py::forward_e4m3_host, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("q_descale").none(), nb::arg("k_descale").none(), nb::arg("v_descale").none(), nb::arg("options"),
        nb::arg("executor") = Executor::automatic,
        "Recipe fp8 on (B, S, H, D) uint8 E4M3 codes with optional (B, Hkv) fp32 descales; returns "
        "(o, lse, executor).");
  m.def("device_e4m3_supported", &py::device_e4m3_supported, nb::arg("shape"), nb::arg("options"),
        "Validates an E4M3-input (B, Sq, Sk, Hq, Hkv, D) call; True when forward_e4m3_device can run it.");
  m.def("device_e4m3_workspace_bytes",
        [](const py::ShapeTuple& shape, const py::PackedTokenTuple& packed) {
          return fp4attn::dispatch::sm90_device_e4m3_workspace_bytes(py::shape_of(shape), py::packed_of(packed));
        },
        nb::arg("shape"), nb::arg("packed") = py::PackedTokenTuple{0, 0},
        "Device bytes of forward_e4m3_device's workspace; packed = (total_q, total_k) for packed sequences.");
  m.def("forward_e4m3_device", &py::forward_e4m3_device, nb::arg("shape"), nb::arg("q"), nb::arg("q_strides"),
        nb::arg("k"), nb::arg("k_strides"), nb::arg("v"), nb::arg("v_strides"), nb::arg("q_descale"),
        nb::arg("k_descale"), nb::arg("v_descale"), nb::arg("o"), nb::arg("o_strides"), nb::arg("lse"),
        nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("options"), nb::arg("stream"),
        nb::arg("cu_seqlens_q") = 0, nb::arg("cu_seqlens_k") = 0, nb::arg("lse_pitch") = 0, nb::arg("k_tokens") = 0,
        "Recipe fp8 on E4M3 codes on the device (element strides = bytes; descales (B, Hkv) fp32 device pointers "
        "or 0 for 1), O bf16 and LSE fp32, enqueued on `stream` without host synchronisation. cu_seqlens_q / "
        "cu_seqlens_k (device int32 pointers, B + 1 each): packed sequences, shape's Sq and Sk the longest, q "
        "(total_q, Hq, D) and k, v (total_k, Hkv, D) with strides (0, S, H), O packed, the LSE (Hq, lse_pitch = "
        "total_q), k_tokens = total_k, descales (B, Hkv) per sequence.");
  m.def("device_saved_bytes",
        [](const py::ShapeTuple& shape, fp4attn::Recipe recipe, const py::PackedTokenTuple& packed) {
          return fp4attn::dispatch::sm90_device_saved_bytes(py::shape_of(shape), recipe, py::packed_of(packed));
        },
        nb::arg("shape"), nb::arg("recipe") = fp4attn::Recipe::fp8, nb::arg("packed") = py::PackedTokenTuple{0, 0},
        "Device bytes of the block where forward_device keeps Q's and K's operands for backward_device "
        "(0: the recipe keeps none).");
  m.def("device_saved_k_mean_offset",
        [](const py::ShapeTuple& shape, fp4attn::Recipe recipe, const py::PackedTokenTuple& packed) {
          return fp4attn::dispatch::sm90_device_saved_k_mean_offset(py::shape_of(shape), recipe,
                                                                    py::packed_of(packed));
        },
        nb::arg("shape"), nb::arg("recipe") = fp4attn::Recipe::fp8, nb::arg("packed") = py::PackedTokenTuple{0, 0},
        "Byte offset of the smooth_k mean (fp32, (B, Hkv, D)) inside that block.");
  m.def("backward", &py::backward_host, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"),
        nb::arg("d_o"), nb::arg("options"), nb::arg("executor") = Executor::automatic,
        "FP8 backward on fp32 host arrays: (dq, dk, dv, executor).");
  m.def("device_backward_supported", &py::device_backward_supported, nb::arg("shape"), nb::arg("options"),
        "Validates a (B, Sq, Sk, Hq, Hkv, D) backward call; True when backward_device can run it.");
  m.def("device_backward_workspace_bytes",
        [](const py::ShapeTuple& shape, bool deterministic, fp4attn::Recipe recipe, bool kept,
           const py::PackedTokenTuple& packed) {
          return fp4attn::dispatch::sm90_device_backward_workspace_bytes(py::shape_of(shape), deterministic, recipe,
                                                                         kept, py::packed_of(packed));
        },
        nb::arg("shape"), nb::arg("deterministic") = true, nb::arg("recipe") = fp4attn::Recipe::fp8,
        nb::arg("kept") = false, nb::arg("packed") = py::PackedTokenTuple{0, 0},
        "Device bytes of backward_device's workspace for a (B, Sq, Sk, Hq, Hkv, D) call of `recipe` in that mode; "
        "kept: for a call given the forward's kept block (smaller: its operands are read there).");
  m.def(
      "device_backward_one_pass_faster",
      [](const py::ShapeTuple& shape, fp4attn::MaskKind mask, std::int64_t window_left, std::int64_t window_right) {
        return fp4attn::dispatch::sm90_backward_one_pass_faster(py::shape_of(shape), mask,
                                                                fp4attn::Window{window_left, window_right});
      },
      nb::arg("shape"), nb::arg("mask"), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
      "Whether backward_device with deterministic=False (dQ summed in one pass, order varying run to run) is "
      "faster than the deterministic two passes for a (B, Sq, Sk, Hq, Hkv, D) call with this mask and window.");
  m.def(
      "device_backward_one_pass_faster_packed",
      [](const std::vector<std::int64_t>& lens_q, const std::vector<std::int64_t>& lens_k, std::int64_t D,
         fp4attn::MaskKind mask, std::int64_t window_left, std::int64_t window_right) {
        return fp4attn::dispatch::sm90_packed_backward_one_pass_faster(lens_q, lens_k, D, mask,
                                                                       fp4attn::Window{window_left, window_right});
      },
      nb::arg("lens_q"), nb::arg("lens_k"), nb::arg("D"), nb::arg("mask"), nb::arg("window_left") = -1,
      nb::arg("window_right") = -1,
      "device_backward_one_pass_faster for packed sequences of these query and key lengths.");
  m.def("backward_device", &py::backward_device, nb::arg("shape"), nb::arg("element"), nb::arg("q"),
        nb::arg("q_strides"), nb::arg("k"), nb::arg("k_strides"), nb::arg("v"), nb::arg("v_strides"), nb::arg("o"),
        nb::arg("o_strides"), nb::arg("d_o"), nb::arg("d_o_strides"), nb::arg("lse"), nb::arg("dq"),
        nb::arg("dq_strides"), nb::arg("dk"), nb::arg("dk_strides"), nb::arg("dv"), nb::arg("dv_strides"),
        nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("options"), nb::arg("deterministic"),
        nb::arg("stream"), nb::arg("saved") = 0, nb::arg("saved_bytes") = 0, nb::arg("cu_seqlens_q") = 0,
        nb::arg("cu_seqlens_k") = 0, nb::arg("lse_pitch") = 0, nb::arg("k_tokens") = 0,
        "Enqueues the sm90 backward (recipes fp8, mxfp4_train) on device pointers (ints) and a CUDA stream "
        "handle; dq, dk, dv in the element type of the inputs. `saved`: what forward_device kept (0: none; "
        "q and k are then not read). cu_seqlens_q / cu_seqlens_k, lse_pitch, k_tokens (recipe fp8): packed "
        "sequences as forward_device takes them, the gradients packed like q, k, v.");
  m.def("sm90_head_dim_for", &fp4attn::dispatch::sm90_head_dim_for, nb::arg("d"),
        "The sm90 kernels' head dim that runs head dim d (d itself, the next wider one, which the call pads to "
        "with zero channels), or 0 when d is wider than all of them.");
  m.def("recipe_has_backward", [](fp4attn::Recipe r) { return fp4attn::spec_of(r).has_backward; });
  m.def("cuda_built", &fp4attn::cuda_built);
  m.def("sm90_available", &fp4attn::sm90_available);
  m.def("device_description", &fp4attn::device_description);
}
