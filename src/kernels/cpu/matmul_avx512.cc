// AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels for the 32-value block types and float weights,
// the activation quantizer, and the entry points of all AVX-512 matmul kernels (the K-quants'
// are in matmul_kquant_avx512.cc). Integer dot products use vpdpbusd (u8 weights x s8
// activations); a weight offset (Q4_0: 8, Q5_0: 16, Q8_0: 128 after flipping its sign bit) is
// removed exactly by starting the int32 dots at -offset * sum(a) (OffsetStart). The 32-value
// block types run in 16-row panels (one lane per row, the two blocks of a step transposed across
// rows; see PanelGemv / PackPanel); float types compute R x T register tiles (R weight rows x T
// tokens: every weight vector loaded once per tile and reused for T tokens).
#include "kernels/cpu/avx512.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/fold_avx512.h"
#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels {
namespace {

// Two 16-byte nibble arrays -> 64 u8 values in block order [b0 lo, b0 hi, b1 lo, b1 hi].
inline __m512i Nibbles2(const uint8_t* q0, const uint8_t* q1) {
  const __m256i x = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(q1)), 1);
  const __m512i z = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                             _mm512_castsi256_si512(x));
  const __m512i s = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(s, _mm512_set1_epi8(0x0F));
}
// Q5 high bits: bit j of a block's 32-bit qh is bit 4 of its value j. Each half of the vector
// gets its block's qh in every dword; vpshufb puts qh byte j / 8 at byte j and a test against
// 1 << (j % 8) gives the mask (all in vector registers: no mask moves from general registers).
inline __m512i AddHighBit(__m512i q, const uint8_t* qh0, const uint8_t* qh1) {
  alignas(64) static constexpr uint8_t kIdx[64] = {
      0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
      0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  alignas(64) static constexpr uint8_t kBit[64] = {
      1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
      1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
      1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const __m512i h = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(Load32(qh0)))),
      _mm256_set1_epi32(static_cast<int>(Load32(qh1))), 1);
  const __mmask64 m = _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, _mm512_load_si512(kIdx)),
                                           _mm512_load_si512(kBit));
  return _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16));
}

