// The CUDA backend's kernels of multi-head latent attention's products with kv_b (included by
// cuda_device.cu after kernels.cuh, whose GEMV pieces they use) and their launcher.
#pragma once

#include <cstdint>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/kernels.cuh"

namespace peng::backend::cuda {
namespace {

// MLA's products with kv_b (Device::MlaWeights): per (token, head), W_UK^T q_nope (the absorbed
// query) and W_UV o_lat (the output). A token that is its sequence's only one in the step (a
// decode) multiplies the per-head matrices stored in the file (k_b[h] [r, d_nope], v_b[h]
// [d_v, r]) where there are, in their stored type -- the block formats over its input row
// quantized as the CPU quantizes it (kQ), else FP32 --; any other token the FP32 copy kvb
// [H][d_nope + d_v][r].

constexpr int kMaxMlaIn = 512;  // the stored products' input rows: d_nope, kv_lora_rank

// RopeKvKernel's work for MLA inside the absorption (MlaArgs::rope; kv null: none): every
// head's q_pe rotated as it is copied into the absorbed query, and by head 0 of each token the
// cache row [c | k_pe] -- the latent c of the token's kv row RMSNorm'ed, its k_pe rotated --
// stored into the token's slot, with RopeKvKernel's arithmetic.
struct MlaRopeKv {
  const float* kv = nullptr;  // the tokens' rows [c | k_pe], `row` apart
  const float* norm_w = nullptr;
  float eps = 0.f;
  void* cache = nullptr;
  DType cache_type = DType::kF32;  // F32, F16 or Q8_0 (the row rotated in runs of rot_q8)
  int rot_q8 = 0;
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;
  RopeRotation rot;  // (rot_dim <= d_rope)
};

struct MlaArgs {
  const float* kvb = nullptr;
  const uint8_t* const* heads = nullptr;  // k_b or v_b: a device pointer a head; null: none
  size_t row_bytes = 0;
  const int32_t* seq_of_token = nullptr;
  int64_t n_tokens = 0;
  int H = 0, r = 0, dn = 0, dr = 0, dv = 0;
  MlaRopeKv rope;  // (the absorption)
  // The FP32 copy's products are in out already (CudaDevice::MlaGemm): the blocks of tokens
  // that take it do only q_pe's part (the absorption's blocks y = 0).
  bool gemm_done = false;
  // Whether token t takes the stored matrices: they exist and t is its sequence's only token
  // (the tokens of a sequence are consecutive).
  __device__ bool Stored(int64_t t) const {
    if (!heads) return false;
    const int32_t s = seq_of_token[t];
    return (t == 0 || seq_of_token[t - 1] != s) && (t + 1 == n_tokens || seq_of_token[t + 1] != s);
  }
};

// One (token, head)'s input row of n <= kMaxMlaIn values in shared memory as a product takes
// it: quantized (a QAct of one row: qs, d, s) or FP32 (x).
struct HeadRow {
  alignas(16) int8_t qs[kMaxMlaIn];
  float d[kMaxMlaIn / 32];
  alignas(8) int32_t s[kMaxMlaIn / 16];
  float x[kMaxMlaIn];
};

// x[0..n) into `in`, by all 256 threads of the block (QuantizeValue's contract; n a multiple
// of T's activation block when kQ).
template <DType T, bool kQ>
__device__ void LoadHeadRow(const float* x, int n, HeadRow* in, float* warp_max) {
  for (int c = 0; c < n; c += 256) {
    const int i = c + static_cast<int>(threadIdx.x);
    const bool valid = i < n;
    const float v = valid ? x[i] : 0.f;
    if constexpr (kQ) {
      QuantizeValue<layout::kActBlock<T>>(v, valid, 0, i, n, QActOut{in->qs, in->d, in->s, false},
                                          warp_max);
    } else if (valid) {
      in->x[i] = v;
    }
  }
  __syncthreads();
}

// Rows r0 + 4 w .. r0 + 4 w + 3 (of `rows`) of matrix m (rows of row_bytes, type T) times the
// block's input row of n values, for warp w: lane l returns the dot product of row
// r0 + 4 w + l / 8 (0 past the last row). Quantized: each row's units split over 8 lanes;
// FP32: a row at a time over the warp (WarpRowDot).
template <DType T, bool kQ>
__device__ float HeadRowsDot(const uint8_t* m, size_t row_bytes, int64_t rows, int64_t r0,
                             const HeadRow& in, int n, int warp, int lane) {
  const int64_t first = r0 + 4 * warp;
  if constexpr (kQ) {
    const int64_t r = first + lane / 8;
    float acc = 0.f;
    if (r < rows)
      WarpRowQDot<T, 1>(m + r * row_bytes, QAct{in.qs, in.d, in.s, n}, 0, 1, lane % 8, 8, &acc);
    return WarpButterfly<4>(acc, AddOp{});  // (over each 8 lanes)
  } else {
    float mine = 0.f;
    const float* xs[1] = {in.x};
    for (int k = 0; k < 4; ++k) {
      float acc = 0.f;
      if (first + k < rows) WarpRowDot<T, 1>(m + (first + k) * row_bytes, n, xs, 1, lane, &acc);
      acc = WarpSum(acc);
      if (lane / 8 == k) mine = acc;
    }
    return mine;
  }
}

// MlaRopeKv's work for block (t H + h, 0) of MlaAbsorbKernel: q_pe rotated into o_pe, and for
// h = 0 the cache row.
__device__ void MlaRopeKvInside(const MlaArgs& a, int64_t t, int h, const float* q_pe,
                                float* o_pe) {
  __shared__ float cs[2][kMaxRopeHalf];
  __shared__ float shared[32];
  const MlaRopeKv& m = a.rope;
  const int dr = a.dr, half = m.rot.half;
  const bool interleaved = m.rot.interleaved;
  RopeAngles(m.pos[t], m.rot, cs);
  for (int k = threadIdx.x; k < dr; k += blockDim.x) o_pe[k] = q_pe[k];
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    RotatePair(o_pe, i, half, interleaved, cs[0][i], cs[1][i]);
  if (h != 0) return;
  const int64_t row = a.r + dr, slot = m.slot[t];
  const float* kv = m.kv + t * row;
  const float s = RmsScale(kv, a.r, m.eps, shared);
  __shared__ float k_pe[kMaxRopeHalf * 2];
  for (int k = threadIdx.x; k < dr; k += blockDim.x) k_pe[k] = kv[a.r + k];
  __syncthreads();
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    RotatePair(k_pe, i, half, interleaved, cs[0][i], cs[1][i]);
  __syncthreads();
  if (m.cache_type == DType::kQ8_0) {  // (the row rotated and quantized: RopeKvKernel's)
    __shared__ float row_s[kMaxMlaRow];
    for (int64_t i = threadIdx.x; i < row; i += blockDim.x)
      row_s[i] = i < a.r ? (kv[i] * s) * m.norm_w[i] : k_pe[i - a.r];
    StoreQ8Row(row_s, static_cast<int>(row), m.rot_q8,
               KvAt(static_cast<KvQ8*>(m.cache), slot * row));
    return;
  }
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    const float v = i < a.r ? (kv[i] * s) * m.norm_w[i] : k_pe[i - a.r];
    if (m.cache_type == DType::kF16) {
      KvStore(static_cast<uint16_t*>(m.cache), slot * row + i, v);
    } else {
      KvStore(static_cast<float*>(m.cache), slot * row + i, v);
    }
  }
}

// q [T, H, dn + dr] -> out [T, H, r + dr] = (W_UK^T q_nope | q_pe). Block (t H + h, y) computes
// values j = 32 y .. 32 y + 31 of the head's r: stored, rows j of k_b[h]; from the FP32 copy,
// lane j's column of W_UK[h], the kRowsPerBlock warps splitting the sum over i.
template <DType T, bool kQ>
__global__ void MlaAbsorbKernel(const float* q, MlaArgs a, float* out) {
  KernelStart();
  __shared__ float part[kRowsPerBlock][kWarp];
  __shared__ HeadRow in;
  __shared__ float warp_max[8];
  const int64_t th = blockIdx.x;  // token * H + head
  const int h = static_cast<int>(th % a.H);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int r = a.r, dn = a.dn, dr = a.dr;
  const float* qh = q + th * (dn + dr);
  float* o = out + th * (r + dr);
  if (blockIdx.y == 0) {
    if (a.rope.kv) {
      MlaRopeKvInside(a, th / a.H, h, qh + dn, o + r);
    } else {
      for (int k = threadIdx.x; k < dr; k += blockDim.x) o[r + k] = qh[dn + k];
    }
  }
  if (a.Stored(th / a.H)) {
    LoadHeadRow<T, kQ>(qh, dn, &in, warp_max);
    const int64_t r0 = int64_t{blockIdx.y} * kWarp;
    const float s = HeadRowsDot<T, kQ>(a.heads[h], a.row_bytes, r, r0, in, dn, warp, lane);
    const int64_t j = r0 + 4 * warp + lane / 8;
    if (lane % 8 == 0 && j < r) o[j] = s;
    return;
  }
  if (a.gemm_done) return;
  const int j = blockIdx.y * kWarp + lane;
  const float* w = a.kvb + int64_t{h} * (dn + a.dv) * r;
  float s = 0.f;
  if (j < r) {
#pragma unroll 4
    for (int i = warp; i < dn; i += kRowsPerBlock) s += w[int64_t{i} * r + j] * qh[i];
  }
  part[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && j < r) {
    float sum = 0.f;
    for (int k = 0; k < kRowsPerBlock; ++k) sum += part[k][lane];
    o[j] = sum;
  }
}

// o_lat [T, H, r] -> out [T, H * dv] (W_UV[h] o_lat[t, h]): block (t H + h, y) computes outputs
// 32 y .. 32 y + 31 of the head (HeadRowsDot over v_b[h] or the FP32 copy's W_UV[h] rows) and,
// where q.qs is set (dv % 32 == 0), quantizes them in blocks of 32 into q as they are stored.
template <DType T, bool kQ>
__global__ void MlaProjectKernel(const float* o_lat, MlaArgs a, float* out, QActOut q) {
  KernelStart();
  __shared__ HeadRow in;
  __shared__ float warp_max[8];
  __shared__ float s_out[kWarp];
  const int64_t th = blockIdx.x, t = th / a.H;
  const int h = static_cast<int>(th % a.H);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int r = a.r, dv = a.dv;
  const float* ol = o_lat + th * r;
  const int64_t r0 = int64_t{blockIdx.y} * kWarp;
  const bool stored = a.Stored(t);
  if (a.gemm_done && !stored) return;
  float s;
  if (stored) {
    LoadHeadRow<T, kQ>(ol, r, &in, warp_max);
    s = HeadRowsDot<T, kQ>(a.heads[h], a.row_bytes, dv, r0, in, r, warp, lane);
  } else {
    LoadHeadRow<DType::kF32, false>(ol, r, &in, warp_max);
    const float* w = a.kvb + (int64_t{h} * (a.dn + dv) + a.dn) * r;
    s = HeadRowsDot<DType::kF32, false>(reinterpret_cast<const uint8_t*>(w), r * sizeof(float),
                                        dv, r0, in, r, warp, lane);
  }
  const int64_t i = r0 + 4 * warp + lane / 8;  // lane's output, of the head's dv
  const int64_t row = t * a.H * dv;             // the token's output row
  if (!q.qs) {
    if (lane % 8 == 0 && i < dv) out[row + int64_t{h} * dv + i] = s;
    return;
  }
  if (lane % 8 == 0) s_out[4 * warp + lane / 8] = s;
  __syncthreads();
  if (warp != 0) return;
  const int64_t c = int64_t{h} * dv + r0 + lane;  // in the token's row
  out[row + c] = s_out[lane];
  QuantizeValue<32>(s_out[lane], true, t, c, int64_t{a.H} * dv, q, nullptr);
}

// MLA's product with kv_b: the absorbed query (absorb) or the output projection, out quantized
// into q where q.qs is set. The kernel is instantiated for the stored per-head matrices' type
// (k_b or v_b) and, for the block formats, whether their input row is quantized (`quantize`:
// unless exact mode or PENG_CUDA_QGEMV=0; in shared memory, so at any T). Without per-head
// matrices, or with rows past kMaxMlaIn, every token takes the FP32 copy. gemm_done: the FP32
// copy's products are done (MlaArgs::gemm_done); the launch covers only q_pe's part where no
// token takes the stored matrices -- or nothing, for the projection.
void LaunchMla(LaunchStream ls, bool quantize, bool absorb, const float* x, const StepBatch& b,
               const MlaWeights& w, const kernels::MlaParams& p, float* out, const QActOut& q,
               const MlaRopeKv& rope = {}, bool gemm_done = false) {
  const int64_t T = b.n_tokens;
  if (T == 0) return;
  const DeviceExperts& heads = absorb ? w.k_b : w.v_b;
  const int64_t n = absorb ? p.d_nope : p.kv_lora_rank;  // the input row of a head
  MlaArgs a;
  a.kvb = w.kvb;
  a.seq_of_token = b.d_seq_of_token;
  a.n_tokens = T;
  a.H = p.n_heads;
  a.r = p.kv_lora_rank;
  a.dn = p.d_nope;
  a.dr = p.d_rope;
  a.dv = p.d_v;
  a.rope = rope;
  a.gemm_done = gemm_done;
  const bool stored = heads.rows > 0 && n <= kMaxMlaIn && p.kv_lora_rank <= kMaxMlaIn &&
                      heads.dtype != DType::kI8;
  if (stored) {
    a.heads = heads.data;
    a.row_bytes = heads.row_bytes;
  }
  bool decode_token = !b.seq_n_tokens;  // (Stored's tokens: unknown here without the counts)
  for (int64_t s = 0; b.seq_n_tokens && s < b.n_seqs; ++s) decode_token |= b.seq_n_tokens[s] == 1;
  const bool all_done = gemm_done && !(stored && decode_token);
  if (all_done && !absorb) return;
  const dim3 grid(T * p.n_heads, all_done ? 1 : Blocks(absorb ? p.kv_lora_rank : p.d_v, kWarp));
  auto launch = [&]<DType D, bool Q>() {
    if (absorb) {
      Launch(MlaAbsorbKernel<D, Q>, grid, kRowsPerBlock * kWarp, ls, x, a, out);
    } else {
      Launch(MlaProjectKernel<D, Q>, grid, kRowsPerBlock * kWarp, ls, x, a, out, q);
    }
  };
  if (!stored) {
    launch.template operator()<DType::kF32, false>();
    return;
  }
  WithType(heads.dtype, [&]<DType D>() {
    if constexpr (layout::kQuantized<D>) {
      if (quantize) {
        launch.template operator()<D, true>();
        return;
      }
    }
    if constexpr (D != DType::kI8) launch.template operator()<D, false>();
  });
}

}  // namespace
}  // namespace peng::backend::cuda
