// The `fp4attn` executable end to end: info, run --quick (table and JSON),
// accuracy on files written here, and bad arguments and files, each of which
// must exit nonzero with one line naming the argument.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fp4attn/attention.hpp"
#include "tensor_files.hpp"

namespace fp4attn {
namespace {

struct Result {
  int status = -1;
  std::string out;
};

// Runs the CLI with `args`; stderr joins stdout unless `stdout_only`.
Result run_cli(const std::string& args, bool stdout_only = false) {
  const std::string cmd = std::string(FP4ATTN_CLI_PATH) + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) r.out += buf.data();
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A failed command prints exactly one line, "error: <argument>: ...".
void expect_named_error(const std::string& args, const std::string& argument, const std::string& problem = "") {
  const Result r = run_cli(args);
  EXPECT_NE(r.status, 0) << args;
  const std::vector<std::string> lines = lines_of(r.out);
  std::vector<std::string> errors;
  for (const std::string& l : lines)
    if (l.starts_with("error: ")) errors.push_back(l);
  ASSERT_EQ(errors.size(), 1u) << args << "\n" << r.out;
  EXPECT_NE(errors[0].find(argument), std::string::npos) << args << "\n" << errors[0];
  EXPECT_NE(errors[0].find(problem), std::string::npos) << args << "\n" << errors[0];
}

struct TableRow {
  std::string recipe, direct_p, executor;
  double cosine = 0, rel_l2 = 0, rel_l1 = 0, max_abs = 0;
};

// Rows of the accuracy table in the CLI's stdout.
std::vector<TableRow> table_rows(const std::string& out) {
  std::vector<TableRow> rows;
  for (const std::string& line : lines_of(out)) {
    std::istringstream in(line);
    TableRow r;
    if (!(in >> r.recipe) || !parse_recipe(r.recipe)) continue;
    in >> r.direct_p >> r.executor >> r.cosine >> r.rel_l2 >> r.rel_l1 >> r.max_abs;
    rows.push_back(r);
  }
  return rows;
}

// Every recipe once with Direct-P on and once off, and plausible figures:
// close to the reference but not equal to it (the inputs are not all zero,
// so quantization must leave a trace).
void expect_full_table(const std::vector<TableRow>& rows) {
  std::set<std::pair<std::string, std::string>> seen;
  for (const TableRow& r : rows) {
    seen.insert({r.recipe, r.direct_p});
    EXPECT_GT(r.cosine, 0.5) << r.recipe;
    EXPECT_LE(r.cosine, 1.0) << r.recipe;
    EXPECT_GT(r.rel_l2, 0.0) << r.recipe;
    EXPECT_LT(r.rel_l2, 1.0) << r.recipe;
    EXPECT_GT(r.max_abs, 0.0) << r.recipe;
  }
  EXPECT_EQ(rows.size(), 8u);
  for (Recipe recipe : kAllRecipes)
    for (const char* state : {"on", "off"})
      EXPECT_TRUE(seen.count({std::string(to_string(recipe)), state})) << to_string(recipe) << " " << state;
}

TEST(Cli, Info) {
  const Result r = run_cli("info");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(r.out.starts_with("fp4attn ")) << r.out;
  for (Recipe recipe : kAllRecipes) EXPECT_NE(r.out.find(to_string(recipe)), std::string::npos);
  EXPECT_NE(r.out.find("head dims"), std::string::npos);
  EXPECT_NE(r.out.find(device_description()), std::string::npos);
}

TEST(Cli, RunQuickPrintsEveryRecipeBothWays) {
  const Result r = run_cli("run --quick", true);
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], device_description());
  if (!sm90_available()) {
    EXPECT_NE(lines[0].find("running the CPU emulator"), std::string::npos);
  }
  expect_full_table(table_rows(r.out));
  // Progress goes to stderr.
  const Result with_progress = run_cli("run --quick");
  EXPECT_NE(with_progress.out.find("[8/8] mxfp4_train direct_p=off"), std::string::npos) << with_progress.out;
}

