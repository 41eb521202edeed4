// CudaDevice's attention ops (included by cuda_device.cu after the class, whose declarations
// say what each does: one translation unit): RoPE and the KV write, paged attention (the heads'
// norms, RoPE and the KV write inside it in decode steps), MLA's absorption, attention and
// projection.
#pragma once

namespace peng::backend::cuda {
namespace {

void CudaDevice::Rope(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
                      const StepBatch& b, const kernels::RopeConfig& cfg, const float* inv_freq) {
  LaunchRopeKv({x, n_heads, head_stride, token_stride}, {}, b, cfg, inv_freq, KvRows<float>{});
}

void CudaDevice::KvWrite(const kernels::KvLayerView& kv, const StepBatch& b, const float* k,
                         const float* v) {
  RopeKvWrite({}, {}, b, kernels::RopeConfig{}, nullptr, kv, k, v, {});
}

void CudaDevice::RopeKvWrite(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                             const kernels::RopeConfig& cfg, const float* inv_freq,
                             const kernels::KvLayerView& kv, const float* k_rows,
                             const float* v_rows, const RowNorm& norm) {
  const int64_t kd = int64_t{kv.n_kv_heads} * kv.head_dim;
  const int64_t vd = int64_t{kv.n_kv_heads} * kv.v_head_dim;
  if (kv.dtype == DType::kQ8_0) {
    LaunchRopeKv(q, k, b, cfg, inv_freq,
                 KvRows<KvQ8>{static_cast<KvQ8*>(kv.k), static_cast<KvQ8*>(kv.v), b.d_slot, kd,
                              vd, k_rows, v_rows, kernels::RotationBlock(kv.head_dim),
                              kernels::RotationBlock(kv.v_head_dim)},
                 norm);
  } else if (kv.dtype == DType::kF16) {
    LaunchRopeKv(q, k, b, cfg, inv_freq,
                 KvRows<uint16_t>{static_cast<uint16_t*>(kv.k), static_cast<uint16_t*>(kv.v),
                                  b.d_slot, kd, vd, k_rows, v_rows},
                 norm);
  } else {
    LaunchRopeKv(q, k, b, cfg, inv_freq,
                 KvRows<float>{static_cast<float*>(kv.k), static_cast<float*>(kv.v), b.d_slot, kd,
                               vd, k_rows, v_rows},
                 norm);
  }
}

void CudaDevice::PagedAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                                const kernels::AttentionParams& p, float* out) {
  Attention(q, kv, b, p, out, QActOut{});
}

void CudaDevice::AttentionMatMuls(const float* q, const kernels::KvLayerView& kv,
                                  const StepBatch& b, const kernels::AttentionParams& p, float* out,
                                  std::initializer_list<MatMulOut> outs, const RopeKv* rope) {
  AttnRope inside;
  if (rope && !RopeInside(q, kv, b, p, *rope, &inside)) {
    NormHeads(*rope, b.n_tokens);
    RopeKvWrite(rope->q, rope->k, b, *rope->cfg, rope->inv_freq, kv, rope->k_rows, rope->v_rows,
                rope->norm);
  }
  QActOut q32;
  const bool quantized = Quantized32(b.n_tokens, kv.v_head_dim, outs, &q32);
  Attention(q, kv, b, p, out, quantized ? q32 : QActOut{}, inside);
  if (quantized) {
    Products(out, b.n_tokens, outs);
  } else {
    MatMuls(out, b.n_tokens, outs);
  }
}

bool CudaDevice::RopeInside(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                            const kernels::AttentionParams& p, const RopeKv& r,
                            AttnRope* inside) const {
  const int64_t hd = kv.head_dim, kd = int64_t{kv.n_kv_heads} * hd;
  const bool fits =
      fused_rope_ && b.n_tokens == b.n_seqs && r.q.x == q && r.q.n_heads == p.n_heads &&
      r.q.head_stride == hd && r.q.token_stride == p.n_heads * hd && r.k.x == r.k_rows &&
      r.k.n_heads == kv.n_kv_heads && r.k.head_stride == hd && r.k.token_stride == kd && r.v_rows &&
      !r.norm.x && (!r.head_norm.q_w || r.head_norm.n == hd) && kv.k && r.cfg->rot_dim <= hd &&
      r.cfg->rot_dim / 2 <= kMaxRopeHalf;
  if (!fits) return false;
  inside->k = r.k_rows;
  inside->v = r.v_rows;
  inside->k_cache = kv.k;
  inside->v_cache = kv.v;
  inside->slot = b.d_slot;
  inside->rot = Rotation(*r.cfg, r.inv_freq);
  inside->q_norm = r.head_norm.q_w;
  inside->k_norm = r.head_norm.k_w;
  inside->norm_offset = r.head_norm.w_offset;
  inside->norm_eps = r.head_norm.eps;
  return true;
}

void CudaDevice::MlaAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                              const kernels::MlaParams& p, float* out) {
  if (b.n_tokens == 0) return;
  if (kv.head_dim > kMaxMlaRow || p.kv_lora_rank > kMaxMlaLatent) {
    Keep(Unimplemented(name_ + ": MLA rows above 640 or latents above 512 values"));
    return;
  }
  AttnArgs a = Args(q, out, kv, b);
  a.v = kv.k;  // the value is the latent part of the same row
  a.k_stride = a.v_stride = kv.head_dim;
  if (kv.dtype == DType::kQ8_0) a.rot_v = a.rot_k;  // (the row's runs: the latent's whole ones)
  a.n_heads = p.n_heads;
  a.n_kv_heads = 1;
  a.v_head_dim = p.kv_lora_rank;
  a.scale = p.scale;
  if (Tiled(b, a) && OnTensorCores(kv, kMlaMmaRow, kMlaMmaLatent, true) &&
      a.v_head_dim <= kMlaMmaLatent && a.v_head_dim % 8 == 0) {
    LaunchAttentionMmaWide<kMlaMmaRow, kMlaMmaLatent, 4, true>(a, kv.dtype, b);
  } else if (Tiled(b, a)) {
    LaunchAttentionTiles<kMaxMlaRow, kMaxMlaLatent, 8, 8, true>(a, kv.dtype, b);
  } else {
    LaunchAttention<kMaxMlaRow, kMaxMlaLatent>(a, kv.dtype, b.n_tokens, p.n_heads);
  }
}

