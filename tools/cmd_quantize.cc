// peng quantize IN OUT --scheme w8a16|w8a8|f32|f16|bf16 [--skip PATTERN ...]: writes a Hugging
// Face folder with INT8 weights + per-channel scales + quant_config.json (or a full-precision
// copy for the float schemes). See src/quant/quantize.h.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "quant/quantize.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct QuantArgs {
  std::string input, output, scheme, float_dtype = "f16";
  std::vector<std::string> skip;
  bool no_default_skip = false, quiet = false;
  int threads = 0;
};

int Run(const QuantArgs& a) {
  QuantizeOptions o;
  o.input = a.input;
  o.output = a.output;
  o.scheme = a.scheme;
  o.skip = a.skip;
  o.default_skip = !a.no_default_skip;
  o.threads = a.threads;
  o.float_dtype = a.float_dtype == "f16" ? DType::kF16 : a.float_dtype == "bf16" ? DType::kBF16
                                                                               : DType::kF32;
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  if (!a.quiet) {
    o.progress = [&](int64_t done, int64_t total, const std::string& name) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::milliseconds(500)) return;
      last = now;
      std::fprintf(stderr, "\r[%5.1f%%] %.1f / %.1f MB  %-60.60s", total ? 100.0 * done / total : 100.0,
                   done / 1e6, total / 1e6, name.c_str());
      if (done == total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    };
  }
  auto r = QuantizeModel(o);
  if (!r.ok()) return Fail(r.status().ToString());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %d tensors quantized, %d skipped, %d kept; %.1f MB -> %.1f MB in %.1f s\n",
              a.output.c_str(), r->quantized, r->skipped, r->copied, r->bytes_in / 1e6,
              r->bytes_out / 1e6, secs);
  return 0;
}

}  // namespace

void RegisterQuantize(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<QuantArgs>();
  CLI::App* c = app.add_subcommand(
      "quantize", "Write an INT8 (per-channel, symmetric) or full-precision copy of a model as a "
                  "Hugging Face folder with quant_config.json");
  c->add_option("input", a->input, "GGUF file or Hugging Face model folder")->required();
  c->add_option("output", a->output, "Folder to create")->required();
  c->add_option("--scheme", a->scheme,
                "w8a16 (INT8 weights, FP32 activations), w8a8 (INT8 weights and per-token INT8 "
                "activations), or f32/f16/bf16 (dequantized copy)")
      ->required()
      ->check(CLI::IsMember({"w8a16", "w8a8", "f32", "f16", "bf16"}));
  c->add_option("--skip", a->skip,
                "Keep tensors whose Hugging Face name matches this glob in floating point "
                "(repeatable; added to the defaults: embeddings, lm_head, MoE routers)");
  c->add_flag("--no-default-skip", a->no_default_skip,
              "Quantize embeddings, lm_head and routers too");
  c->add_option("--float-dtype", a->float_dtype,
                "dtype of unquantized matrices that come from GGUF block quants (f16 is "
                "within 2^-11 of them; f32 exact)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  c->add_option("-t,--threads", a->threads, "Threads (0 = physical cores)")
      ->check(CLI::Range(0, 1024));
  c->add_flag("-q,--quiet", a->quiet, "No progress output");
  c->callback([a, exit_code] { *exit_code = Run(*a); });
}

}  // namespace peng::tools
