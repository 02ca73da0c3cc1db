// Writers of .npy and .safetensors bytes for the reader and CLI tests. They
// follow the published formats independently of src/io, so a reader bug
// cannot hide behind a matching writer bug.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace fp4attn::test_files {

using Bytes = std::vector<std::uint8_t>;

inline void append_le(Bytes& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

inline Bytes f32_payload(const std::vector<float>& values) {
  Bytes out;
  for (float v : values) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    append_le(out, bits, 4);
  }
  return out;
}

inline Bytes u16_payload(const std::vector<std::uint16_t>& codes) {
  Bytes out;
  for (std::uint16_t c : codes) append_le(out, c, 2);
  return out;
}

inline std::string shape_tuple(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::int64_t d : shape) s += std::to_string(d) + ", ";
  if (shape.size() > 1) s.resize(s.size() - 2);
  else if (shape.size() == 1) s.resize(s.size() - 1);  // "(4,)" as numpy writes it
  return s + ")";
}

// A .npy file as numpy writes it: dict padded with spaces to a 64-byte boundary.
inline Bytes npy_bytes(const std::string& descr, const std::vector<std::int64_t>& shape, const Bytes& payload,
                       int major = 1, bool fortran = false) {
  constexpr std::size_t kAlign = 64;
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                     ", 'shape': " + shape_tuple(shape) + ", }";
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % kAlign != 0) dict += ' ';
  dict += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(major), 0};
  append_le(out, dict.size(), major == 1 ? 2 : 4);
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  Bytes payload;
};

inline Bytes safetensors_bytes(const std::vector<SafetensorsEntry>& entries) {
  std::string header = "{\"__metadata__\": {\"format\": \"pt\"}";
  Bytes data;
  for (const SafetensorsEntry& e : entries) {
    std::string shape = "[";
    for (std::size_t i = 0; i < e.shape.size(); ++i) {
      if (i > 0) shape += ",";
      shape += std::to_string(e.shape[i]);
    }
    shape += "]";
    header += ", \"" + e.name + "\": {\"dtype\": \"" + e.dtype + "\", \"shape\": " + shape +
              ", \"data_offsets\": [" + std::to_string(data.size()) + ", " +
              std::to_string(data.size() + e.payload.size()) + "]}";
    data.insert(data.end(), e.payload.begin(), e.payload.end());
  }
  header += "}";
  Bytes out;
  append_le(out, header.size(), 8);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A fresh path in the temp directory, unique per process.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("fp4attn_" + std::to_string(::getpid()) + "_" + name)).string();
}

inline std::string write_file(const std::string& name, const Bytes& bytes) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  return path;
}

}  // namespace fp4attn::test_files
