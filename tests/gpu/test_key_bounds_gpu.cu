// The kernels' tile tests for masks and sliding windows (cuda/sm90/key_bounds.cuh)
// against recipe.hpp's visible_keys, the definition the emulator and the fp64
// reference use, score by score: every tile a kernel leaves unmasked must be
// visible in full to every row of its block, every tile it skips must be
// invisible to all of them, and the tile range must hold every visible key.
// The forward and backward suites compare whole outputs, but only on the
// shapes and windows they name; this walks thousands of random ones.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/key_bounds.cuh"
#include "fp4attn/recipe.hpp"
#include "gpu/gpu_test_util.hpp"

namespace fp4attn {
namespace {

using gpu_test::DeviceArray;
using sm90::KeyBounds;
using sm90::MaskedTiles;

struct Problem {
  int mask, left, right, Sq, Sk;
  int row0, key0;  // a block of 64 rows (the key tiles' test) and one of 64 keys (the query tiles')
};

struct Answer {
  int first_key, last_key;          // the keys rows row0 .. row0 + 63 see together
  MaskedTiles key_tiles;            // 128-key tiles against those rows
  MaskedTiles query_tiles;          // 128-row query tiles against keys key0 .. key0 + 63
};

constexpr int kRows = 64, kTile = 128;

__global__ void evaluate(const Problem* problems, Answer* answers, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const Problem p = problems[i];
  const KeyBounds b = KeyBounds::of(static_cast<MaskKind>(p.mask), p.left, p.right, p.Sq, p.Sk);
  Answer a;
  a.first_key = b.first_key(p.row0);
  a.last_key = b.last_key(min(p.row0 + kRows, p.Sq) - 1, p.Sk);
  a.key_tiles = b.masked_key_tiles(p.row0, kRows, kTile, p.Sk);
  a.query_tiles = b.masked_query_tiles(p.key0, kRows, kTile, p.Sq);
  answers[i] = a;
}

Problem draw(std::mt19937& rng) {
  std::uniform_int_distribution<int> mask(0, 2), len(1, 1500), coin(0, 3), small(0, 40), big(0, 3000);
  Problem p{};
  p.mask = mask(rng);
  p.Sq = len(rng), p.Sk = len(rng);
  const auto bound = [&] { return coin(rng) == 0 ? -1 : coin(rng) < 2 ? small(rng) : big(rng); };
  p.left = bound();
  p.right = p.mask != 0 ? (coin(rng) < 2 ? -1 : 0) : bound();
  p.row0 = std::uniform_int_distribution<int>(0, (p.Sq - 1) / kRows)(rng) * kRows;
  p.key0 = std::uniform_int_distribution<int>(0, (p.Sk - 1) / kRows)(rng) * kRows;
  return p;
}

TEST(GpuKeyBounds, TileTestsAgreeWithVisibleKeys) {
  FP4ATTN_REQUIRE_HOPPER();
  constexpr int kCount = 20000;
  std::mt19937 rng(20261202);
  std::vector<Problem> problems(kCount);
  for (Problem& p : problems) p = draw(rng);
  DeviceArray<Problem> d_problems(kCount);
  DeviceArray<Answer> d_answers(kCount);
  d_problems.upload(problems);
  evaluate<<<(kCount + 127) / 128, 128>>>(d_problems.ptr, d_answers.ptr, kCount);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<Answer> answers = d_answers.download();

  int masked_blocks = 0, windowed = 0;
  for (int i = 0; i < kCount; ++i) {
    const Problem& p = problems[i];
    const Answer& a = answers[i];
    const MaskKind mask = static_cast<MaskKind>(p.mask);
    const Window window{p.left, p.right};
    windowed += window.bounded();
    const auto sees = [&](int row, int key) {
      const KeyRange r = visible_keys(mask, window, p.Sq, p.Sk, row);
      return key >= r.first && key < r.end;
    };
    const std::string where = "problem " + std::to_string(i) + ": mask " + std::to_string(p.mask) + " window " +
                              std::to_string(p.left) + "," + std::to_string(p.right) + " Sq " +
                              std::to_string(p.Sq) + " Sk " + std::to_string(p.Sk) + " row0 " +
                              std::to_string(p.row0) + " key0 " + std::to_string(p.key0);
    // Rows row0 .. row0 + 63 (those below Sq): the keys they see lie in
    // [first_key, last_key]; key tiles outside [below, above) are masked,
    // tiles inside are seen in full by every row of the block (Sk aside).
    const int row_end = std::min(p.row0 + kRows, p.Sq);
    for (int key = 0; key < p.Sk; ++key)
      for (int row = p.row0; row < row_end; ++row)
        if (sees(row, key)) ASSERT_TRUE(key >= a.first_key && key <= a.last_key) << where << " key " << key;
    const int key_tiles = (p.Sk + kTile - 1) / kTile;
    for (int t = 0; t < key_tiles; ++t) {
      if (t < a.key_tiles.below || t >= a.key_tiles.above) {
        ++masked_blocks;
        continue;
      }
      for (int key = t * kTile; key < (t + 1) * kTile; ++key)
        for (int row = p.row0; row < p.row0 + kRows; ++row)  // rows past Sq too: the kernels compute them
          ASSERT_TRUE(key < p.Sk && (row >= p.Sq || sees(row, key)))
              << where << " key tile " << t << " left unmasked, key " << key << " row " << row;
    }
    // Keys key0 .. key0 + 63 against 128-row query tiles (the dK/dV kernel's
    // loop): tiles inside [below, above) are seen in full by those keys.
    const int query_tiles = (p.Sq + kTile - 1) / kTile;
    for (int t = std::max(0, a.query_tiles.below); t < std::min(query_tiles, a.query_tiles.above); ++t)
      for (int row = t * kTile; row < (t + 1) * kTile; ++row)
        for (int key = p.key0; key < p.key0 + kRows; ++key)
          ASSERT_TRUE(row < p.Sq && (key >= p.Sk || sees(row, key)))
              << where << " query tile " << t << " left unmasked, key " << key << " row " << row;
  }
  // The draws reach both kinds of tile and windows often.
  EXPECT_GT(masked_blocks, kCount);
  EXPECT_GT(windowed, kCount / 2);
}

}  // namespace
}  // namespace fp4attn
