// make_deepseek_gguf: writes a GGUF v3 file of architecture `deepseek2` with DeepSeek-V2-Lite's
// real configuration (27 layers, hidden 2048, 16 heads, no q LoRA, kv_lora_rank 512, qk 128 +
// 64 rope, v 128, first layer dense with intermediate 10944, then 64 routed experts of width
// 1408 + 2 shared, top-6 greedy softmax routing, routed_scaling_factor 1, YaRN factor 40 /
// original 4096 / mscale 0.707) and random weights, for speed benchmarks at real size
// (docs/benchmarks.md). Nothing here is a trained model: the logits are noise.
//
//   make_deepseek_gguf -o out/deepseek-v2-lite-random-q4_0.gguf            (~8.9 GB, Q4_0)
//   make_deepseek_gguf -o out/moe64.gguf --layers 4 --dense 0 --vocab 4096  (MoE benchmark)
//
// Layout = what llama.cpp's converter writes for DeepSeek-V2-Lite and then `llama-quantize
// --pure` would make of it: every 2-D/3-D weight in --type (token_embd and output included),
// ffn_gate_inp (router) and the norms F32; kv_b split into attn_k_b [H, r, d_n] (= W_UK^T) and
// attn_v_b [H, d_v, r] with head_count_kv 1, key_length r + d_r, value_length r and the real
// head sizes in key_length_mla / value_length_mla (--legacy-kv-b writes the unsplit attn_kv_b
// and the plain key/value lengths instead). Experts are stacked: ffn_{gate,up}_exps [E, I, D],
// ffn_down_exps [E, D, I]. Shapes below are PyTorch order (outermost first); GGUF stores the
// reverse. Loads in peng (src/model/deepseek2) and in llama.cpp (its deepseek2 loader needs a
// tokenizer, so a synthetic byte-level BPE vocabulary of --vocab tokens is written: the 256
// GPT-2 byte symbols, a few hundred two-letter merges, BOS/EOS control tokens, unique fillers).
// llama.cpp only skips the q_lora_rank key for 26/27-layer files ("lite" detection), so other
// layer counts get attention.q_lora_rank = 0, which both loaders read as "no q LoRA".
//
// Weights: N(0,1) approximated by an Irwin-Hall sum of four 16-bit uniforms from a splitmix64
// stream, times 1/sqrt(fan_in); norms 1 + 0.05 N(0,1). Each block of 64 rows has its own
// stream (seed, tensor name, block), so the file is the same for any --threads. Tensors are
// produced while the file is written (GgufWriter::DeclareTensor + WriteFile), one at a time,
// rows split over the threads, so memory stays at about one tensor.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/gguf_writer.h"
#include "kernels/ops.h"

namespace peng {
namespace {

struct Options {
  std::string out;
  DType type = DType::kQ4_0;
  int64_t layers = 27;
  int64_t dense = 1;  // first_k_dense_replace
  int64_t experts = 64;
  int64_t shared = 2;
  int64_t topk = 6;
  int64_t vocab = 102400;
  int64_t hidden = 2048;
  int64_t ffn = 10944;     // dense intermediate_size
  int64_t moe_ffn = 1408;  // moe_intermediate_size
  int64_t heads = 16;
  int64_t kv_lora = 512;
  int64_t qk_nope = 128;
  int64_t qk_rope = 64;
  int64_t v_head = 128;
  int64_t context = 163840;
  bool legacy_kv_b = false;
  bool self_check = false;
  uint64_t seed = 1;
  int threads = 2;
};

// ------------------------------------------------------------------------------ random numbers

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// n approximately standard-normal values: (sum of four U{0..65535} - mean) / sd.
void Gaussians(uint64_t* state, float* out, int64_t n, float scale) {
  constexpr float kMean = 4 * 32767.5f;
  const float k = scale / (65536.f * std::sqrt(4.f / 12.f));
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t r = SplitMix(state);
    const uint32_t s = static_cast<uint32_t>(r & 0xffff) +
                       static_cast<uint32_t>((r >> 16) & 0xffff) +
                       static_cast<uint32_t>((r >> 32) & 0xffff) + static_cast<uint32_t>(r >> 48);
    out[i] = (static_cast<float>(s) - kMean) * k;
  }
}

// ------------------------------------------------------------------------------ quantizers
// GGML block formats, 32 values per block:
//   Q4_0: fp16 d, 16 bytes; byte j holds q[j] (low nibble) and q[j + 16] (high nibble);
//         value = (q - 8) * d with q in [0, 15]. d = -(value of largest magnitude) / 8, so
//         that value maps to q = 0 exactly and the range [-8d, 7d] is used on its side.
//   Q8_0: fp16 d, 32 int8; value = q * d, d = max|x| / 127.

void QuantizeQ4_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0.f, m = 0.f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    }
    const float d = m / -8.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const uint16_t dh = F32ToF16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      int q0 = static_cast<int>(x[j] * id + 8.5f), q1 = static_cast<int>(x[j + 16] * id + 8.5f);
      q0 = q0 < 0 ? 0 : (q0 > 15 ? 15 : q0);
      q1 = q1 < 0 ? 0 : (q1 > 15 ? 15 : q1);
      out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeQ8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    const uint16_t dh = F32ToF16(d);
    std::memcpy(out, &dh, 2);
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::lround(x[i] * id));
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q < -127 ? -127 : (q > 127 ? 127 : q)));
    }
  }
}

