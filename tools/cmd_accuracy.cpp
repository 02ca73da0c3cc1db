// `fp4attn accuracy`: the recipe table on the user's own Q, K and V tensors.
#include <memory>

#include "commands.hpp"
#include "fp4attn/io.hpp"
#include "fp4attn/quantize.hpp"

namespace fp4attn::cli {
namespace {

struct AccuracyArgs {
  std::string q, k, v;
  std::string layout = "bshd";
  std::string key;
  CommonArgs common;
};

enum class Layout { bshd, bhsd };

// A tensor brought to (B, S, H, D), D contiguous.
struct Bshd {
  std::int64_t B = 0, S = 0, H = 0, D = 0;
  std::vector<float> data;
};

std::string dims_string(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

io::HostTensor load(const std::string& flag, const std::string& path, const std::string& key) {
  try {
    io::HostTensor t = io::read_tensor(path, path.ends_with(".safetensors") ? key : "");
    require_finite(t.data, flag);
    return t;
  } catch (const Error& e) {
    if (e.argument() == flag) throw;
    throw Error(flag, e.what());
  }
}

// (B, S, H, D) or (S, H, D) for bshd; (B, H, S, D) or (H, S, D) for bhsd.
Bshd to_bshd(io::HostTensor t, Layout layout, const std::string& flag) {
  constexpr std::size_t kRankWithBatch = 4;
  constexpr std::size_t kRankWithoutBatch = 3;
  std::vector<std::int64_t> s = t.shape;
  if (s.size() == kRankWithoutBatch) s.insert(s.begin(), 1);
  if (s.size() != kRankWithBatch)
    throw Error(flag, "shape " + dims_string(t.shape) + " has " + std::to_string(t.shape.size()) +
                          " dimensions; expected " +
                          (layout == Layout::bshd ? "(B, S, H, D) or (S, H, D)" : "(B, H, S, D) or (H, S, D)") +
                          " (see --layout)");
  if (layout == Layout::bshd) return Bshd{s[0], s[1], s[2], s[3], std::move(t.data)};
  Bshd out{s[0], s[2], s[1], s[3], std::vector<float>(t.data.size())};
  for (std::int64_t b = 0; b < out.B; ++b)
    for (std::int64_t h = 0; h < out.H; ++h)
      for (std::int64_t i = 0; i < out.S; ++i)
        for (std::int64_t d = 0; d < out.D; ++d)
          out.data[bshd_index(out.S, out.H, out.D, b, i, h, d)] = t.data[((b * out.H + h) * out.S + i) * out.D + d];
  return out;
}

void require_equal(std::int64_t got, std::int64_t want, const char* what, const std::string& flag,
                   const std::string& other) {
  if (got != want)
    throw Error(flag, std::string(what) + " " + std::to_string(got) + " differs from " + other + "'s " +
                          std::to_string(want));
}

std::string flag_of(const std::string& argument) {
  if (argument == "B" || argument == "Hq" || argument == "Sq" || argument == "D") return "--q";
  if (argument == "Hkv" || argument == "Sk") return "--k";
  return "";
}

void accuracy(const AccuracyArgs& args, const std::string& command_line) {
  Layout layout = Layout::bshd;
  if (args.layout == "bhsd") layout = Layout::bhsd;
  else if (args.layout != "bshd") throw Error("--layout", "'" + args.layout + "' is not a layout (bshd or bhsd)");
  if (!args.key.empty() && !args.q.ends_with(".safetensors") && !args.k.ends_with(".safetensors") &&
      !args.v.ends_with(".safetensors"))
    throw Error("--key", "only applies to .safetensors files");
  const Settings settings = parse_settings(args.common);

  Bshd q = to_bshd(load("--q", args.q, args.key), layout, "--q");
  Bshd k = to_bshd(load("--k", args.k, args.key), layout, "--k");
  Bshd v = to_bshd(load("--v", args.v, args.key), layout, "--v");
  require_equal(k.B, q.B, "batch", "--k", "--q");
  require_equal(k.D, q.D, "head dim", "--k", "--q");
  require_equal(v.B, k.B, "batch", "--v", "--k");
  require_equal(v.S, k.S, "sequence length", "--v", "--k");
  require_equal(v.H, k.H, "head count", "--v", "--k");
  require_equal(v.D, k.D, "head dim", "--v", "--k");

  const AttentionShape shape{.B = q.B, .Hq = q.H, .Hkv = k.H, .Sq = q.S, .Sk = k.S, .D = q.D};
  const MaskKind mask = args.common.causal ? MaskKind::causal : MaskKind::none;
  with_flag_names(flag_of, [&] {
    const Window window = parse_window(args.common.window, args.common.causal);
    report(Problem{shape, std::move(q.data), std::move(k.data), std::move(v.data), mask, window}, settings,
           args.common, command_line);
  });
}

}  // namespace

void add_accuracy_command(CLI::App& app, const std::string& command_line) {
  auto args = std::make_shared<AccuracyArgs>();
  CLI::App* cmd = app.add_subcommand("accuracy", "Recipe table on your own tensors (.npy or .safetensors)");
  cmd->add_option("--q", args->q, "Queries: fp32, fp16 or bf16, (B, S, H, D) or (S, H, D)")->required();
  cmd->add_option("--k", args->k, "Keys, same layout; H may divide the query heads (GQA)")->required();
  cmd->add_option("--v", args->v, "Values, same shape as the keys")->required();
  cmd->add_option("--layout", args->layout, "Axis order of the files: bshd (default) or bhsd");
  cmd->add_option("--key", args->key, "Tensor to read from each .safetensors file");
  add_common_options(*cmd, args->common);
  cmd->callback([args, command_line] { accuracy(*args, command_line); });
}

}  // namespace fp4attn::cli
