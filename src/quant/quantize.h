// `peng quantize`: converts a model (Hugging Face folder or GGUF file) into a Hugging Face
// folder whose weight matrices are INT8, symmetric, one F32 scale per output channel
// (`NAME` I8 [rows, cols] + `NAME_scale` F32 [rows]), plus quant_config.json recording the
// scheme (w8a16: FP32 activations; w8a8: int8 per-token activations), the granularity, what
// was quantized and what was skipped and why. The float schemes (f32/f16/bf16) instead write
// a plain full-precision folder (every matrix in that dtype): the dequantized reference of a
// GGUF model, or the F16/BF16 baseline of a benchmark.
//
// Fused MoE checkpoints' stacked expert matrices (mlp.experts.gate_up_proj [E, 2I, D],
// mlp.experts.down_proj [E, D, I]) are quantized per row of every expert (scale [E, rows]).
// Skipped by default: token embeddings, the LM head and MoE routers (--skip adds glob patterns
// over HF tensor names; default_skip=false drops the defaults). Matrices whose column count is
// not a multiple of 32 stay in floating point (the INT8 kernels need whole 32-column blocks).
//
// GGUF sources (llama and qwen2 architectures) get HF tensor names, a config.json built from
// the GGUF metadata, llama's Q/K rows un-permuted back to HF's rotate_half order, and a
// metadata-only tokenizer.gguf carrying the vocabulary and chat template. HF sources keep
// their config.json and tokenizer files (copied). The output is one model.safetensors,
// streamed tensor by tensor; rows are dequantized/quantized in parallel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/quant_config.h"

namespace peng {

struct QuantizeOptions {
  std::string input;   // HF folder or .gguf file
  std::string output;  // folder to create (must not exist or be empty)
  std::string scheme;  // w8a16 | w8a8 | f32 | f16 | bf16
  std::vector<std::string> skip;  // extra glob patterns (fnmatch) over HF names
  bool default_skip = true;
  // dtype of matrices left unquantized whose source is not a plain float type (GGUF block
  // quants: embeddings, LM head). F16 holds their values to 2^-11 relative (a block quant's
  // value is a few-bit integer times an F16 scale), at half the bytes of F32 -- the LM head is
  // read in full every decode step; kF32 keeps them exact.
  DType float_dtype = DType::kF16;
  int threads = 0;
  // Called after each tensor: done/total bytes of source tensors processed, tensor name.
  std::function<void(int64_t done, int64_t total, const std::string& name)> progress;
};

struct QuantizeReport {
  int quantized = 0, skipped = 0, copied = 0;
  int64_t bytes_in = 0, bytes_out = 0;
};

StatusOr<QuantizeReport> QuantizeModel(const QuantizeOptions& o);

// The default skip patterns (embeddings, LM head, MoE routers) as fnmatch globs.
const std::vector<std::string>& DefaultQuantSkipPatterns();

}  // namespace peng