// ---- 32-value block types: decode two blocks at once.
struct KQ4_0 {
  using B = BlockQ4_0;
  static constexpr int kOff = 8;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) { return Nibbles2(a->qs, b->qs); }
};
struct KQ4_1 {
  using B = BlockQ4_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true;
  static __m512i Q(const B* a, const B* b) { return Nibbles2(a->qs, b->qs); }
};
struct KQ5_0 {
  using B = BlockQ5_0;
  static constexpr int kOff = 16;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) {
    return AddHighBit(Nibbles2(a->qs, b->qs), a->qh, b->qh);
  }
};
struct KQ5_1 {
  using B = BlockQ5_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true;
  static __m512i Q(const B* a, const B* b) {
    return AddHighBit(Nibbles2(a->qs, b->qs), a->qh, b->qh);
  }
};
struct KQ8_0 {
  using B = BlockQ8_0;
  static constexpr int kOff = 128;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) {
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// 32-value block types go through 16-row panels. The two blocks a K::Q step decodes for each
// of 16 rows are transposed in registers into "panel vectors": vector j holds the 4 bytes
// 4j..4j+3 of every row (j < 8: the first block, j >= 8: the second), so one vpdpbusd with the
// token's 4 activation bytes broadcast advances 16 rows' dot products, and each block's exact
// int32 dot is scaled once for all 16 rows: dot - off * sum(a) -> float, times d_w * d_a, FMA
// into the row's accumulator (Q4_1/Q5_1: + m_w * d_a * sum(a)). Matrices packed at load time
// (Packed, below: the models' case) serve GEMV and GEMM from the same panels. Without them a
// GEMV keeps the row-major layout (one vpdpbusd per row and block pair) and reduces the partial
// dots across the 16 rows with integer adds (ReduceBlockPairs), and a GEMM packs a panel's
// transposed vectors and scales once into a per-thread buffer and reuses them for every token.
// All do the same operations per (row, block) in the same order, so a token's results do not
// depend on the batch or the layout (EveryIsaIsBatchInvariant, PackedPanelsGiveTheRowMajorResults).

// In-place transpose of 16 x 16 dwords: v[i] dword j -> v[j] dword i.
inline void Transpose16(__m512i v[16]) {
  __m512i u[16];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      u[4 * g + 2 * p] = _mm512_unpacklo_epi32(v[4 * g + 2 * p], v[4 * g + 2 * p + 1]);
      u[4 * g + 2 * p + 1] = _mm512_unpackhi_epi32(v[4 * g + 2 * p], v[4 * g + 2 * p + 1]);
    }
  }
  __m512i w[4][4];  // w[g][c]: lane L = rows 4g..4g+3 of dword column 4L + c
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    w[g][0] = _mm512_unpacklo_epi64(u[4 * g], u[4 * g + 2]);
    w[g][1] = _mm512_unpackhi_epi64(u[4 * g], u[4 * g + 2]);
    w[g][2] = _mm512_unpacklo_epi64(u[4 * g + 1], u[4 * g + 3]);
    w[g][3] = _mm512_unpackhi_epi64(u[4 * g + 1], u[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_shuffle_i32x4(w[0][c], w[1][c], 0x44);
    const __m512i b = _mm512_shuffle_i32x4(w[0][c], w[1][c], 0xEE);
    const __m512i e = _mm512_shuffle_i32x4(w[2][c], w[3][c], 0x44);
    const __m512i f = _mm512_shuffle_i32x4(w[2][c], w[3][c], 0xEE);
    v[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    v[8 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
}

// The first 4 bytes of block bb of the 16 rows (d, and m for Q4_1/Q5_1, as fp16 pairs): scalar
// loads through a stack array measured faster than vpgatherdd here (AMD Zen 5).
template <class B>
inline __m512i LoadHeads(const B* const w[16], int64_t bb) {
  alignas(64) uint32_t head[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) head[i] = Load32(w[i] + bb);
  return _mm512_load_si512(head);
}

// Activations of one token: its int8 values, block scales and 16-value sums.
struct TokenActs {
  const int8_t* q;  // read 4 bytes at a time with Load32 (no int32 aliasing of int8 data)
  const float* d;
  const int32_t* neg_sum;  // -(sum of the block's values), d * that sum (ActRows)
  const float* dsum;
};
inline TokenActs Acts(const MatMulArgs& g, int64_t t) {
  const int64_t f = t * g.a.d_stride;
  return {g.a.qs + t * g.a.qs_stride, g.a.d + f, g.a.neg_sum + f, g.a.dsum + f};
}

// Where a block's int32 dots start: -kOff * sum(a) in every lane (kOff is a power of two: one
// broadcast from memory and a shift), so the dots come out with the weight offset removed,
// exactly, on the integer pipes instead of as a float FMA per token and block.
template <class K>
inline __m512i OffsetStart(const TokenActs& a, int64_t bb) {
  if constexpr (K::kOff == 0) {
    return _mm512_setzero_si512();
  } else {
    static_assert(std::has_single_bit(static_cast<unsigned>(K::kOff)));
    constexpr int kShift = std::countr_zero(static_cast<unsigned>(K::kOff));
    return _mm512_slli_epi32(_mm512_set1_epi32(a.neg_sum[bb]), kShift);
  }
}

// acc += the 16 rows' value of block bb for one token, given the block's int32 dots with the
// weight offset already removed (OffsetStart). Every per-token factor is a broadcast from
// memory (no scalar arithmetic, no register broadcast).
template <class K>
inline __m512 ScaleBlock(__m512i dot, __m512 dw, __m512 mw, const TokenActs& a, int64_t bb,
                         __m512 acc) {
  const __m512 fdot = _mm512_cvtepi32_ps(dot);
  acc = _mm512_fmadd_ps(fdot, _mm512_mul_ps(dw, _mm512_set1_ps(a.d[bb])), acc);
  if constexpr (K::kMin) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.dsum[bb]), acc);
  return acc;
}

template <class K>
inline void HeadScales(__m512i head, __m512* dw, __m512* mw) {
  *dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
  if constexpr (K::kMin) *mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
}

// Row pointers of the panel at row r (rows past r_end repeat the last row; their results are
// not stored).
template <class K>
inline void PanelRows(const MatMulArgs& g, int64_t r, int64_t r_end, const typename K::B* w[16]) {
  for (int i = 0; i < 16; ++i)
    w[i] = reinterpret_cast<const typename K::B*>(
        g.w + std::min<int64_t>(r + i, r_end - 1) * g.row_bytes);
}

// Sums of dwords 0-7 (first block) and 8-15 (second block) of z(i), i = 0..15, as lane i of
// *d0 / *d1 (integer adds: exact, whatever the order). z(i) is produced as the tree consumes it,
// so only a few vectors are live (fully unrolled: the arrays stay in registers).
template <class Z>
inline void ReduceBlockPairs(Z&& z, __m512i* d0, __m512i* d1) {
  __m512i t[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    __m512i s[2];
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {  // lane L: [a0, b0, a1, b1], a = row 4q + 2p, b = the next
      const __m512i za = z(4 * q + 2 * p), zb = z(4 * q + 2 * p + 1);
      s[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(za, zb), _mm512_unpackhi_epi32(za, zb));
    }
    // lane L: rows 4q..4q+3, each the sum of its dwords 4L..4L+3
    t[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[0], s[1]), _mm512_unpackhi_epi64(s[0], s[1]));
  }
  // [rows 0-3 first, rows 0-3 second, rows 4-7 first, rows 4-7 second] and rows 8-15 alike.
  const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[0], t[1], 0x88),
                                       _mm512_shuffle_i32x4(t[0], t[1], 0xDD));
  const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(t[2], t[3], 0x88),
                                       _mm512_shuffle_i32x4(t[2], t[3], 0xDD));
  *d0 = _mm512_shuffle_i32x4(w01, w23, 0x88);
  *d1 = _mm512_shuffle_i32x4(w01, w23, 0xDD);
}

