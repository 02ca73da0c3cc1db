// Carves one workspace block into consecutive aligned regions: the operand
// sets of the sm90 forward (MX and NVFP4 recipes) place every buffer of a
// call this way, and size the block with the same code by a null base.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace fp4attn::sm90::fwd {

class WorkspaceRegions {
 public:
  static constexpr std::size_t kAlign = 256;  // every region starts on a 256-byte boundary

  explicit WorkspaceRegions(unsigned char* base) : base_(base) {}

  // The next region of `count` elements (at least one byte); null when only counting.
  template <class T>
  T* take(std::int64_t count) {
    const std::size_t offset = at_;
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(count) * sizeof(T), 1);
    at_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset);
  }
  std::size_t bytes() const { return at_; }

 private:
  unsigned char* base_;
  std::size_t at_ = 0;
};

}  // namespace fp4attn::sm90::fwd
