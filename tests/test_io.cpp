// Tensor-file readers: round trips of files written here for every dtype and
// format version, then every malformed-file case, in memory and from the
// regression corpus in tests/data/bad.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "fp4attn/error.hpp"
#include "fp4attn/io.hpp"
#include "tensor_files.hpp"

namespace fp4attn::io {
namespace {

using test_files::Bytes;

// Non-trivial values that survive each dtype exactly: signs, fractions, a
// subnormal of the narrow formats, large magnitudes.
const std::vector<float> kValues = {1.0f, -2.5f, 0.375f, 1024.0f, -0.0f, 3.0517578125e-05f, -65504.0f, 7.0f};
// The same values as float16 and bfloat16 bit patterns.
const std::vector<std::uint16_t> kF16Codes = {0x3C00, 0xC100, 0x3600, 0x6400, 0x8000, 0x0200, 0xFBFF, 0x4700};
const std::vector<std::uint16_t> kBf16Codes = {0x3F80, 0xC020, 0x3EC0, 0x4480, 0x8000, 0x3800, 0xC780, 0x40E0};
const std::vector<float> kBf16Values = {1.0f, -2.5f, 0.375f, 1024.0f, -0.0f, 3.0517578125e-05f, -65536.0f, 7.0f};

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "element " << i;
    EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << "element " << i;
  }
}

// The error message of parse(), or "" when it did not throw fp4attn::Error.
template <typename Parse>
std::string error_of(const Parse& parse) {
  try {
    parse();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- .npy ------------------------------------------------------------------

TEST(Npy, Float32RoundTripEveryVersion) {
  for (int major : {1, 2, 3}) {
    const Bytes file = test_files::npy_bytes("<f4", {2, 4}, test_files::f32_payload(kValues), major);
    const HostTensor t = parse_npy(file);
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 4})) << "version " << major;
    EXPECT_EQ(t.dtype, DType::f32);
    expect_same_floats(t.data, kValues);
  }
}

TEST(Npy, Float16RoundTrip) {
  const HostTensor t = parse_npy(test_files::npy_bytes("<f2", {8}, test_files::u16_payload(kF16Codes)));
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{8}));
  EXPECT_EQ(t.dtype, DType::f16);
  expect_same_floats(t.data, kValues);
}

TEST(Npy, BFloat16AsMlDtypesSavesIt) {
  const HostTensor t = parse_npy(test_files::npy_bytes("<V2", {2, 2, 2}, test_files::u16_payload(kBf16Codes)));
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 2, 2}));
  EXPECT_EQ(t.dtype, DType::bf16);
  expect_same_floats(t.data, kBf16Values);
}

TEST(Npy, ScalarAndEmptyShapes) {
  const HostTensor scalar = parse_npy(test_files::npy_bytes("<f4", {}, test_files::f32_payload({kValues[1]})));
  EXPECT_TRUE(scalar.shape.empty());
  expect_same_floats(scalar.data, {kValues[1]});
  const HostTensor empty = parse_npy(test_files::npy_bytes("<f4", {3, 0}, {}));
  EXPECT_EQ(empty.shape, (std::vector<std::int64_t>{3, 0}));
  EXPECT_TRUE(empty.data.empty());
}

// Every float16 code against an independent formula in double.
TEST(Npy, EveryFloat16CodeDecodes) {
  constexpr int kCodes = 1 << 16;
  std::vector<std::uint16_t> codes(kCodes);
  for (int c = 0; c < kCodes; ++c) codes[c] = static_cast<std::uint16_t>(c);
  const HostTensor t = parse_npy(test_files::npy_bytes("<f2", {kCodes}, test_files::u16_payload(codes)));
  for (int c = 0; c < kCodes; ++c) {
    const int sign = c >> 15, e = (c >> 10) & 0x1F, m = c & 0x3FF;
    const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    const float got = t.data[c];
    if (e == 0x1F) {
      EXPECT_EQ(std::isnan(got), m != 0) << "code " << c;
      if (m == 0) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == (sign == 1)) << "code " << c;
      }
    } else {
      EXPECT_EQ(static_cast<double>(got), sign ? -mag : mag) << "code " << c;
    }
  }
}