bool CudaDevice::MlaGemm(bool absorb, const float* x, const StepBatch& b, const MlaWeights& w,
                         const kernels::MlaParams& p, float* out) {
  if (!mla_gemm_ || !w.kvb || b.n_tokens <= kGemvMaxTokens) return false;
  const int T = static_cast<int>(b.n_tokens), H = p.n_heads, r = p.kv_lora_rank;
  const int dn = p.d_nope, dr = p.d_rope, dv = p.d_v;
  const long long head = static_cast<long long>(dn + dv) * r;  // kv_b's rows of a head
  const float one = 1.f, zero = 0.f;
  // Column-major, a head a matrix: absorb, out^T [r, T] (rows r + dr apart in the token's row
  // of H) = W_UK [r, dn] (kv_b's rows 0..dn of the head, r values each) x q_nope^T [dn, T];
  // project, out^T [dv, T] = W_UV^T [dv, r] (rows dn.. of the head) x o_lat^T [r, T].
  const cublasStatus_t s =
      absorb ? cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_N, CUBLAS_OP_N, r, T, dn, &one, w.kvb,
                                          CUDA_R_32F, r, head, x, CUDA_R_32F, H * (dn + dr),
                                          dn + dr, &zero, out, CUDA_R_32F, H * (r + dr), r + dr,
                                          H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
             : cublasGemmStridedBatchedEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, dv, T, r, &one,
                                          w.kvb + int64_t{dn} * r, CUDA_R_32F, r, head, x,
                                          CUDA_R_32F, H * r, r, &zero, out, CUDA_R_32F, H * dv,
                                          dv, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ++launches_;  // (counted as one kernel)
  if (s != CUBLAS_STATUS_SUCCESS)
    Keep(Internal(name_ + ": cublasGemmStridedBatchedEx failed (" + std::to_string(s) + ")"));
  return true;
}

void CudaDevice::MlaAbsorbQuery(const float* q, const StepBatch& b, const MlaWeights& w,
                                const kernels::MlaParams& p, float* out) {
  const bool gemm = MlaGemm(true, q, b, w, p, out);
  LaunchMla(launch_, MlaInputsQuantized(), true, q, b, w, p, out, {}, {}, gemm);
  Note(cudaGetLastError());
}

void CudaDevice::RopeMlaAbsorbQuery(const RopeKv& r, const kernels::KvLayerView& kv, const float* q,
                                    const StepBatch& b, const MlaWeights& w,
                                    const kernels::MlaParams& p, float* out) {
  const int64_t dqk = int64_t{p.d_nope} + p.d_rope, row = int64_t{p.kv_lora_rank} + p.d_rope;
  const bool fits = fused_rope_ && r.q.x == q + p.d_nope && r.q.n_heads == p.n_heads &&
                    r.q.head_stride == dqk && r.q.token_stride == p.n_heads * dqk &&
                    r.k.x == r.k_rows + p.kv_lora_rank && r.k.n_heads == 1 &&
                    r.k.head_stride == row && r.k.token_stride == row && !r.v_rows &&
                    r.norm.x == r.k_rows && !r.head_norm.q_w && r.norm.n == p.kv_lora_rank &&
                    r.norm.stride == row && kv.k && kv.head_dim == row &&
                    r.cfg->rot_dim <= p.d_rope && p.d_rope <= 2 * kMaxRopeHalf;
  if (!fits) {
    Device::RopeMlaAbsorbQuery(r, kv, q, b, w, p, out);
    return;
  }
  MlaRopeKv m;
  m.kv = r.k_rows;
  m.norm_w = r.norm.w;
  m.eps = r.norm.eps;
  m.cache = kv.k;
  m.cache_type = kv.dtype;
  m.rot_q8 = kernels::RotationBlock(row);
  m.slot = b.d_slot;
  m.pos = b.d_pos;
  m.rot = Rotation(*r.cfg, r.inv_freq);
  const bool gemm = MlaGemm(true, q, b, w, p, out);
  LaunchMla(launch_, MlaInputsQuantized(), true, q, b, w, p, out, {}, m, gemm);
  Note(cudaGetLastError());
}