TEST(Cli, RunJsonHoldsTheSameRows) {
  const std::string path = test_files::temp_path("cli_run.json");
  const Result r = run_cli("run --quick --causal --H 4 --Hkv 2 --json " + path, true);
  ASSERT_EQ(r.status, 0) << r.out;
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_TRUE(doc["date"].is_string());
  EXPECT_TRUE(doc["commit"].is_string());
  EXPECT_NE(doc["command"].get<std::string>().find("--json"), std::string::npos);
  ASSERT_EQ(doc["rows"].size(), 8u);
  const std::vector<TableRow> table = table_rows(r.out);
  ASSERT_EQ(table.size(), 8u);
  for (std::size_t i = 0; i < table.size(); ++i) {
    const nlohmann::json& row = doc["rows"][i];
    EXPECT_EQ(row["recipe"], table[i].recipe);
    EXPECT_EQ(row["direct_p"].get<bool>(), table[i].direct_p == "on");
    EXPECT_EQ(row["causal"].get<bool>(), true);
    EXPECT_EQ(row["H"].get<int>(), 4);
    EXPECT_EQ(row["Hkv"].get<int>(), 2);
    // The table prints 6 significant digits of the cosine.
    EXPECT_NEAR(row["cosine"].get<double>(), table[i].cosine, 1e-6);
    EXPECT_GT(row["ms"].get<double>(), 0.0);
  }
  std::filesystem::remove(path);
}

// --window runs every recipe with a sliding window: the header and the JSON
// say so, and the errors against fp64 are those of the windowed reference (a
// window of 16 keys differs from full causal attention by far more).
TEST(Cli, RunWithAWindow) {
  const std::string path = test_files::temp_path("cli_window.json");
  const Result r = run_cli("run --quick --causal --window 16 0 --recipe fp8 --json " + path, true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("causal, window 16 0"), std::string::npos) << r.out;
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_EQ(doc["rows"].size(), 2u);
  for (const nlohmann::json& row : doc["rows"]) {
    EXPECT_EQ(row["window"], nlohmann::json({16, 0}));
    EXPECT_GT(row["cosine"].get<double>(), 0.99);
  }
  std::filesystem::remove(path);
}

TEST(Cli, BadRunArguments) {
  expect_named_error("run --quick --causal --window 16 5", "--window", "must be -1 or 0 with a causal mask");
  expect_named_error("run --quick --window -3 5", "--window", "window_left");
  expect_named_error("run --quick --D 100", "--D", "D=100 is not supported");
  expect_named_error("run --quick --H 12 --Hkv 5", "--H", "Hq (12) must be a multiple of Hkv (5)");
  expect_named_error("run --quick --B 0", "--B", "must be > 0");
  expect_named_error("run --quick --Sk -3", "--Sk", "must be > 0");
  expect_named_error("run --quick --Hkv 0", "--Hkv", "must be > 0");
  expect_named_error("run --quick --target sm70", "--target", "sm70");
  expect_named_error("run --quick --recipe fp3", "--recipe", "fp3");
  expect_named_error("run --quick --threads -1", "--threads");
  expect_named_error("run --B abc", "--B");
  expect_named_error("run --bogus", "--bogus");
  expect_named_error("run --quick --json /nonexistent-dir/x.json", "--json");
  expect_named_error("", "subcommand");
}

// `bench` times the sm90 kernel only: without a Hopper GPU it must refuse in
// one line rather than time the emulator (also with --training); with one, a
// small problem gives the four rows of the bench/results schema.
TEST(Cli, BenchNeedsHopper) {
  const std::string small = "bench --B 1 --H 2 --S 1024 --reps 3 --warmup 1";
  if (!sm90_available()) {
    expect_named_error(small, "bench", "the CPU emulator is not benchmarked");
    expect_named_error(small + " --training", "bench", "the CPU emulator is not benchmarked");
    if (cuda_built()) expect_named_error(small, "bench", "no Hopper (sm_90) GPU found");
    return;
  }
  const std::string path = test_files::temp_path("cli_bench.json");
  const Result r = run_cli(small + " --causal --json " + path, true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("bench/bench_fwd.py"), std::string::npos) << r.out;
  std::ifstream in(path);
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_TRUE(doc["gpu"].is_string());
  ASSERT_EQ(doc["rows"].size(), 4u);
  std::set<std::pair<std::string, bool>> seen;
  for (const nlohmann::json& row : doc["rows"]) {
    seen.insert({row["op"].get<std::string>(), row["direct_p"].get<bool>()});
    EXPECT_EQ(row["recipe"], "fp8");
    EXPECT_EQ(row["causal"].get<bool>(), true);
    EXPECT_EQ(row["Sq"].get<int>(), 1024);
    EXPECT_GT(row["ms"].get<double>(), 0.0);
    EXPECT_GT(row["tflops"].get<double>(), 0.0);
  }
  EXPECT_EQ(seen.size(), 4u);
  std::filesystem::remove(path);
}