TEST(Npy, MalformedInMemory) {
  const Bytes good = test_files::npy_bytes("<f4", {2, 4}, test_files::f32_payload(kValues));
  // Every strict prefix of a valid file is truncated or corrupt, never a crash.
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::string msg = error_of([&] { parse_npy(std::span(good).first(n), "file 'p.npy'"); });
    EXPECT_NE(msg.find("file 'p.npy'"), std::string::npos) << "prefix " << n << ": " << msg;
  }
  EXPECT_NE(error_of([&] { parse_npy(test_files::npy_bytes("<f4", {2, 4}, {}, 1, true)); }).find("Fortran"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_npy(test_files::npy_bytes("<i4", {8}, test_files::f32_payload(kValues))); })
                .find("unsupported dtype '<i4'"),
            std::string::npos);
}

// ---- .safetensors ----------------------------------------------------------

TEST(Safetensors, EveryDtypeRoundTrips) {
  const Bytes file = test_files::safetensors_bytes({{"a", "F32", {2, 4}, test_files::f32_payload(kValues)},
                                                    {"b", "F16", {8}, test_files::u16_payload(kF16Codes)},
                                                    {"c", "BF16", {4, 2}, test_files::u16_payload(kBf16Codes)}});
  const HostTensor a = parse_safetensors(file, "a");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 4}));
  EXPECT_EQ(a.dtype, DType::f32);
  EXPECT_EQ(a.name, "a");
  expect_same_floats(a.data, kValues);
  const HostTensor b = parse_safetensors(file, "b");
  EXPECT_EQ(b.dtype, DType::f16);
  expect_same_floats(b.data, kValues);
  const HostTensor c = parse_safetensors(file, "c");
  EXPECT_EQ(c.shape, (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(c.dtype, DType::bf16);
  expect_same_floats(c.data, kBf16Values);
}

TEST(Safetensors, KeyChoice) {
  const Bytes one = test_files::safetensors_bytes({{"only", "F32", {8}, test_files::f32_payload(kValues)}});
  EXPECT_EQ(parse_safetensors(one).name, "only");  // metadata does not count as a tensor
  const Bytes two = test_files::safetensors_bytes({{"q", "F32", {8}, test_files::f32_payload(kValues)},
                                                   {"k", "F32", {8}, test_files::f32_payload(kValues)}});
  EXPECT_NE(error_of([&] { parse_safetensors(two); }).find("holds 2 tensors (k, q)"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_safetensors(two, "v"); }).find("no tensor named 'v'"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_safetensors(two, "__metadata__"); }).find("no tensor named"), std::string::npos);
}

TEST(Safetensors, MalformedInMemory) {
  const Bytes good = test_files::safetensors_bytes({{"t", "F32", {2, 4}, test_files::f32_payload(kValues)}});
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::string msg = error_of([&] { parse_safetensors(std::span(good).first(n), "", "file 's'"); });
    EXPECT_NE(msg.find("file 's'"), std::string::npos) << "prefix " << n << ": " << msg;
  }
}

// ---- files -----------------------------------------------------------------

