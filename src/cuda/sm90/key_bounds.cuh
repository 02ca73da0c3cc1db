// Which keys each query row sees under a mask and a sliding window, in the
// form the sm90 kernels test per tile and per score (recipe.hpp's
// visible_keys is the definition; the emulator and the fp64 reference use it).
#pragma once

#include "cuda/sm90/ptx.cuh"
#include "fp4attn/recipe.hpp"

namespace fp4attn::sm90 {

// Which keys a row sees, as offsets from the row (recipe.hpp's visible_keys):
// key j is visible to row i iff i + lower <= j <= min(Sk - 1, i + upper).
// Without a bound the offsets are far enough out never to bind.
struct KeyBounds {
  int lower = -(1 << 30);
  int upper = 1 << 30;
  bool bounded_below = false, bounded_above = false;

  // The mask and window of a (Sq, Sk) problem; window bounds < 0 are none.
  FP4ATTN_DEVICE_INLINE static KeyBounds of(MaskKind mask, int window_left, int window_right, int Sq, int Sk) {
    KeyBounds b;
    const int diagonal = mask == MaskKind::causal_top_left ? 0 : Sk - Sq;
    b.bounded_above = mask != MaskKind::none || window_right >= 0;
    if (b.bounded_above) b.upper = diagonal + (mask != MaskKind::none ? 0 : window_right);
    b.bounded_below = window_left >= 0;
    if (b.bounded_below) b.lower = diagonal - window_left;
    return b;
  }
  // The last key row `last_row` sees (may be < 0) and the first key row
  // `first_row` sees (may be ≥ Sk): a CTA's tiles lie between them.
  FP4ATTN_DEVICE_INLINE int last_key(int last_row, int Sk) const {
    return bounded_above ? min(Sk - 1, last_row + upper) : Sk - 1;
  }
  FP4ATTN_DEVICE_INLINE int first_key(int first_row) const { return bounded_below ? max(0, first_row + lower) : 0; }
  // Does the key tile [key0, key0 + keys) hold a key that some row of
  // [row0, row0 + rows) does not see (Sk aside)?
  FP4ATTN_DEVICE_INLINE bool cuts(int key0, int keys, int row0, int rows) const {
    return (bounded_above && key0 + keys - 1 > row0 + upper) || (bounded_below && key0 < row0 + rows - 1 + lower);
  }
};

}  // namespace fp4attn::sm90
