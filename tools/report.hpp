// What `fp4attn run` and `fp4attn accuracy` share: one problem pushed through
// a list of recipes with Direct-P on and off, measured against the fp64
// reference, printed as a table and optionally saved as JSON.
#pragma once

#include <cstdio>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp4attn/attention.hpp"
#include "fp4attn/metrics.hpp"

namespace fp4attn::cli {

struct Problem {
  AttentionShape shape;
  std::vector<float> q, k, v;  // (B, S, H, D)
  MaskKind mask = MaskKind::none;
  Window window;  // none by default
};

struct Settings {
  std::vector<Recipe> recipes{std::begin(kAllRecipes), std::end(kAllRecipes)};
  Target target = Target::sm90;
  int threads = 0;
};

struct Row {
  Recipe recipe = Recipe::fp8;
  bool direct_p = true;
  Executor executor = Executor::emulator;
  ErrorMetrics error;            // O against the fp64 reference on the unquantized inputs
  double ms = 0.0;               // one host call: quantization, transfers and attention
  std::optional<double> tflops;  // sm90 rows only: emulator speed says nothing about the method
};

// Forward FLOPs 4·B·H·Sq·Sk·D, counting only the (query, key) pairs the mask keeps.
double forward_flops(const AttentionShape& shape, MaskKind mask, Window window = {});

// Runs every recipe with Direct-P on, then off; progress goes to stderr.
std::vector<Row> measure(const Problem& problem, const Settings& settings);

void print_table(const std::vector<Row>& rows, std::FILE* out);

// The figures in the bench/results schema (DESIGN §8) plus the error metrics.
nlohmann::json to_json(const Problem& problem, const std::vector<Row>& rows, const std::string& command);
// The date of a result file (DESIGN §8), YYYY-MM-DD in UTC.
std::string today_utc();
// Writes `doc` to `path`; failures name `argument`.
void write_json(const nlohmann::json& doc, const std::string& path, const std::string& argument);

}  // namespace fp4attn::cli