TEST(Files, ReadTensorByExtension) {
  const std::string npy =
      test_files::write_file("io_ok.npy", test_files::npy_bytes("<f4", {8}, test_files::f32_payload(kValues)));
  expect_same_floats(read_tensor(npy).data, kValues);
  const std::string st = test_files::write_file(
      "io_ok.safetensors", test_files::safetensors_bytes({{"x", "F16", {8}, test_files::u16_payload(kF16Codes)}}));
  expect_same_floats(read_tensor(st, "x").data, kValues);

  EXPECT_NE(error_of([&] { read_tensor(npy, "x"); }).find("key: 'x' given"), std::string::npos);
  const std::string missing = test_files::temp_path("io_missing.npy");
  EXPECT_EQ(error_of([&] { read_tensor(missing); }), "file '" + missing + "': does not exist");
  const std::string dir = std::filesystem::temp_directory_path().string() + "/";
  EXPECT_NE(error_of([&] { read_file(dir); }).find("is not a regular file"), std::string::npos);
  const std::string other = test_files::write_file("io_ok.bin", {1, 2, 3});
  EXPECT_NE(error_of([&] { read_tensor(other); }).find("unknown file type"), std::string::npos);
  for (const std::string& p : {npy, st, other}) std::filesystem::remove(p);
}

// Each corpus file with the problem its message must state. Files added
// later without an entry here must still fail cleanly.
const std::map<std::string, std::string> kExpectedProblems = {
    {"empty.npy", "truncated"},
    {"bad_magic.npy", "bad magic"},
    {"bad_version.npy", "unsupported .npy version 9"},
    {"header_len_beyond_file.npy", "truncated: the header claims 4000 bytes"},
    {"truncated_data.npy", "truncated: shape (2, 2) of float32 needs 16 bytes of data, 10 present"},
    {"trailing_data.npy", "data size mismatch"},
    {"big_endian.npy", "unsupported dtype '>f4'"},
    {"float64.npy", "unsupported dtype '<f8'"},
    {"fortran_order.npy", "Fortran-order"},
    {"unterminated_dict.npy", "corrupt .npy header"},
    {"unterminated_string.npy", "unterminated string"},
    {"missing_shape.npy", "missing"},
    {"unknown_key.npy", "unexpected key 'x'"},
    {"negative_dim.npy", "expected a dimension"},
    {"dim_beyond_int64.npy", "does not fit 64 bits"},
    {"count_overflow.npy", "overflows 64 bits"},
    {"bytes_overflow.npy", "overflows 64 bits"},
    {"absurd_shape.npy", "truncated: shape (1000000000, 1000000000)"},
    {"short.safetensors", "truncated"},
    {"header_len_beyond_file.safetensors", "goes beyond the file"},
    {"bad_json.safetensors", "not valid JSON"},
    {"not_object.safetensors", "not a JSON object"},
    {"no_tensors.safetensors", "holds no tensors"},
    {"entry_not_object.safetensors", "entry is not an object"},
    {"unknown_dtype.safetensors", "unsupported dtype 'F64'"},
    {"missing_dtype.safetensors", "no dtype"},
    {"negative_shape.safetensors", "non-negative integer"},
    {"float_shape.safetensors", "non-negative integer"},
    {"offsets_beyond_data.safetensors", "data_offsets out of range"},
    {"offsets_reversed.safetensors", "data_offsets out of range"},
    {"offsets_one_value.safetensors", "data_offsets must be [begin, end]"},
    {"size_mismatch.safetensors", "data size mismatch"},
    {"count_overflow.safetensors", "overflows 64 bits"},
};

TEST(Files, RegressionCorpusFailsCleanly) {
  const std::filesystem::path dir = std::filesystem::path(FP4ATTN_TEST_DATA_DIR) / "bad";
  std::size_t checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string ext = entry.path().extension().string();
    if (ext != ".npy" && ext != ".safetensors") continue;
    const std::string msg = error_of([&] { read_tensor(entry.path().string()); });
    EXPECT_NE(msg.find("file '" + entry.path().string() + "'"), std::string::npos) << name << ": " << msg;
    const auto expected = kExpectedProblems.find(name);
    if (expected != kExpectedProblems.end()) {
      EXPECT_NE(msg.find(expected->second), std::string::npos) << name << ": " << msg;
    }
    ++checked;
  }
  EXPECT_GE(checked, kExpectedProblems.size());
}

}  // namespace
}  // namespace fp4attn::io
