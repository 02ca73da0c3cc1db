// Which keys each query row sees under a mask and a sliding window, in the
// form the sm90 kernels test per tile and per score (recipe.hpp's
// visible_keys is the definition; the emulator and the fp64 reference use it).
#pragma once

#include "cuda/sm90/ptx.cuh"
#include "fp4attn/recipe.hpp"

namespace fp4attn::sm90 {

// floor(a / b) for b > 0 and any a.
FP4ATTN_DEVICE_INLINE int floor_div(int a, int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }

// The tiles a row block must mask, as bounds on the tile index (tile t holds
// keys t·tile … t·tile + tile − 1): tiles t < below cross the block's lower
// bound, tiles t ≥ above cross its upper bound or hold keys past Sk; the
// tiles between are visible to every row in full. Found once per block, so
// that the tile loop tests an index against two numbers.
struct MaskedTiles {
  int below;
  int above;
};

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
  // of(), found where a tile loop masks a tile: opaque to the compiler, so
  // that it is not hoisted out of the loop (its four values would then hold
  // registers through the loop, which spilled in the D = 256, MXFP4-expanding
  // and dQ kernels).
  FP4ATTN_DEVICE_INLINE static KeyBounds in_loop(MaskKind mask, int window_left, int window_right, int Sq, int Sk) {
    return of(mask, window_left, window_right, Sq, opaque(Sk));
  }
  // The last key row `last_row` sees (may be < 0) and the first key row
  // `first_row` sees (may be ≥ Sk): a CTA's tiles lie between them.
  FP4ATTN_DEVICE_INLINE int last_key(int last_row, int Sk) const {
    return bounded_above ? min(Sk - 1, last_row + upper) : Sk - 1;
  }
  FP4ATTN_DEVICE_INLINE int first_key(int first_row) const { return bounded_below ? max(0, first_row + lower) : 0; }
  // Key tiles of `tile` keys against the rows [row0, row0 + rows) of a key
  // range of Sk: tile t crosses the lower bound iff t·tile < row0 + rows − 1
  // + lower, the upper one iff t·tile + tile − 1 > row0 + upper, and holds
  // keys past Sk iff t ≥ Sk / tile.
  FP4ATTN_DEVICE_INLINE MaskedTiles masked_key_tiles(int row0, int rows, int tile, int Sk) const {
    MaskedTiles m{0, Sk / tile};
    if (bounded_below) m.below = floor_div(row0 + rows - 2 + lower, tile) + 1;
    if (bounded_above) m.above = min(m.above, floor_div(row0 + upper - tile + 1, tile) + 1);
    return m;
  }
  // Query tiles of `tile` rows against the keys [key0, key0 + keys) (the
  // dK/dV kernel's loop): query tile t crosses the upper bound iff key0 +
  // keys − 1 > t·tile + upper, the lower one iff key0 < t·tile + tile − 1 +
  // lower, and holds rows past Sq iff t ≥ Sq / tile.
  FP4ATTN_DEVICE_INLINE MaskedTiles masked_query_tiles(int key0, int keys, int tile, int Sq) const {
    MaskedTiles m{0, Sq / tile};
    if (bounded_above) m.below = floor_div(key0 + keys - 2 - upper, tile) + 1;
    if (bounded_below) m.above = min(m.above, floor_div(key0 - lower - tile + 1, tile) + 1);
    return m;
  }
};

}  // namespace fp4attn::sm90