TEST(Cli, BadBenchArguments) {
  expect_named_error("bench --D 96", "--D", "D=96 is not supported by the sm90 executor");
  expect_named_error("bench --H 12 --Hkv 5", "--H", "Hq (12) must be a multiple of Hkv (5)");
  expect_named_error("bench --S 0", "--S", "must be > 0");
  expect_named_error("bench --Sk -3", "--Sk", "must be > 0");
  expect_named_error("bench --reps 0", "--reps", "must be >= 1");
  expect_named_error("bench --warmup -1", "--warmup", "must be >= 0");
  expect_named_error("bench --S 1024 --Sq 512", "--S");
  expect_named_error("bench --json /nonexistent-dir/x.json", "--json");
  expect_named_error("bench --causal --window 64 5", "--window", "must be -1 or 0 with a causal mask");
  expect_named_error("bench --window -3 5", "--window", "window_left");
}

// Q, K and V files of one small GQA problem in several dtypes and layouts.
class CliAccuracy : public ::testing::Test {
 protected:
  static constexpr std::int64_t S = 64, Hq = 4, Hkv = 2, D = 32;

  std::vector<float> random(std::int64_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = dist(rng);
    return x;
  }
  // (S, H, D) -> (H, S, D)
  static std::vector<float> to_hsd(const std::vector<float>& x, std::int64_t H) {
    std::vector<float> y(x.size());
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) y[(h * S + s) * D + d] = x[(s * H + h) * D + d];
    return y;
  }
  std::string npy(const std::string& name, const std::vector<std::int64_t>& shape, const std::vector<float>& x) {
    const std::string path = test_files::write_file(name, test_files::npy_bytes("<f4", shape, test_files::f32_payload(x)));
    paths_.push_back(path);
    return path;
  }
  std::string file(const std::string& name, const test_files::Bytes& bytes) {
    paths_.push_back(test_files::write_file(name, bytes));
    return paths_.back();
  }
  void TearDown() override {
    for (const std::string& p : paths_) std::filesystem::remove(p);
  }

  std::vector<float> q = random(S * Hq * D, 11), k = random(S * Hkv * D, 12), v = random(S * Hkv * D, 13);
  std::vector<std::string> paths_;
};

TEST_F(CliAccuracy, GqaFilesInEveryDtype) {
  // bf16 and fp16 codes of the first few values are not needed: any codes
  // decode to finite, non-zero numbers when taken from these ranges.
  std::vector<std::uint16_t> k_bf16(k.size()), v_f16(v.size());
  for (std::size_t i = 0; i < k.size(); ++i) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &k[i], sizeof bits);
    k_bf16[i] = static_cast<std::uint16_t>(bits >> 16);  // truncation: still a faithful bf16 of k
  }
  std::mt19937 rng(14);
  for (std::uint16_t& c : v_f16) c = static_cast<std::uint16_t>(0x3000 + rng() % 0x1000);  // [0.125, 1)
  for (std::size_t i = 0; i < v_f16.size(); i += 2) v_f16[i] |= 0x8000;                       // both signs
  const std::string qp = npy("acc_q.npy", {1, S, Hq, D}, q);
  const std::string kp = file("acc_k.npy", test_files::npy_bytes("<V2", {S, Hkv, D}, test_files::u16_payload(k_bf16)));
  const std::string vp =
      file("acc_v.safetensors", test_files::safetensors_bytes({{"v", "F16", {S, Hkv, D}, test_files::u16_payload(v_f16)}}));
  for (const char* causal : {"", " --causal"}) {
    const Result r = run_cli("accuracy --q " + qp + " --k " + kp + " --v " + vp + causal, true);
    ASSERT_EQ(r.status, 0) << r.out;
    expect_full_table(table_rows(r.out));
  }
}

TEST_F(CliAccuracy, LayoutsGiveTheSameTable) {
  const std::string bshd = "accuracy --threads 1 --q " + npy("lay_q.npy", {S, Hq, D}, q) + " --k " +
                           npy("lay_k.npy", {S, Hkv, D}, k) + " --v " + npy("lay_v.npy", {S, Hkv, D}, v);
  const std::string bhsd = "accuracy --threads 1 --layout bhsd --q " + npy("lay_tq.npy", {1, Hq, S, D}, to_hsd(q, Hq)) +
                           " --k " + npy("lay_tk.npy", {Hkv, S, D}, to_hsd(k, Hkv)) + " --v " +
                           npy("lay_tv.npy", {Hkv, S, D}, to_hsd(v, Hkv));
  const std::vector<TableRow> a = table_rows(run_cli(bshd, true).out);
  const std::vector<TableRow> b = table_rows(run_cli(bhsd, true).out);
  expect_full_table(a);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].cosine, b[i].cosine) << i;
    EXPECT_EQ(a[i].rel_l2, b[i].rel_l2) << i;
    EXPECT_EQ(a[i].max_abs, b[i].max_abs) << i;
  }
}

