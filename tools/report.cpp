// Measurement and reporting shared by the `run` and `accuracy` subcommands.
#include "report.hpp"

#include <chrono>
#include <ctime>
#include <fstream>

#include "build_info.hpp"
#include "fp4attn/error.hpp"
#include "fp4attn/reference.hpp"

namespace fp4attn::cli {
namespace {

constexpr double kFlopsPerMac = 2.0;
constexpr double kMatmulsPerPair = 2.0;  // S = Q·Kᵀ and O = P·V
constexpr double kMsPerSecond = 1e3;
constexpr double kFlopsPerTeraflop = 1e12;

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

}  // namespace

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[sizeof "YYYY-MM-DD"];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

double forward_flops(const AttentionShape& shape, MaskKind mask, Window window) {
  double pairs = 0.0;
  for (std::int64_t i = 0; i < shape.Sq; ++i)
    pairs += static_cast<double>(visible_keys(mask, window, shape.Sq, shape.Sk, i).size());
  return kMatmulsPerPair * kFlopsPerMac * static_cast<double>(shape.B * shape.Hq * shape.D) * pairs;
}

std::vector<Row> measure(const Problem& p, const Settings& settings) {
  AttentionOptions opt;
  opt.mask = p.mask;
  opt.window = p.window;
  opt.target = settings.target;
  opt.threads = settings.threads;

  std::fprintf(stderr, "[ref] fp64 reference ...\n");
  const reference::ForwardResult ref =
      reference::forward(p.shape, widen(p.q), widen(p.k), widen(p.v), p.mask, opt.softmax_scale, p.window);

  const double flops = forward_flops(p.shape, p.mask, p.window);
  const std::size_t total = settings.recipes.size() * 2;
  std::vector<Row> rows;
  for (Recipe recipe : settings.recipes) {
    for (bool direct_p : {true, false}) {
      opt.recipe = recipe;
      opt.direct_p = direct_p;
      std::fprintf(stderr, "[%zu/%zu] %s direct_p=%s ...\n", rows.size() + 1, total, to_string(recipe).data(),
                   direct_p ? "on" : "off");
      const bool gpu = sm90_runs(p.shape, opt);
      // The first call on a GPU pays for context creation and module loading.
      if (gpu) forward(p.shape, p.q, p.k, p.v, opt);
      const auto start = std::chrono::steady_clock::now();
      const ForwardOutput out = forward(p.shape, p.q, p.k, p.v, opt);
      const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
      Row row{recipe, direct_p, out.executor, compare(out.o, ref.o), elapsed.count(), std::nullopt};
      if (out.executor == Executor::sm90) row.tflops = flops / (row.ms / kMsPerSecond) / kFlopsPerTeraflop;
      rows.push_back(row);
    }
  }
  return rows;
}

void print_table(const std::vector<Row>& rows, std::FILE* out) {
  bool any_tflops = false;
  for (const Row& r : rows) any_tflops |= r.tflops.has_value();
  std::fprintf(out, "%-12s %-8s %-9s %9s %10s %10s %10s %10s%s\n", "recipe", "direct_p", "executor", "cosine",
               "rel_l2", "rel_l1", "max_abs", "ms", any_tflops ? "    TFLOP/s" : "");
  for (const Row& r : rows) {
    std::fprintf(out, "%-12s %-8s %-9s %9.6f %10.3e %10.3e %10.3e %10.1f", to_string(r.recipe).data(),
                 r.direct_p ? "on" : "off", to_string(r.executor).data(), r.error.cosine, r.error.rel_l2,
                 r.error.rel_l1, r.error.max_abs, r.ms);
    if (r.tflops) std::fprintf(out, " %10.1f", *r.tflops);
    if (r.error.nonfinite_mismatch > 0)
      std::fprintf(out, "  (%lld non-finite mismatches)", static_cast<long long>(r.error.nonfinite_mismatch));
    std::fprintf(out, "\n");
  }
}

nlohmann::json to_json(const Problem& p, const std::vector<Row>& rows, const std::string& command) {
  nlohmann::json doc;
  doc["date"] = today_utc();
  doc["commit"] = git_commit();
  doc["version"] = kVersion;
  doc["device"] = device_description();
  doc["command"] = command;
  doc["timing"] = "one host call per row: quantization, host-device transfers and attention";
  doc["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json row = {{"op", "fwd_e2e"},
                          {"impl", "fp4attn"},
                          {"executor", to_string(r.executor)},
                          {"recipe", to_string(r.recipe)},
                          {"direct_p", r.direct_p},
                          {"causal", p.mask != MaskKind::none},
                          {"window", {p.window.left, p.window.right}},
                          {"B", p.shape.B},
                          {"H", p.shape.Hq},
                          {"Hkv", p.shape.Hkv},
                          {"Sq", p.shape.Sq},
                          {"Sk", p.shape.Sk},
                          {"D", p.shape.D},
                          {"ms", r.ms},
                          {"tflops", nullptr},
                          {"gbps", nullptr},
                          {"cosine", r.error.cosine},
                          {"rel_l2", r.error.rel_l2},
                          {"rel_l1", r.error.rel_l1},
                          {"max_abs", r.error.max_abs},
                          {"nonfinite_mismatch", r.error.nonfinite_mismatch}};
    if (r.tflops) row["tflops"] = *r.tflops;
    doc["rows"].push_back(row);
  }
  return doc;
}

void write_json(const nlohmann::json& doc, const std::string& path, const std::string& argument) {
  std::ofstream out(path);
  if (!out) throw Error(argument, "cannot write '" + path + "'");
  constexpr int kIndent = 2;
  out << doc.dump(kIndent) << "\n";
  if (!out) throw Error(argument, "writing '" + path + "' failed");
}

}  // namespace fp4attn::cli