// One token, rows [r, min(r + 16, r_end)): each row's two blocks against the token's 64
// activation bytes (one vpdpbusd), then the 16 rows' block dots gathered into one vector per
// block (ReduceBlockPairs) and scaled like a GEMM panel.
template <class K>
void PanelGemv(const MatMulArgs& g, int64_t r, int64_t r_end) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[16];
  PanelRows<K>(g, r, r_end, w);
  const int64_t ahead = PrefetchAhead(16 * static_cast<int64_t>(g.row_bytes));
  const TokenActs a = Acts(g, 0);
  const int8_t* aq = g.a.qs;
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc = _mm512_setzero_ps(), mw = _mm512_setzero_ps(), dw;
  for (int64_t b = 0; b < nb; b += 2) {
    const bool pair = b + 1 < nb;
    const int64_t b1 = pair ? b + 1 : b;
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) PrefetchStream<2 * sizeof(B)>(w[i] + b, ahead);
    const __m512i act = pair ? _mm512_loadu_si512(aq + b * kQK)
                             : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, aq + b * kQK);
    __m512i dot[2];
    ReduceBlockPairs(
        [&](int i) { return _mm512_dpbusd_epi32(zero, K::Q(w[i] + b, w[i] + b1), act); },
        &dot[0], &dot[1]);
    for (int h = 0; h < (pair ? 2 : 1); ++h) {
      HeadScales<K>(LoadHeads(w, b + h), &dw, &mw);
      acc = ScaleBlock<K>(_mm512_add_epi32(dot[h], OffsetStart<K>(a, b + h)), dw, mw, a, b + h,
                          acc);
    }
  }
  StoreRows(g.y + r, acc, static_cast<int>(r_end - r));
}

// A panel packed for a GEMM: per block 8 panel vectors, then d_w (and m_w) of the 16 rows.
template <class K>
constexpr int64_t PackedBlockVectors() {
  return 8 + 1 + (K::kMin ? 1 : 0);
}

