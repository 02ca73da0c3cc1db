// Reader for the oracle vectors written by scripts/gen_oracle_vectors.py (the
// container format is described there). Test-only: failures throw, and the
// calling test reports them.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp4attn::test_support {

class OracleVectors {
 public:
  explicit OracleVectors(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path + " (run scripts/gen_oracle_vectors.py)");
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
    if (take(sizeof(kMagic) - 1) != std::string(kMagic)) throw std::runtime_error(path + ": bad magic");
    const std::uint32_t records = take_u32();
    for (std::uint32_t r = 0; r < records; ++r) {
      const std::string name = take(static_cast<unsigned char>(take(1)[0]));
      const char dtype = take(1)[0];
      const std::uint32_t count = take_u32();
      const std::size_t width = dtype == 'B' ? 1 : 4;
      entries_[name] = {dtype, take(count * width)};
    }
  }

  std::vector<float> floats(const std::string& name) const { return as<float>(name, 'f'); }
  std::vector<std::uint8_t> bytes(const std::string& name) const { return as<std::uint8_t>(name, 'B'); }
  std::vector<std::uint32_t> u32s(const std::string& name) const { return as<std::uint32_t>(name, 'I'); }

 private:
  static constexpr char kMagic[] = "FP4AVEC1";
  struct Entry {
    char dtype;
    std::string data;
  };

  // The files are little endian, as is every machine fp4attn targets.
  template <class T>
  std::vector<T> as(const std::string& name, char dtype) const {
    const auto it = entries_.find(name);
    if (it == entries_.end() || it->second.dtype != dtype) throw std::runtime_error("no record " + name);
    std::vector<T> out(it->second.data.size() / sizeof(T));
    std::memcpy(out.data(), it->second.data.data(), out.size() * sizeof(T));
    return out;
  }

  std::string take(std::size_t n) {
    if (pos_ + n > bytes_.size()) throw std::runtime_error("oracle file truncated");
    std::string s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint32_t take_u32() {
    std::uint32_t v = 0;
    std::memcpy(&v, take(sizeof(v)).data(), sizeof(v));
    return v;
  }

  std::string bytes_;
  std::size_t pos_ = 0;
  std::map<std::string, Entry> entries_;
};

}  // namespace fp4attn::test_support
