// File access for the readers: whole-file reads with errors that name the
// path, and the choice of reader by extension.
#include <filesystem>
#include <fstream>

#include "io/elements.hpp"

namespace fp4attn::io {
namespace {

std::string file_label(const std::string& path) { return "file '" + path + "'"; }

bool has_extension(const std::string& path, std::string_view ext) {
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

}  // namespace

std::vector<std::uint8_t> read_file(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string label = file_label(path);
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw Error(label, "does not exist");
  if (!fs::is_regular_file(status)) throw Error(label, "is not a regular file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw Error(label, "size unknown: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(label, "cannot be opened for reading");
  std::vector<std::uint8_t> bytes(size);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (static_cast<std::uintmax_t>(in.gcount()) != size) throw Error(label, "read failed: the file changed while being read");
  return bytes;
}

HostTensor read_tensor(const std::string& path, const std::string& key) {
  const std::string label = file_label(path);
  if (has_extension(path, ".npy")) {
    if (!key.empty()) throw Error("key", "'" + key + "' given, but " + label + " is a .npy file, which holds one array");
    return parse_npy(read_file(path), label);
  }
  if (has_extension(path, ".safetensors")) return parse_safetensors(read_file(path), key, label);
  throw Error(label, "unknown file type: expected a .npy or .safetensors extension");
}

}  // namespace fp4attn::io