template <class K>
void PackPanel(const MatMulArgs& g, int64_t r, int64_t r_end, __m512i* pack) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  constexpr int64_t kV = PackedBlockVectors<K>();
  const B* w[16];
  PanelRows<K>(g, r, r_end, w);
  for (int64_t b = 0; b < nb; b += 2) {
    const int64_t b1 = b + 1 < nb ? b + 1 : b;
    __m512i v[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) v[i] = K::Q(w[i] + b, w[i] + b1);
    Transpose16(v);
    for (int h = 0; h < (b1 > b ? 2 : 1); ++h) {
      __m512i* p = pack + (b + h) * kV;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) _mm512_store_si512(p + j, v[8 * h + j]);
      __m512 dw, mw;
      HeadScales<K>(LoadHeads(w, b + h), &dw, &mw);
      _mm512_store_ps(reinterpret_cast<float*>(p + 8), dw);
      if constexpr (K::kMin) _mm512_store_ps(reinterpret_cast<float*>(p + 9), mw);
    }
  }
}

// The block sources of a panel tile: per block bb, the 8 panel vectors (vector j: values
// 4j..4j+3 of the 16 rows, u8) and the rows' d_w (and m_w).
// CallPacked: PackPanel's per-call buffer (vectors unpacked, scales as floats).
template <class K>
struct CallPacked {
  const __m512i* pack;
  void Block(int64_t bb, __m512i v[8], __m512* dw, __m512* mw) const {
    const __m512i* p = pack + bb * PackedBlockVectors<K>();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) v[j] = _mm512_load_si512(p + j);
    *dw = _mm512_load_ps(reinterpret_cast<const float*>(p + 8));
    if constexpr (K::kMin) *mw = _mm512_load_ps(reinterpret_cast<const float*>(p + 9));
  }
};

// T tokens from t0 against the panel of rows [r, r_end) that `src` delivers block by block.
template <class K, int T, class Src>
void PanelTile(const MatMulArgs& g, const Src& src, int64_t r, int64_t r_end, int64_t t0) {
  const int64_t nb = g.cols / kQK;
  TokenActs a[T];
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    a[t] = Acts(g, t0 + t);
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t bb = 0; bb < nb; ++bb) {
    __m512i v[8];
    __m512 dw, mw = _mm512_setzero_ps();
    src.Block(bb, v, &dw, &mw);
    // Two accumulators a token (even / odd vectors): the dependent vpdpbusd chain of a block is
    // 4 long instead of 8, so consecutive blocks overlap.
    __m512i dot[2][T];
    for (int t = 0; t < T; ++t) {
      dot[0][t] = OffsetStart<K>(a[t], bb);
      dot[1][t] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < T; ++t)
        dot[j & 1][t] = _mm512_dpbusd_epi32(
            dot[j & 1][t], v[j],
            _mm512_set1_epi32(static_cast<int>(Load32(a[t].q + 32 * bb + 4 * j))));
    for (int t = 0; t < T; ++t)
      acc[t] = ScaleBlock<K>(_mm512_add_epi32(dot[0][t], dot[1][t]), dw, mw, a[t], bb, acc[t]);
  }
  for (int t = 0; t < T; ++t) StoreRows(g.y + (t0 + t) * g.ldy + r, acc[t], static_cast<int>(r_end - r));
}

// Every token of the call against one panel.
template <class K, class Src>
void PanelTokens(const MatMulArgs& g, const Src& src, int64_t r, int64_t r_end) {
  // Tiles of 6 tokens (each block's decoded vectors serve 6 tokens: 4-10% faster than 4 a
  // tile at 128 tokens, peng_micro_bench); a remainder of 7 or 8 goes as 4 + 3 / 4 + 4 rather
  // than 6 + 1 / 6 + 2. The tile size does not change any token's arithmetic.
  const int64_t n = g.n_tokens;
  int64_t n6 = n / 6;
  if (n6 > 0 && n % 6 != 0 && n % 6 < 3) --n6;
  int64_t t = 0;
  for (; t < 6 * n6; t += 6) PanelTile<K, 6>(g, src, r, r_end, t);
  for (; n - t > 5; t += 4) PanelTile<K, 4>(g, src, r, r_end, t);
  switch (n - t) {
    case 5: PanelTile<K, 5>(g, src, r, r_end, t); break;
    case 4: PanelTile<K, 4>(g, src, r, r_end, t); break;
    case 3: PanelTile<K, 3>(g, src, r, r_end, t); break;
    case 2: PanelTile<K, 2>(g, src, r, r_end, t); break;
    case 1: PanelTile<K, 1>(g, src, r, r_end, t); break;
    default: break;
  }
}