void CudaDevice::MlaProjectOutput(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                                  const kernels::MlaParams& p, float* out) {
  const bool gemm = MlaGemm(false, o_lat, b, w, p, out);
  LaunchMla(launch_, MlaInputsQuantized(), false, o_lat, b, w, p, out, {}, {}, gemm);
  Note(cudaGetLastError());
}

void CudaDevice::MlaProjectMatMuls(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                                   const kernels::MlaParams& p, float* out,
                                   std::initializer_list<MatMulOut> outs) {
  QActOut q32;
  if (b.n_tokens == 0 || !Quantized32(b.n_tokens, p.d_v, outs, &q32)) {
    Device::MlaProjectMatMuls(o_lat, b, w, p, out, outs);
    return;
  }
  LaunchMla(launch_, MlaInputsQuantized(), false, o_lat, b, w, p, out, q32);
  Note(cudaGetLastError());
  Products(out, b.n_tokens, outs);
}

template <typename KV>
void CudaDevice::LaunchRopeKv(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                              const kernels::RopeConfig& cfg, const float* inv_freq,
                              const KvRows<KV>& kv, const RowNorm& norm) {
  if (b.n_tokens == 0) return;
  if (cfg.rot_dim / 2 > kMaxRopeHalf) {
    Keep(Unimplemented(name_ + ": RoPE over more than 256 dims"));
    return;
  }
  Launch(RopeKvKernel<KV>, b.n_tokens, 256, launch_, q, k, b.d_pos, Rotation(cfg, inv_freq), kv,
         norm);
  Note(cudaGetLastError());
}

void CudaDevice::Attention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                           const kernels::AttentionParams& p, float* out, const QActOut& quant,
                           const AttnRope& rope) {
  if (b.n_tokens == 0) return;
  if (kv.head_dim > kMaxHeadDim || kv.v_head_dim > kMaxHeadDim) {
    Keep(Unimplemented(name_ + ": head_dim above 256"));
    return;
  }
  AttnArgs a = Args(q, out, kv, b);
  a.k_stride = int64_t{kv.n_kv_heads} * kv.head_dim;
  a.v_stride = int64_t{kv.n_kv_heads} * kv.v_head_dim;
  a.n_heads = p.n_heads;
  a.scale = p.scale;
  a.softcap = p.softcap;
  a.sliding_window = p.sliding_window;
  a.quant = quant;
  a.rope = rope;
  if (!Tiled(b, a)) {
    LaunchAttention<kMaxHeadDim, kMaxHeadDim>(a, kv.dtype, b.n_tokens, p.n_heads);
  } else if (kv.head_dim == kv.v_head_dim && OnTensorCores(kv, 128, 128, true)) {
    if (kv.head_dim <= 64) {
      LaunchAttentionMma<64, 64>(a, kv.dtype, b);
    } else {
      LaunchAttentionMma<128, 64>(a, kv.dtype, b);
    }
  } else if (kv.head_dim == kv.v_head_dim && OnTensorCores(kv, kMaxHeadDim, kMaxHeadDim, true)) {
    LaunchAttentionMmaWide<kMaxHeadDim, kMaxHeadDim, 2, false>(a, kv.dtype, b);
  } else if (kv.head_dim <= 128 && kv.v_head_dim <= 128) {
    LaunchAttentionTiles<128, 128, 16, 32, false>(a, kv.dtype, b);
  } else {
    LaunchAttentionTiles<kMaxHeadDim, kMaxHeadDim, 8, 16, false>(a, kv.dtype, b);
  }
}

