// .safetensors reader. The format: an 8-byte little-endian header length N,
// N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]},
// "__metadata__": {...}}, then the data buffer the offsets index into.
#include <optional>

#include <nlohmann/json.hpp>

#include "io/elements.hpp"

namespace fp4attn::io {
namespace {

constexpr std::size_t kHeaderLenBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";
// Names listed in an error message before it is cut short.
constexpr std::size_t kMaxListedNames = 8;

std::optional<DType> dtype_of(const std::string& name) {
  if (name == "F32") return DType::f32;
  if (name == "F16") return DType::f16;
  if (name == "BF16") return DType::bf16;
  return std::nullopt;
}

std::string list_names(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < kMaxListedNames; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kMaxListedNames) s += ", ...";
  return s;
}

// Non-negative JSON integer, or nothing (floats, negatives, other types).
std::optional<std::uint64_t> unsigned_of(const nlohmann::json& j) {
  if (!j.is_number_unsigned()) return std::nullopt;
  return j.get<std::uint64_t>();
}

const nlohmann::json& pick_entry(const nlohmann::json& header, const std::string& key, const std::string& source,
                                 std::string& name) {
  std::vector<std::string> names;
  for (const auto& [k, value] : header.items())
    if (k != kMetadataKey) names.push_back(k);
  if (!key.empty()) {
    const auto it = header.find(key);
    if (key == kMetadataKey || it == header.end())
      throw Error(source, "no tensor named '" + key + "' (it holds: " + list_names(names) + ")");
    name = key;
    return *it;
  }
  if (names.empty()) throw Error(source, "holds no tensors");
  if (names.size() > 1)
    throw Error(source, "holds " + std::to_string(names.size()) + " tensors (" + list_names(names) +
                            "): pick one by key");
  name = names.front();
  return header.at(name);
}

}  // namespace

HostTensor parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& key, const std::string& source) {
  if (bytes.size() < kHeaderLenBytes)
    throw Error(source, "truncated: " + std::to_string(bytes.size()) + " bytes is shorter than the header length");
  const std::uint64_t header_len = detail::load_le(bytes.data(), kHeaderLenBytes);
  if (header_len > bytes.size() - kHeaderLenBytes)
    throw Error(source, "truncated: the header length " + std::to_string(header_len) + " goes beyond the file (" +
                            std::to_string(bytes.size()) + " bytes)");
  const auto header_begin = bytes.begin() + kHeaderLenBytes;
  const nlohmann::json header =
      nlohmann::json::parse(header_begin, header_begin + static_cast<std::ptrdiff_t>(header_len), nullptr, false);
  if (header.is_discarded()) throw Error(source, "corrupt header: not valid JSON");
  if (!header.is_object()) throw Error(source, "corrupt header: not a JSON object");

  std::string name;
  const nlohmann::json& entry = pick_entry(header, key, source, name);
  const std::string where = source + ", tensor '" + name + "'";
  if (!entry.is_object()) throw Error(where, "corrupt header: entry is not an object");

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) throw Error(where, "corrupt header: no dtype string");
  const std::optional<DType> dtype = dtype_of(dtype_it->get<std::string>());
  if (!dtype)
    throw Error(where, "unsupported dtype '" + dtype_it->get<std::string>() + "' (expected F32, F16 or BF16)");

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) throw Error(where, "corrupt header: no shape array");
  std::vector<std::int64_t> shape;
  for (const nlohmann::json& d : *shape_it) {
    const std::optional<std::uint64_t> v = unsigned_of(d);
    if (!v || *v > static_cast<std::uint64_t>(INT64_MAX))
      throw Error(where, "corrupt header: shape holds something other than a non-negative integer");
    shape.push_back(static_cast<std::int64_t>(*v));
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
    throw Error(where, "corrupt header: data_offsets must be [begin, end]");
  const std::optional<std::uint64_t> begin = unsigned_of((*offsets_it)[0]);
  const std::optional<std::uint64_t> end = unsigned_of((*offsets_it)[1]);
  const std::uint64_t buffer = bytes.size() - kHeaderLenBytes - header_len;
  if (!begin || !end || *begin > *end || *end > buffer)
    throw Error(where, "data_offsets out of range: the data buffer holds " + std::to_string(buffer) + " bytes");

  const std::uint64_t count = detail::element_count(shape, where);
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(count, detail::item_size(*dtype), &need))
    throw Error(where, "shape is absurd: its byte size overflows 64 bits");
  if (need != *end - *begin)
    throw Error(where, "data size mismatch: shape " + detail::shape_string(shape) + " of " +
                           std::string(to_string(*dtype)) + " needs " + std::to_string(need) + " bytes, data_offsets span " +
                           std::to_string(*end - *begin));
  const auto data = bytes.subspan(kHeaderLenBytes + header_len + *begin, need);
  return HostTensor{std::move(shape), detail::decode_elements(data, *dtype, count), *dtype, name};
}

}  // namespace fp4attn::io