TEST_F(CliAccuracy, SafetensorsKeys) {
  const test_files::Bytes two = test_files::safetensors_bytes(
      {{"first", "F32", {S, Hq, D}, test_files::f32_payload(q)}, {"second", "F32", {S, Hq, D}, test_files::f32_payload(q)}});
  const std::string qp = file("keys_q.safetensors", two);
  const std::string kp = npy("keys_k.npy", {S, Hkv, D}, k), vp = npy("keys_v.npy", {S, Hkv, D}, v);
  expect_named_error("accuracy --q " + qp + " --k " + kp + " --v " + vp, "--q", "pick one by key");
  expect_named_error("accuracy --key third --q " + qp + " --k " + kp + " --v " + vp, "--q", "no tensor named 'third'");
  const Result r = run_cli("accuracy --recipe fp8 --key second --q " + qp + " --k " + kp + " --v " + vp, true);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(table_rows(r.out).size(), 2u);
}

TEST_F(CliAccuracy, BadFilesAndShapes) {
  const std::string qp = npy("bad_q.npy", {S, Hq, D}, q), kp = npy("bad_k.npy", {S, Hkv, D}, k),
                    vp = npy("bad_v.npy", {S, Hkv, D}, v);
  const std::string missing = test_files::temp_path("bad_missing.npy");
  expect_named_error("accuracy --q " + missing + " --k " + kp + " --v " + vp, "--q: file '" + missing + "'",
                     "does not exist");
  test_files::Bytes cut = test_files::npy_bytes("<f4", {S, Hkv, D}, test_files::f32_payload(k));
  cut.resize(cut.size() - 5);
  expect_named_error("accuracy --q " + qp + " --k " + file("bad_cut.npy", cut) + " --v " + vp, "--k", "truncated");
  const test_files::Bytes junk = {8, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'v', '"', ':', '[', '1', ','};
  expect_named_error("accuracy --q " + qp + " --k " + kp + " --v " + file("bad_json.safetensors", junk), "--v",
                     "not valid JSON");
  std::vector<float> nan_q = q;
  nan_q[5] = std::nanf("");
  expect_named_error("accuracy --q " + npy("bad_nan.npy", {S, Hq, D}, nan_q) + " --k " + kp + " --v " + vp, "--q",
                     "non-finite");
  const std::vector<float> wide_q = random(S * Hq * 100, 15), wide_kv = random(S * Hkv * 100, 16);
  const std::string wide_kp = npy("bad_dk.npy", {S, Hkv, 100}, wide_kv);
  expect_named_error("accuracy --q " + npy("bad_d.npy", {S, Hq, 100}, wide_q) + " --k " + wide_kp + " --v " + wide_kp,
                     "--q", "D=100 is not supported");
  expect_named_error("accuracy --q " + qp + " --k " + wide_kp + " --v " + wide_kp, "--k",
                     "head dim 100 differs from --q's 32");
  expect_named_error("accuracy --q " + qp + " --k " + kp + " --v " + npy("bad_vs.npy", {S / 2, Hkv, D}, {v.begin(), v.begin() + v.size() / 2}),
                     "--v", "sequence length 32 differs from --k's 64");
  expect_named_error("accuracy --q " + npy("bad_rank.npy", {S * Hq, D}, q) + " --k " + kp + " --v " + vp, "--q",
                     "has 2 dimensions");
  expect_named_error("accuracy --q " + npy("bad_h.npy", {S, 3, D}, random(S * 3 * D, 17)) + " --k " + kp + " --v " + vp, "--q",
                     "Hq (3) must be a multiple of Hkv (2)");
  expect_named_error("accuracy --key x --q " + qp + " --k " + kp + " --v " + vp, "--key");
  expect_named_error("accuracy --layout sbhd --q " + qp + " --k " + kp + " --v " + vp, "--layout");
  expect_named_error("accuracy --q " + qp + " --k " + kp, "--v");
}

}  // namespace
}  // namespace fp4attn