// The per-thread panel buffer, grown as needed.
__m512i* PanelBuffer(size_t vectors) {
  struct Buf {
    __m512i* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf buf;
  if (vectors > buf.n) {
    std::free(buf.p);
    buf.p = static_cast<__m512i*>(std::aligned_alloc(64, vectors * sizeof(__m512i)));
    buf.n = buf.p ? vectors : 0;
  }
  return buf.p;
}

// ---- Panels packed at load time (PackPanels): per 16-row panel and block, the block's quants
// as panel vectors in their stored width -- Q4_0 / Q4_1: 4 vectors, vector k = bytes 4k..4k+3 of
// qs of every row (low nibbles: values 4k..4k+3, high nibbles: values 16 + 4k..), Q8_0: 8
// vectors of values 4j..4j+3 with the sign bit flipped -- then, for Q5_0 / Q5_1, each row's 32
// high bits as one dword, rearranged (HighBitsForPanel: bit K of byte j is the high bit of
// value 4K + j, the value at byte j of decoded vector K), then the 16 rows' fp16 d (and m).
// Exactly the bytes of the 16 rows, rearranged, so a panel streams like the rows it replaces;
// a block decodes with two ops per nibble vector (Q5: two more, a shift of the high-bit dwords
// and a vpternlogd that puts bit K of every byte at bit 4) instead of a per-row reduction
// (ReduceBlockPairs), and the same ScaleBlock in the same order gives the same results.
template <class K>
struct Packed {
  static constexpr bool kHigh = std::is_same_v<K, KQ5_0> || std::is_same_v<K, KQ5_1>;
  static constexpr int kQuantVectors = std::is_same_v<K, KQ8_0> ? 8 : 4;
  static constexpr int64_t kScales = 64 * kQuantVectors + (kHigh ? 64 : 0);  // offset
  static constexpr int64_t kBlockBytes = kScales + 32 * (K::kMin ? 2 : 1);
  const uint8_t* panel;
  int64_t ahead;  // software prefetch distance (bytes); 0: none (one token: Kernel32)
  void Block(int64_t bb, __m512i v[8], __m512* dw, __m512* mw) const {
    const uint8_t* p = panel + bb * kBlockBytes;
    if (ahead) PrefetchStream<kBlockBytes>(p, ahead);
    if constexpr (kQuantVectors == 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) v[j] = _mm512_loadu_si512(p + 64 * j);
    } else {
      const __m512i m4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i q = _mm512_loadu_si512(p + 64 * k);
        v[k] = _mm512_and_si512(q, m4);
        v[4 + k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      }
      if constexpr (kHigh) {
        const __m512i h = _mm512_loadu_si512(p + 64 * kQuantVectors);
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        // (high bits moved so bit K of each byte is at bit 4) & 0x10 | v[K]: ternary 0xEA.
        v[0] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 4), bit4, v[0], 0xEA);
        v[1] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 3), bit4, v[1], 0xEA);
        v[2] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 2), bit4, v[2], 0xEA);
        v[3] = _mm512_ternarylogic_epi32(_mm512_slli_epi32(h, 1), bit4, v[3], 0xEA);
        v[4] = _mm512_ternarylogic_epi32(h, bit4, v[4], 0xEA);
        v[5] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(h, 1), bit4, v[5], 0xEA);
        v[6] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(h, 2), bit4, v[6], 0xEA);
        v[7] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(h, 3), bit4, v[7], 0xEA);
      }
    }
    const uint8_t* scales = p + kScales;
    *dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    if constexpr (K::kMin)
      *mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)));
  }
};