template <int kMaxK, int kMaxV>
void CudaDevice::LaunchAttention(const AttnArgs& args, DType cache, int64_t n_tokens,
                                 int n_heads) {
  AttnArgs a = args;
  const int splits = AttnSplits(n_tokens, n_heads);  // (the step's shape alone: graph-safe)
  a.part = attn_part_;
  a.done = attn_done_;
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_heads),
                  static_cast<unsigned>(splits));
  if (cache == DType::kQ8_0) {
    Launch(AttentionKernel<KvQ8, kMaxK, kMaxV>, grid, kAttnWarps * kWarp, launch_, a);
  } else if (cache == DType::kF16) {
    Launch(AttentionKernel<uint16_t, kMaxK, kMaxV>, grid, kAttnWarps * kWarp, launch_, a);
  } else {
    Launch(AttentionKernel<float, kMaxK, kMaxV>, grid, kAttnWarps * kWarp, launch_, a);
  }
  Note(cudaGetLastError());
}

dim3 CudaDevice::TileGrid(AttnArgs* a, const StepBatch& b, int rows) {
  a->seq_first = b.d_seq_first_token;
  a->n_seqs = static_cast<int>(b.n_seqs);
  // At most this many tiles, whatever the sequences' lengths (SeqTiles): a recorded step's
  // shape fixes the grid.
  const int64_t group = a->n_heads / a->n_kv_heads;
  const int64_t tiles = (b.n_tokens * group - b.n_seqs) / rows + b.n_seqs;
  return dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a->n_kv_heads));
}

bool CudaDevice::OnTensorCores(const kernels::KvLayerView& kv, int max_k, int max_v,
                               bool q8_0) const {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool cache = (kv.dtype == DType::kF16 && aligned(kv.k) && aligned(kv.v)) ||
                     (q8_0 && kv.dtype == DType::kQ8_0);
  return mma_attention_ && !kernels::ExactActivations() && cache && kv.head_dim % 16 == 0 &&
         kv.head_dim <= max_k && kv.v_head_dim <= max_v;
}

template <int kD, int kKeys>
void CudaDevice::LaunchAttentionMma(AttnArgs a, DType cache, const StepBatch& b) {
  const dim3 grid = TileGrid(&a, b, kMmaRows);
  if (cache == DType::kQ8_0) {
    Launch(AttentionMmaKernel<KvQ8, kD, kKeys>, grid, kAttnWarps * kWarp, launch_, a);
  } else {
    Launch(AttentionMmaKernel<uint16_t, kD, kKeys>, grid, kAttnWarps * kWarp, launch_, a);
  }
  Note(cudaGetLastError());
}

template <int kDk, int kDv, int kSplit, bool kLatent>
void CudaDevice::LaunchAttentionMmaWide(AttnArgs a, DType cache, const StepBatch& b) {
  const dim3 grid = TileGrid(&a, b, AttnMmaWide<kDk, kDv, kSplit, kLatent, false>::kRows);
  if (cache == DType::kQ8_0) {
    Launch(AttentionMmaWideKernel<KvQ8, kDk, kDv, kSplit, kLatent>, grid, kWideWarps * kWarp,
           launch_, a);
  } else {
    Launch(AttentionMmaWideKernel<uint16_t, kDk, kDv, kSplit, kLatent>, grid, kWideWarps * kWarp,
           launch_, a);
  }
  Note(cudaGetLastError());
}

template <int kDk, int kDv, int kRows, int kKeys, bool kLatent>
void CudaDevice::LaunchAttentionTiles(AttnArgs a, DType cache, const StepBatch& b) {
  const dim3 grid = TileGrid(&a, b, kRows);
  if (cache == DType::kQ8_0) {
    Launch(AttentionTileKernel<KvQ8, kDk, kDv, kRows, kKeys, kLatent>, grid, kAttnWarps * kWarp,
           launch_, a);
  } else if (cache == DType::kF16) {
    Launch(AttentionTileKernel<uint16_t, kDk, kDv, kRows, kKeys, kLatent>, grid,
           kAttnWarps * kWarp, launch_, a);
  } else {
    Launch(AttentionTileKernel<float, kDk, kDv, kRows, kKeys, kLatent>, grid, kAttnWarps * kWarp,
           launch_, a);
  }
  Note(cudaGetLastError());
}

AttnArgs CudaDevice::Args(const float* q, float* out, const kernels::KvLayerView& kv,
                          const StepBatch& b) {
  AttnArgs a{};
  a.q = q;
  a.out = out;
  a.k = kv.k;
  a.v = kv.v;
  a.pos = b.d_pos;
  a.seq_of_token = b.d_seq_of_token;
  a.table_offset = b.d_table_offset;
  a.tables = b.d_tables;
  a.n_kv_heads = kv.n_kv_heads;
  a.head_dim = kv.head_dim;
  a.v_head_dim = kv.v_head_dim;
  a.block_size = kv.block_size;
  if (kv.dtype == DType::kQ8_0) {
    a.rot_k = kernels::RotationBlock(kv.head_dim);
    a.rot_v = kernels::RotationBlock(kv.v_head_dim);
  }
  return a;
}

}  // namespace
}  // namespace peng::backend::cuda