void EncodeRow(DType t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case DType::kQ4_0:
      QuantizeQ4_0(x, n, out);
      break;
    case DType::kQ8_0:
      QuantizeQ8_0(x, n, out);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToF16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      break;
    default:  // F32
      std::memcpy(out, x, n * sizeof(float));
      break;
  }
}

// ------------------------------------------------------------------------------ model layout

struct TensorSpec {
  DType type;
  std::vector<int64_t> shape;  // outermost first
  float scale;                 // std of the values (norms: 0.05 around 1)
  bool norm = false;
};

// GPT-2 byte-level symbol of byte b (printable Latin-1 bytes map to themselves, the others to
// U+0100 + their rank among the non-printable ones), as UTF-8.
std::string ByteSymbol(int b) {
  auto printable = [](int c) {
    return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
  };
  uint32_t cp = static_cast<uint32_t>(b);
  if (!printable(b)) {
    int rank = 0;
    for (int c = 0; c < b; ++c) rank += !printable(c);
    cp = 256u + static_cast<uint32_t>(rank);
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

void AddTokenizer(const Options& o, GgufWriter* w) {
  const int64_t V = o.vocab;
  std::vector<std::string> tokens;
  std::vector<int64_t> types;  // llama_token_type: 1 normal, 3 control
  std::vector<std::string> merges;
  tokens.reserve(V);
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(ByteSymbol(b));
    types.push_back(1);
  }
  const int64_t bos = V > 100001 ? 100000 : V - 2, eos = bos + 1;
  // Two-letter merges ("Ġ" + letter, then letter pairs) while they fit below BOS.
  const std::string space = ByteSymbol(' ');
  std::vector<std::pair<std::string, std::string>> pairs;
  for (char a = 'a'; a <= 'z'; ++a) pairs.push_back({space, std::string(1, a)});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pairs.push_back({std::string(1, a), std::string(1, b)});
  for (const auto& [l, r] : pairs) {
    if (static_cast<int64_t>(tokens.size()) >= bos) break;
    merges.push_back(l + " " + r);
    tokens.push_back(l + r);
    types.push_back(1);
  }
  while (static_cast<int64_t>(tokens.size()) < V) {
    const int64_t id = static_cast<int64_t>(tokens.size());
    if (id == bos) {
      tokens.push_back(
          "<\xef\xbd\x9c"
          "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
      types.push_back(3);
    } else if (id == eos) {
      tokens.push_back(
          "<\xef\xbd\x9c"
          "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>");
      types.push_back(3);
    } else {
      tokens.push_back("<filler_" + std::to_string(id) + ">");
      types.push_back(1);
    }
  }
  w->AddString("tokenizer.ggml.model", "gpt2");
  w->AddString("tokenizer.ggml.pre", "deepseek-llm");
  w->AddStringArray("tokenizer.ggml.tokens", tokens);
  w->AddIntArray("tokenizer.ggml.token_type", GgufValue::Type::kI32, types);
  w->AddStringArray("tokenizer.ggml.merges", merges);
  w->AddU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  w->AddU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  w->AddU32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(eos));
  w->AddBool("tokenizer.ggml.add_bos_token", true);
  w->AddBool("tokenizer.ggml.add_eos_token", false);
}

uint32_t FileType(DType t) {  // llama_ftype
  switch (t) {
    case DType::kQ4_0:
      return 2;
    case DType::kQ8_0:
      return 7;
    case DType::kF16:
      return 1;
    default:
      return 0;
  }
}

void AddMetadata(const Options& o, GgufWriter* w) {
  const std::string a = "deepseek2.";
  const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w->AddString("general.architecture", "deepseek2");
  w->AddString("general.name", "DeepSeek-V2-Lite-shaped random weights");
  w->AddU32("general.file_type", FileType(o.type));
  w->AddU32(a + "block_count", u32(o.layers));
  w->AddU32(a + "context_length", u32(o.context));
  w->AddU32(a + "embedding_length", u32(o.hidden));
  w->AddU32(a + "feed_forward_length", u32(o.ffn));
  w->AddU32(a + "attention.head_count", u32(o.heads));
  w->AddU32(a + "attention.head_count_kv", o.legacy_kv_b ? u32(o.heads) : 1u);
  w->AddF32(a + "rope.freq_base", 10000.f);
  w->AddF32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w->AddU32(a + "expert_used_count", u32(o.topk));
  w->AddU32(a + "expert_count", u32(o.experts));
  w->AddString(a + "rope.scaling.type", "yarn");
  w->AddF32(a + "rope.scaling.factor", 40.f);
  w->AddU32(a + "rope.scaling.original_context_length", 4096);
  w->AddF32(a + "rope.scaling.yarn_beta_fast", 32.f);
  w->AddF32(a + "rope.scaling.yarn_beta_slow", 1.f);
  w->AddU32(a + "leading_dense_block_count", u32(o.dense));
  w->AddU32(a + "vocab_size", u32(o.vocab));
  if (o.layers != 27 && o.layers != 26) w->AddU32(a + "attention.q_lora_rank", 0);
  w->AddU32(a + "attention.kv_lora_rank", u32(o.kv_lora));
  if (o.legacy_kv_b) {
    w->AddU32(a + "attention.key_length", u32(o.qk_nope + o.qk_rope));
    w->AddU32(a + "attention.value_length", u32(o.v_head));
  } else {
    w->AddU32(a + "attention.key_length", u32(o.kv_lora + o.qk_rope));
    w->AddU32(a + "attention.value_length", u32(o.kv_lora));
    w->AddU32(a + "attention.key_length_mla", u32(o.qk_nope + o.qk_rope));
    w->AddU32(a + "attention.value_length_mla", u32(o.v_head));
  }
  w->AddU32(a + "expert_feed_forward_length", u32(o.moe_ffn));
  w->AddU32(a + "expert_shared_count", u32(o.shared));
  w->AddF32(a + "expert_weights_scale", 1.f);
  w->AddU32(a + "rope.dimension_count", u32(o.qk_rope));
  w->AddF32(a + "rope.scaling.yarn_log_multiplier", 0.1f * 0.707f);
  AddTokenizer(o, w);
}

std::vector<std::pair<std::string, TensorSpec>> Layout(const Options& o) {
  const int64_t D = o.hidden, H = o.heads, r = o.kv_lora, dn = o.qk_nope, dr = o.qk_rope,
                dv = o.v_head, E = o.experts, I = o.moe_ffn, S = o.moe_ffn * o.shared;
  const DType q = o.type;
  auto inv = [](int64_t fan_in) { return 1.f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<std::pair<std::string, TensorSpec>> t;
  auto norm = [&](const std::string& name, int64_t n) {
    t.push_back({name, {DType::kF32, {n}, 0.05f, true}});
  };
  t.push_back({"token_embd.weight", {q, {o.vocab, D}, 1.f}});
  for (int64_t il = 0; il < o.layers; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    norm(p + "attn_norm.weight", D);
    t.push_back({p + "attn_q.weight", {q, {H * (dn + dr), D}, inv(D)}});
    t.push_back({p + "attn_kv_a_mqa.weight", {q, {r + dr, D}, inv(D)}});
    norm(p + "attn_kv_a_norm.weight", r);
    if (o.legacy_kv_b) {
      t.push_back({p + "attn_kv_b.weight", {q, {H * (dn + dv), r}, inv(r)}});
    } else {
      t.push_back({p + "attn_k_b.weight", {q, {H, r, dn}, inv(r)}});  // W_UK^T per head
      t.push_back({p + "attn_v_b.weight", {q, {H, dv, r}, inv(r)}});
    }
    t.push_back({p + "attn_output.weight", {q, {D, H * dv}, inv(H * dv)}});
    norm(p + "ffn_norm.weight", D);
    if (il < o.dense || E == 0) {
      t.push_back({p + "ffn_gate.weight", {q, {o.ffn, D}, inv(D)}});
      t.push_back({p + "ffn_up.weight", {q, {o.ffn, D}, inv(D)}});
      t.push_back({p + "ffn_down.weight", {q, {D, o.ffn}, inv(o.ffn)}});
    } else {
      t.push_back({p + "ffn_gate_inp.weight", {DType::kF32, {E, D}, inv(D)}});
      t.push_back({p + "ffn_gate_exps.weight", {q, {E, I, D}, inv(D)}});
      t.push_back({p + "ffn_up_exps.weight", {q, {E, I, D}, inv(D)}});
      t.push_back({p + "ffn_down_exps.weight", {q, {E, D, I}, inv(I)}});
      if (S > 0) {
        t.push_back({p + "ffn_gate_shexp.weight", {q, {S, D}, inv(D)}});
        t.push_back({p + "ffn_up_shexp.weight", {q, {S, D}, inv(D)}});
        t.push_back({p + "ffn_down_shexp.weight", {q, {D, S}, inv(S)}});
      }
    }
  }
  norm("output_norm.weight", D);
  t.push_back({"output.weight", {q, {o.vocab, D}, inv(D)}});
  return t;
}

// ------------------------------------------------------------------------------ main

[[noreturn]] void Usage(const char* msg) {
  if (msg) std::fprintf(stderr, "make_deepseek_gguf: %s\n", msg);
  std::fprintf(stderr,
               "usage: make_deepseek_gguf -o OUT.gguf [--type q4_0|q8_0|f16|f32] [--layers 27]\n"
               "         [--dense 1] [--experts 64] [--shared 2] [--topk 6] [--vocab 102400]\n"
               "         [--hidden 2048] [--ffn 10944] [--moe-ffn 1408] [--heads 16]\n"
               "         [--legacy-kv-b] [--seed 1] [--threads 2]\n"
               "       make_deepseek_gguf --self-check   (encoders vs peng's DequantizeRow)\n");
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options o;
  std::map<std::string, int64_t*> ints = {{"--layers", &o.layers},   {"--dense", &o.dense},
                                          {"--experts", &o.experts}, {"--shared", &o.shared},
                                          {"--topk", &o.topk},       {"--vocab", &o.vocab},
                                          {"--hidden", &o.hidden},   {"--ffn", &o.ffn},
                                          {"--moe-ffn", &o.moe_ffn}, {"--heads", &o.heads}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "-o" || a == "--out") {
      o.out = value();
    } else if (a == "--type") {
      const std::string t = value();
      if (t == "q4_0")
        o.type = DType::kQ4_0;
      else if (t == "q8_0")
        o.type = DType::kQ8_0;
      else if (t == "f16")
        o.type = DType::kF16;
      else if (t == "f32")
        o.type = DType::kF32;
      else
        Usage(("unknown --type " + t).c_str());
    } else if (a == "--self-check") {
      o.self_check = true;
    } else if (a == "--legacy-kv-b") {
      o.legacy_kv_b = true;
    } else if (a == "--seed") {
      o.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--threads" || a == "-t") {
      o.threads = std::atoi(value().c_str());
    } else if (ints.count(a)) {
      *ints[a] = std::atoll(value().c_str());
    } else if (a == "-h" || a == "--help") {
      Usage(nullptr);
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  if (o.out.empty() && !o.self_check) Usage("-o is required");
  if (o.layers < 1 || o.hidden < 32 || o.heads < 1 || o.vocab < 1024 || o.threads < 1)
    Usage("--layers, --heads >= 1, --hidden >= 32, --vocab >= 1024, --threads >= 1");
  if (o.experts < 0 || o.dense < 0 || o.shared < 0) Usage("negative expert counts");
  if (o.experts > 0 && (o.topk < 1 || o.topk > o.experts)) Usage("--topk must be in [1, experts]");
  for (int64_t d : {o.hidden, o.ffn, o.moe_ffn, o.kv_lora, o.qk_nope, o.v_head})
    if (d % 32 != 0) Usage("every matrix width must be a multiple of 32");
  return o;
}

// Round trip of the encoders through peng's own decoder (kernels::DequantizeRow): every value
// within the format's rounding error (Q4_0: |d|, as the side opposite the block's extreme
// value may clamp at q = 15; Q8_0 and F16: half a step; plus the fp16 rounding of d).
int SelfCheck() {
  const int64_t n = 1 << 16;
  std::vector<float> x(n), y(n);
  uint64_t state = 42;
  Gaussians(&state, x.data(), n, 0.03f);
  int failures = 0;
  for (DType t : {DType::kQ4_0, DType::kQ8_0, DType::kF16}) {
    std::vector<uint8_t> q(RowBytes(t, n));
    EncodeRow(t, x.data(), n, q.data());
    kernels::DequantizeRow(t, q.data(), y.data(), n);
    double worst = 0, mean_rel = 0;  // error relative to the bound; mean |error| / amax
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
      // Plus the fp16 rounding of d (2^-11 relative, times |q| <= 8 or 127).
      const float bound = t == DType::kQ4_0   ? amax / 8.f * 1.01f
                          : t == DType::kQ8_0 ? amax / 127.f * 0.57f + 1e-7f
                                              : amax * 1e-3f;
      for (int i = 0; i < 32; ++i) {
        const double err = std::fabs(x[b * 32 + i] - y[b * 32 + i]);
        worst = std::max(worst, err / bound);
        mean_rel += err / amax / n;
      }
    }
    const bool ok = worst <= 1.0;
    failures += !ok;
    std::printf(
        "%-5s round trip: worst error %.3f of the bound, mean |error| %.4f of max|x| -> %s\n",
        DTypeName(t), worst, mean_rel, ok ? "ok" : "FAIL");
  }
  return failures ? 1 : 0;
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (o.self_check) return SelfCheck();
  GgufWriter w(3);
  AddMetadata(o, &w);
  const auto layout = Layout(o);
  int64_t total_bytes = 0, params = 0;
  for (const auto& [name, spec] : layout) {
    Status s = w.DeclareTensor(name, spec.type, spec.shape);
    if (!s.ok()) {
      std::fprintf(stderr, "make_deepseek_gguf: %s\n", s.ToString().c_str());
      return 1;
    }
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    params += n;
    total_bytes += static_cast<int64_t>(RowBytes(spec.type, n));
  }
  std::fprintf(stderr, "writing %s: %zu tensors, %.3f B parameters, %.2f GB of weights (%s)\n",
               o.out.c_str(), layout.size(), params / 1e9, total_bytes / 1e9, DTypeName(o.type));

  ThreadPool pool(o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t done = 0;
  constexpr int64_t kRowsPerStream = 64;
  Status st = w.WriteFile(
      o.out, [&](size_t index, const std::string& name, std::vector<uint8_t>* bytes) -> Status {
        const TensorSpec& spec = layout[index].second;
        const int64_t cols = spec.shape.back();
        int64_t rows = 1;
        for (size_t i = 0; i + 1 < spec.shape.size(); ++i) rows *= spec.shape[i];
        const size_t row_bytes = RowBytes(spec.type, cols);
        const uint64_t base = o.seed * 0x9e3779b97f4a7c15ull ^ HashName(name);
        const int64_t n_streams = (rows + kRowsPerStream - 1) / kRowsPerStream;
        pool.ParallelFor(n_streams, [&](int64_t b, int64_t e) {
          std::vector<float> x(cols);
          for (int64_t sidx = b; sidx < e; ++sidx) {
            uint64_t state = base ^ (static_cast<uint64_t>(sidx) * 0xd1b54a32d192ed03ull);
            SplitMix(&state);
            const int64_t r1 = std::min(rows, (sidx + 1) * kRowsPerStream);
            for (int64_t row = sidx * kRowsPerStream; row < r1; ++row) {
              Gaussians(&state, x.data(), cols, spec.scale);
              if (spec.norm)
                for (float& v : x) v += 1.f;
              EncodeRow(spec.type, x.data(), cols, bytes->data() + row * row_bytes);
            }
          }
        });
        done += static_cast<int64_t>(bytes->size());
        if (index % 16 == 0 || index + 1 == layout.size()) {
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::fprintf(stderr, "\r  %zu/%zu tensors, %.2f GB, %.0f s", index + 1, layout.size(),
                       done / 1e9, s);
        }
        return OkStatus();
      });
  std::fprintf(stderr, "\n");
  if (!st.ok()) {
    std::fprintf(stderr, "make_deepseek_gguf: %s\n", st.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "done in %.0f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) { return peng::Main(argc, argv); }