// A Q5 block's 32 high bits (bit v: value v) as Packed keeps them: bit K of byte j = bit
// 4K + j, the high bit of the value that byte j of decoded panel vector K holds.
inline uint32_t HighBitsForPanel(uint32_t qh) {
  uint32_t out = 0;
  for (int j = 0; j < 4; ++j)
    for (int k = 0; k < 8; ++k) out |= ((qh >> (4 * k + j)) & 1u) << (8 * j + k);
  return out;
}

template <class K>
void PackPanelsOf(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  using B = typename K::B;
  using P = Packed<K>;
  const int64_t nb = cols / kQK;
  for (int64_t r = 0; r < rows; r += 16) {
    for (int64_t b = 0; b < nb; ++b, out += P::kBlockBytes) {
      for (int i = 0; i < 16; ++i) {
        const B* blk = reinterpret_cast<const B*>(w + std::min(r + i, rows - 1) * row_bytes) + b;
        for (int j = 0; j < P::kQuantVectors; ++j) {
          uint8_t* dst = out + 64 * j + 4 * i;
          std::memcpy(dst, blk->qs + 4 * j, 4);
          if constexpr (P::kQuantVectors == 8)
            for (int c = 0; c < 4; ++c) dst[c] ^= 0x80;
        }
        if constexpr (P::kHigh) {
          const uint32_t h = HighBitsForPanel(Load32(blk->qh));
          std::memcpy(out + 64 * P::kQuantVectors + 4 * i, &h, 4);
        }
        uint8_t* scales = out + P::kScales;
        std::memcpy(scales + 2 * i, &blk->d, 2);
        if constexpr (K::kMin) std::memcpy(scales + 32 + 2 * i, &blk->m, 2);
      }
    }
  }
}

template <class K>
void Kernel32(const MatMulArgs& g, int64_t r0, int64_t r1) {
  {
    if (g.panels && r0 % 16 == 0) {  // packed at load time
      // A thread's panels are one contiguous stream. For one token (a GEMV, bound by reading
      // it) the hardware prefetchers follow it best alone: with software prefetch on top the
      // dense models decoded 5-20% further below the bandwidth bound and V2-Lite's MoE decode
      // ran 26-33% slower. Several tokens keep it (2-8 tokens mixed, 32 faster with it;
      // docs/benchmarks.md, 2026-12-04).
      const int64_t ahead = g.n_tokens > 1 ? PrefetchAhead(Packed<K>::kBlockBytes) : 0;
      for (int64_t r = r0; r < r1; r += 16)
        PanelTokens<K>(g, Packed<K>{g.panels + (r / 16) * g.panel_bytes, ahead}, r,
                       std::min(r + 16, r1));
      return;
    }
  }
  if (g.n_tokens == 1) {
    for (int64_t r = r0; r < r1; r += 16) PanelGemv<K>(g, r, std::min(r + 16, r1));
    return;
  }
  __m512i* pack = PanelBuffer(static_cast<size_t>(g.cols / kQK * PackedBlockVectors<K>()));
  if (!pack) std::abort();
  for (int64_t r = r0; r < r1; r += 16) {
    const int64_t r_end = std::min(r + 16, r1);
    PackPanel<K>(g, r, r_end, pack);
    PanelTokens<K>(g, CallPacked<K>{pack}, r, r_end);
  }
}

