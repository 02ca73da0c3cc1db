// .npy reader. The format: magic "\x93NUMPY", a version byte pair, a
// little-endian header length (2 bytes in v1, 4 in v2/v3), then a Python dict
// literal {'descr': ..., 'fortran_order': ..., 'shape': (...)}, then raw data.
// The dict is parsed by a strict little scanner that accepts what numpy writes
// and rejects everything else, so no input can push it past the header.
#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <string_view>

#include "io/elements.hpp"

namespace fp4attn::io {
namespace {

constexpr std::array<std::uint8_t, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kVersionOffset = 6;
constexpr std::size_t kHeaderLenOffset = 8;
constexpr int kV1HeaderLenBytes = 2;
constexpr int kV2HeaderLenBytes = 4;
constexpr int kMaxMajorVersion = 3;
// numpy itself allows at most 64 dimensions.
constexpr std::size_t kMaxDims = 64;

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

class HeaderScanner {
 public:
  HeaderScanner(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        h.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the dict");
    if (!have_descr || !have_order || !have_shape) fail("missing 'descr', 'fortran_order' or 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(source_, "corrupt .npy header: " + what + " at byte " + std::to_string(pos_));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a string");
    const std::size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, {std::string_view("False"), false}})
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    fail("expected True or False");
  }
  std::int64_t integer() {
    skip_space();
    if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a dimension");
    std::int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
        fail("dimension does not fit 64 bits");
      ++pos_;
    }
    return v;
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> dims;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (dims.size() == kMaxDims) fail("more than " + std::to_string(kMaxDims) + " dimensions");
      dims.push_back(integer());
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') fail("expected ',' or ')' in the shape");
    }
    ++pos_;
    return dims;
  }

  std::string_view text_;
  const std::string& source_;
  std::size_t pos_ = 0;
};

std::optional<DType> dtype_of_descr(const std::string& descr) {
  if (descr == "<f4") return DType::f32;
  if (descr == "<f2") return DType::f16;
  // ml_dtypes' bfloat16 is not a numpy builtin: np.save records it as a
  // 2-byte opaque type, so '<V2' (or '|V2') is read as bfloat16.
  if (descr == "<V2" || descr == "|V2") return DType::bf16;
  return std::nullopt;
}

}  // namespace

HostTensor parse_npy(std::span<const std::uint8_t> bytes, const std::string& source) {
  if (bytes.size() < kHeaderLenOffset + kV1HeaderLenBytes)
    throw Error(source, "truncated: " + std::to_string(bytes.size()) + " bytes is shorter than a .npy preamble");
  if (!std::equal(kMagic.begin(), kMagic.end(), bytes.begin())) throw Error(source, "not a .npy file (bad magic)");
  const int major = bytes[kVersionOffset];
  if (major < 1 || major > kMaxMajorVersion)
    throw Error(source, "unsupported .npy version " + std::to_string(major) + " (expected 1, 2 or 3)");
  const int len_bytes = major == 1 ? kV1HeaderLenBytes : kV2HeaderLenBytes;
  const std::size_t prefix = kHeaderLenOffset + len_bytes;
  if (bytes.size() < prefix) throw Error(source, "truncated: the header length field is cut off");
  const std::uint64_t header_len = detail::load_le(bytes.data() + kHeaderLenOffset, len_bytes);
  if (header_len > bytes.size() - prefix)
    throw Error(source, "truncated: the header claims " + std::to_string(header_len) + " bytes but only " +
                            std::to_string(bytes.size() - prefix) + " follow");
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);
  const NpyHeader h = HeaderScanner(text, source).parse();

  const std::optional<DType> dtype = dtype_of_descr(h.descr);
  if (!dtype)
    throw Error(source, "unsupported dtype '" + h.descr +
                            "' (expected little-endian float32 '<f4', float16 '<f2' or bfloat16 '<V2')");
  if (h.fortran_order)
    throw Error(source, "Fortran-order arrays are not supported: save a C-contiguous array (np.ascontiguousarray)");

  const std::uint64_t count = detail::element_count(h.shape, source);
  const std::size_t data_offset = prefix + header_len;
  const std::uint64_t have = bytes.size() - data_offset;
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(count, detail::item_size(*dtype), &need))
    throw Error(source, "shape is absurd: its byte size overflows 64 bits");
  if (need > have)
    throw Error(source, "truncated: shape " + detail::shape_string(h.shape) + " of " +
                            std::string(to_string(*dtype)) + " needs " + std::to_string(need) + " bytes of data, " +
                            std::to_string(have) + " present");
  if (need < have)
    throw Error(source, "data size mismatch: shape " + detail::shape_string(h.shape) + " needs " +
                            std::to_string(need) + " bytes, the file holds " + std::to_string(have));
  return HostTensor{h.shape, detail::decode_elements(bytes.subspan(data_offset), *dtype, count), *dtype, ""};
}

}  // namespace fp4attn::io