// ---- Float weights: FP32 activations, 16 columns per step, masked tail.
template <DType kT>
inline __m512 LoadW(const uint8_t* row, int64_t c, __mmask16 m) {
  if constexpr (kT == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + c);
    if constexpr (kT == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType kT, int R, int T>
void TileF(const MatMulArgs& g, int64_t r0, int64_t t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  constexpr int64_t kElem = kT == DType::kF32 ? 4 : 2;
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t c = 0; c < g.cols; c += 16) {
    const __mmask16 m = g.cols - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (g.cols - c)) - 1);
    if (T == 1 && g.n_tokens == 1 && (c * kElem) % 64 == 0)
      for (int r = 0; r < R; ++r)
        PrefetchStream<64>(g.w + (r0 + r) * g.row_bytes + c * kElem, ahead);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW<kT>(g.w + (r0 + r) * g.row_bytes, c, m);
    for (int t = 0; t < T; ++t) {
      const __m512 x = _mm512_maskz_loadu_ps(m, g.x + (t0 + t) * g.cols + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], x, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

PENG_DEFINE_TILE_DRIVER(RunF, TileF, DType)

// Float weights packed at load time (PackPanels) in row groups (RowGroupBytes) of
// kFloatChunkValues-value chunks: a group holds, per 16-column step, its 4 rows' 16 values.
// PanelTileF does TileF's operations in TileF's order (the zero padding meets masked-off
// activations, as TileF's masked loads do), so the results are bit-identical.
template <DType kT>
constexpr int64_t FloatBytes() {
  return kT == DType::kF32 ? 4 : 2;
}
// T tokens from t0 against the 4-row group at `group` (rows r.. of which the first nr exist).
template <DType kT, int T>
void PanelTileF(const MatMulArgs& g, const uint8_t* group, int64_t r, int64_t nr, int64_t t0) {
  constexpr int64_t kE = FloatBytes<kT>(), kChunk = RowGroupChunk(kT);
  static_assert(kChunk == 16 * kE);  // (a chunk: the 16 values of a step)
  __m512 acc[4][T];
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
  const uint8_t* p = group;
  for (int64_t c = 0; c < g.cols; c += 16, p += 4 * kChunk) {
    const __mmask16 m =
        g.cols - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (g.cols - c)) - 1);
    __m512 wv[4];
    for (int i = 0; i < 4; ++i) wv[i] = LoadW<kT>(p + i * kChunk, 0, 0xFFFF);
    for (int t = 0; t < T; ++t) {
      const __m512 x = _mm512_maskz_loadu_ps(m, g.x + (t0 + t) * g.cols + c);
      for (int i = 0; i < 4; ++i) acc[i][t] = _mm512_fmadd_ps(wv[i], x, acc[i][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < nr; ++i) g.y[(t0 + t) * g.ldy + r + i] = _mm512_reduce_add_ps(acc[i][t]);
}

// Float GEMV (one token) is memory bound: 4 rows in flight; GEMM tiles are sized to the 32 zmm.
template <DType kT>
void KernelF(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.panels && r0 % 16 == 0) {  // packed at load time (g.panels: the panel of row 0)
    const int64_t group_bytes = RowGroupBytes(g.row_bytes, RowGroupChunk(kT));
    for (int64_t r = r0; r < r1; r += 4) {
      const uint8_t* group = g.panels + r / 4 * group_bytes;
      const int64_t nr = std::min<int64_t>(4, r1 - r);
      int64_t t = 0;
      for (; t + 4 <= g.n_tokens; t += 4) PanelTileF<kT, 4>(g, group, r, nr, t);
      for (; t < g.n_tokens; ++t) PanelTileF<kT, 1>(g, group, r, nr, t);
    }
    return;
  }
  if (g.n_tokens == 1) return RunF<kT, 4, 1>(g, r0, r1);
  return RunF<kT, 4, 4>(g, r0, r1);
}

// x * iscale rounded to nearest even and clamped to [-127, 127], stored as 16 int8; returns the
// int32 values.
inline __m512i QuantizeHalfBlock(const float* x, __m512 iscale, int8_t* q) {
  __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), iscale));
  v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(v));
  return v;
}

// Same arithmetic as ref::QuantizeAct (x * (1/d) rounded to nearest even). 32-value blocks go 16
// at a time: their maxima, scales (fp16 rounding by vcvtps2ph, round to nearest even like
// F32ToF16) and 16-value sums come out of Fold16 trees, one vector for 16 blocks.
void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d, int16_t* sums) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  const int64_t nb = n / ab;
  int64_t b = 0;
  if (ab == kQK) {
    const auto fmax = [](__m512 a, __m512 c) { return _mm512_max_ps(a, c); };
    const auto iadd = [](__m512 a, __m512 c) {
      return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(c)));
    };
    for (; b + 16 <= nb; b += 16) {
      const float* xb = x + b * kQK;
      const __m512 amax = Fold16(
          [&](int j) {
            return _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 32 * j)),
                                 _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 32 * j + 16)));
          },
          fmax);
      const __mmask16 nz = _mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_OQ);
      alignas(64) float is[16];
      _mm512_store_ps(is, _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.f), amax));
      const __m256i dh = _mm512_cvtps_ph(_mm512_div_ps(amax, _mm512_set1_ps(127.f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm512_storeu_ps(d + b, _mm512_cvtph_ps(dh));
      int8_t* qb = qs + b * kQK;
      for (int h = 0; h < 2; ++h) {  // blocks b + 8h .. b + 8h + 7: 16 sums of 16 values
        const __m512 s = Fold16(
            [&](int j) {
              const int blk = 8 * h + j / 2;
              return _mm512_castsi512_ps(QuantizeHalfBlock(xb + 32 * blk + 16 * (j & 1),
                                                           _mm512_set1_ps(is[blk]),
                                                           qb + 32 * blk + 16 * (j & 1)));
            },
            iadd);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + 2 * b + 16 * h),
                            _mm512_cvtepi32_epi16(_mm512_castps_si512(s)));
      }
    }
  }
  for (; b < nb; ++b) {
    const float* xb = x + b * ab;
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < ab; i += 16)
      mx = _mm512_max_ps(mx, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + i)));
    float id;
    ActBlockScale(_mm512_reduce_max_ps(mx), ab, &d[b], &id);
    for (int i = 0; i < ab; i += 16) {
      const __m512i v = QuantizeHalfBlock(xb + i, _mm512_set1_ps(id), qs + b * ab + i);
      sums[(b * ab + i) / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
    }
  }
}

}  // namespace

MatMulKernel Avx512MatMulKernel(DType t) {
  switch (t) {
    case DType::kF32: return &KernelF<DType::kF32>;
    case DType::kF16: return &KernelF<DType::kF16>;
    case DType::kBF16: return &KernelF<DType::kBF16>;
    case DType::kQ4_0: return &Kernel32<KQ4_0>;
    case DType::kQ4_1: return &Kernel32<KQ4_1>;
    case DType::kQ5_0: return &Kernel32<KQ5_0>;
    case DType::kQ5_1: return &Kernel32<KQ5_1>;
    case DType::kQ8_0: return &Kernel32<KQ8_0>;
    default: return Avx512KQuantKernel(t);
  }
}

QuantizeActFn Avx512QuantizeAct() { return &QuantizeAct; }

size_t Avx512PanelBytes(DType t, int64_t cols) {
  if (const int64_t chunk = RowGroupChunk(t)) return 4 * RowGroupBytes(RowBytes(t, cols), chunk);
  const int64_t nb = cols / kQK;
  switch (t) {
    case DType::kQ4_0: return nb * Packed<KQ4_0>::kBlockBytes;
    case DType::kQ4_1: return nb * Packed<KQ4_1>::kBlockBytes;
    case DType::kQ5_0: return nb * Packed<KQ5_0>::kBlockBytes;
    case DType::kQ5_1: return nb * Packed<KQ5_1>::kBlockBytes;
    case DType::kQ8_0: return nb * Packed<KQ8_0>::kBlockBytes;
    default: return Avx512KQuantPanelBytes(t, cols);
  }
}

void Avx512PackPanels(DType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  if (const int64_t chunk = RowGroupChunk(t)) return PackRowGroups(w, row_bytes, rows, chunk, out);
  switch (t) {
    case DType::kQ4_0: return PackPanelsOf<KQ4_0>(w, row_bytes, rows, cols, out);
    case DType::kQ4_1: return PackPanelsOf<KQ4_1>(w, row_bytes, rows, cols, out);
    case DType::kQ5_0: return PackPanelsOf<KQ5_0>(w, row_bytes, rows, cols, out);
    case DType::kQ5_1: return PackPanelsOf<KQ5_1>(w, row_bytes, rows, cols, out);
    case DType::kQ8_0: return PackPanelsOf<KQ8_0>(w, row_bytes, rows, cols, out);
    default: return Avx512PackKQuantPanels(t, w, row_bytes, rows, cols, out);
  }
}

}  // namespace peng::kernels
