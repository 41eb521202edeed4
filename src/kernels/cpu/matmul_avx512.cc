// AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels. Integer dot products use vpdpbusd (u8 weights x
// s8 activations); a weight offset (Q4_0: 8, Q5_0: 16, Q8_0: 128 after flipping its sign bit) is
// removed exactly by starting the int32 dots at -offset * sum(a) (OffsetStart). The 32-value
// block types run in 16-row panels (one
// lane per row, the two blocks of a step transposed across rows; see PanelGemv / PackPanel), and
// so do Q4_K and Q6_K when packed at load time (PackedQ4K, PackedQ6K); otherwise the K-quants
// and float types
// compute R x T register tiles (R weight rows x T tokens: every
// weight block is decoded once per tile and reused for T tokens, every activation block loaded
// once and reused for R rows), one 64-value K-quant chunk per 512-bit step.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/fold_avx512.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/quant_blocks.h"

// GCC 12 warns about the deliberately undefined upper halves in the cast intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace peng::kernels {
namespace {

inline __m512i Idx2() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }

inline float Half(uint16_t h) { return _cvtsh_ss(h); }
inline uint32_t Load32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

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
  for (int i = 0; i < 16; ++i) std::memcpy(&head[i], w[i] + bb, 4);
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

inline void StoreRows(float* y, __m512 v, int n) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1), v);
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
  int64_t ahead;  // prefetch distance (bytes)
  void Block(int64_t bb, __m512i v[8], __m512* dw, __m512* mw) const {
    const uint8_t* p = panel + bb * kBlockBytes;
    PrefetchStream<kBlockBytes>(p, ahead);
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
      const int64_t ahead = PrefetchAhead(Packed<K>::kBlockBytes);
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

// A Q4_K super-block's contribution to a row's sum, from its exact integer sums: isc = sum over
// sub-blocks of scale * dot, imin = sum of min * (sum of the sub-block's activations). The
// row-major tiles (KQ4_K::Finish: one row, scalar) and the panels (16 rows, one lane each) do
// these same two fused multiply-adds, so both give the same bits.
inline float ScaleSuperRow(int32_t isc, int32_t imin, float d, float dmin, float da, float acc) {
  __m128 a =
      _mm_fmadd_ss(_mm_set_ss(static_cast<float>(isc)), _mm_set_ss(d * da), _mm_set_ss(acc));
  a = _mm_fmadd_ss(_mm_set_ss(static_cast<float>(imin)), _mm_set_ss(-(dmin * da)), a);
  return _mm_cvtss_f32(a);
}
// Q6_K: the super-block's exact integer sum (sum over sub-blocks of scale * (dot - 32 * sum(a)),
// |.| < 2^29) times d * d_a, one FMA; row-major tiles and panels alike.
inline float ScaleSuperRowQ6K(int32_t isum, float d, float da, float acc) {
  return _mm_cvtss_f32(
      _mm_fmadd_ss(_mm_set_ss(static_cast<float>(isum)), _mm_set_ss(d * da), _mm_set_ss(acc)));
}
inline __m512 ScaleSuper(__m512i isc, __m512i imin, __m512 d, __m512 dmin, float da, __m512 acc) {
  const __m512 vda = _mm512_set1_ps(da);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc), _mm512_mul_ps(d, vda), acc);
  const __m512 ndm = _mm512_xor_ps(_mm512_mul_ps(dmin, vda), _mm512_set1_ps(-0.f));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), ndm, acc);
}

// ---- K-quants: one super-block (4 chunks of 64 values) at a time. Per-chunk integer sums are
// multiplied by the sub-block scales with vpmaddwd (the chunk sums fit in int16). K::Finish folds
// a super-block into the row's accumulator (K::Acc): Q5_K / Q6_K keep 16 float lanes summed at
// the end, Q4_K one float from the super-block's exact integer sums, as its panels do.
struct RowK {
  __m512i sc32;   // 16 x int32 (low 16 bits) sub-block scales, permuted per chunk
  __m256i m16;    // Q4_K/Q5_K: mins per 16 values; Q6_K: scales per 16 values (int16)
  __m512i qh2;    // Q5_K: [qh, qh]
  float d, dmin;
};

inline __m512i ChunkScales32(const RowK& p, int c) {  // 8-value... [s_2c x8, s_2c+1 x8]
  return _mm512_permutexvar_epi32(_mm512_add_epi32(Idx2(), _mm512_set1_epi32(2 * c)), p.sc32);
}

struct KQ4_K {
  using B = BlockQ4_K;
  using Acc = float;
  static void Prep(const B* b, RowK* p) {
    uint64_t sc, m;
    UnpackScalesK64(b->scales, &sc, &m);
    p->sc32 = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m128i mm = _mm_cvtsi64_si128(static_cast<int64_t>(m));
    p->m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mm, mm));
    p->d = Half(b->d);
    p->dmin = Half(b->dmin);
  }
  static __m512i Q(const B* b, const RowK&, int c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
    const __m256i f = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, f)),
                              _mm256_and_si256(_mm256_srli_epi16(x, 4), f), 1);
  }
  static __m512i S(const RowK& p, int c) { return ChunkScales32(p, c); }
  static float Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, float acc) {
    const int32_t isc = _mm512_reduce_add_epi32(iacc);
    const int32_t imin =
        _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, p.m16)));
    return ScaleSuperRow(isc, imin, p.d, p.dmin, da, acc);
  }
};
struct KQ5_K {
  using B = BlockQ5_K;
  using Acc = __m512;
  static void Prep(const B* b, RowK* p) {
    KQ4_K::Prep(reinterpret_cast<const BlockQ4_K*>(b), p);  // same d/dmin/scales prefix
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh));
    p->qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
  }
  static __m512i Q(const B* b, const RowK& p, int c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
    const __m256i f = _mm256_set1_epi8(0x0F);
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, f)),
                                         _mm256_and_si256(_mm256_srli_epi16(x, 4), f), 1);
    const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                           _mm256_set1_epi8(static_cast<char>(2 << (2 * c))), 1);
    const __mmask64 m = _mm512_test_epi8_mask(p.qh2, bit);
    return _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16));
  }
  static __m512i S(const RowK& p, int c) { return ChunkScales32(p, c); }
  static __m512 Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, __m512 facc) {
    const __m256i mins = _mm256_madd_epi16(bsums, p.m16);
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(p.d * da), facc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)),
                           _mm512_set1_ps(-p.dmin * da), facc);
  }
};
struct KQ6_K {
  using B = BlockQ6_K;
  using Acc = float;
  static void Prep(const B* b, RowK* p) {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
    p->sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(s), _mm512_set1_epi32(0xFFFF));
    p->m16 = _mm256_cvtepi8_epi16(s);
    p->d = Half(b->d);
  }
  static __m512i Q(const B* b, const RowK&, int c) {
    const int h = c >> 1;
    const __m512i l = _mm512_loadu_si512(b->ql + 64 * h);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * h));
    const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 2), 1);
    const __m512i m30 = _mm512_set1_epi8(0x30), f = _mm512_set1_epi8(0x0F);
    if (c & 1) {
      return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), f),
                             _mm512_and_si512(hz, m30));
    }
    return _mm512_or_si512(_mm512_and_si512(l, f),
                           _mm512_and_si512(_mm512_slli_epi16(hz, 4), m30));
  }
  static __m512i S(const RowK& p, int c) {
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(4 * c)), p.sc32);
  }
  static float Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, float acc) {
    const int32_t isc = _mm512_reduce_add_epi32(iacc);
    const int32_t off =  // sum of scale * (sum of the sub-block's activations)
        _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, p.m16)));
    return ScaleSuperRowQ6K(isc - 32 * off, p.d, da, acc);
  }
};

inline float RowTotal(float acc) { return acc; }
inline float RowTotal(__m512 acc) { return _mm512_reduce_add_ps(acc); }

template <class K, int R, int T>
void TileK(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQKK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  typename K::Acc facc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) facc[r][t] = typename K::Acc{};
  const __m512i zero = _mm512_setzero_si512();
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    RowK p[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) K::Prep(w[r] + b, &p[r]);
    __m512i iacc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) iacc[r][t] = zero;
    for (int c = 0; c < 4; ++c) {
      __m512i q[R], s[R];
      for (int r = 0; r < R; ++r) {
        q[r] = K::Q(w[r] + b, p[r], c);
        s[r] = K::S(p[r], c);
      }
      for (int t = 0; t < T; ++t) {
        const __m512i a = _mm512_loadu_si512(g.a.qs + (t0 + t) * g.a.qs_stride + b * kQKK + 64 * c);
        for (int r = 0; r < R; ++r)
          iacc[r][t] = _mm512_add_epi32(
              iacc[r][t], _mm512_madd_epi16(_mm512_dpbusd_epi32(zero, q[r], a), s[r]));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float da = g.a.d[(t0 + t) * g.a.d_stride + b];
      const __m256i bs = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(g.a.sums + (t0 + t) * g.a.sums_stride + b * 16));
      for (int r = 0; r < R; ++r) facc[r][t] = K::Finish(p[r], iacc[r][t], bs, da, facc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = RowTotal(facc[r][t]);
}

// ---- Q4_K panels, packed at load time: per 16-row panel and super-block, exactly the 16 rows'
// bytes rearranged (2304 = 16 x 144): the rows' 12 scale bytes as three vectors (dwords 0, 1, 2
// of every row), the 16 d and the 16 dmin (fp16), then 32 nibble vectors (chunk c, vector k:
// bytes qs[32c + 4k .. 32c + 4k + 3] of every row, low nibbles values 64c + 4k.. of sub-block 2c,
// high nibbles values 64c + 32 + 4k.. of sub-block 2c + 1). The scales lead, as the kernel reads
// them first (with them at the end the single-token GEMV read 13-15 GB/s from memory instead of
// 15.5-16, one core; Q6_K the same, PackedQ6K). A sub-block's
// dot goes as two 16-value halves of 4 vpdpbusd each (|dot| <= 16 * 15 * 127 fits int16), and
// each half is scaled and summed by one vpdpwssd against (scale, 0) per lane; the mins term is
// one vpdpwssd of (min, min) against the token's two 16-value sums of the sub-block. The integer
// sums are exact, so they equal the row-major tile's, and ScaleSuper matches ScaleSuperRow.
struct PackedQ4K {
  static constexpr int64_t kScaleVectors = 0;
  static constexpr int64_t kHeads = kScaleVectors + 64 * 3;
  static constexpr int64_t kQuants = kHeads + 64;
  static constexpr int64_t kBlockBytes = kQuants + 64 * 32;
  static_assert(kBlockBytes == 16 * static_cast<int64_t>(sizeof(BlockQ4_K)));
};

// Calls pack(block, out, i) for row i (rows past the end repeat the last) of every 16-row panel
// and super-block of a K-quant matrix, out stepping kBlockBytes a panel's super-block.
template <class B, int64_t kBlockBytes, class F>
void PackSuperBlockPanels(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                          uint8_t* out, F&& pack) {
  const int64_t nb = cols / kQKK;
  for (int64_t r = 0; r < rows; r += 16) {
    for (int64_t b = 0; b < nb; ++b, out += kBlockBytes) {
      for (int i = 0; i < 16; ++i)
        pack(reinterpret_cast<const B*>(w + std::min(r + i, rows - 1) * row_bytes) + b, out, i);
    }
  }
}

void PackPanelsQ4K(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  PackSuperBlockPanels<BlockQ4_K, PackedQ4K::kBlockBytes>(
      w, row_bytes, rows, cols, out, [](const BlockQ4_K* blk, uint8_t* o, int i) {
        for (int v = 0; v < 32; ++v)
          std::memcpy(o + PackedQ4K::kQuants + 64 * v + 4 * i, blk->qs + 4 * v, 4);
        for (int v = 0; v < 3; ++v)
          std::memcpy(o + PackedQ4K::kScaleVectors + 64 * v + 4 * i, blk->scales + 4 * v, 4);
        std::memcpy(o + PackedQ4K::kHeads + 2 * i, &blk->d, 2);
        std::memcpy(o + PackedQ4K::kHeads + 32 + 2 * i, &blk->dmin, 2);
      });
}

// Sub-block j's scale (low 16 bits of each row's dword) and min (both 16-bit halves), from the
// rows' unpacked 6-bit scales (UnpackScalesK64's arithmetic, one row a lane): sc[0] / sc[1]
// bytes 0-3 = scales of sub-blocks 0-3 / 4-7, m[0] / m[1] the mins.
inline void ScalesQ4K(const uint8_t* p, __m512i sc[2], __m512i m[2]) {
  const __m512i lo = _mm512_loadu_si512(p), hi = _mm512_loadu_si512(p + 64),
                b = _mm512_loadu_si512(p + 128);
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F);
  sc[0] = _mm512_and_si512(lo, m3f);
  m[0] = _mm512_and_si512(hi, m3f);
  // Bits 0-3 from b (0xD8: c ? b : a, c the 0x0F mask), bits 4-5 from lo / hi >> 2, then the
  // 6 bits kept.
  sc[1] = _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 2), b, m0f, 0xD8), m3f);
  m[1] = _mm512_and_si512(
      _mm512_ternarylogic_epi32(_mm512_srli_epi32(hi, 2), _mm512_srli_epi32(b, 4), m0f, 0xD8), m3f);
}
// Byte j of each dword as a 16-bit value in the dword's low half (both: in both halves).
inline __m512i ByteToWord(__m512i v, int j, bool both) {
  const int x = j, z = 0x80;
  const __m512i idx = _mm512_set4_epi32(
      (both ? x + 12 : z) << 16 | z << 24 | (x + 12) | z << 8,
      (both ? x + 8 : z) << 16 | z << 24 | (x + 8) | z << 8,
      (both ? x + 4 : z) << 16 | z << 24 | (x + 4) | z << 8,
      (both ? x : z) << 16 | z << 24 | x | z << 8);
  return _mm512_shuffle_epi8(v, idx);
}

// T tokens from t0 against the Q4_K panel of rows [r, r_end). No software prefetch: a thread's
// panels are one contiguous stream, which the hardware prefetchers follow; prefetching 4 or 8
// super-blocks ahead (to L1 or L2) made the single-token GEMV slower (one core, weights from
// memory: 14-18 GB/s with, 18-20.5 without).
template <int T>
void PanelTileQ4K(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end,
                  int64_t t0) {
  const int64_t nb = g.cols / kQKK;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t bb = 0; bb < nb; ++bb) {
    const uint8_t* p = panel + bb * PackedQ4K::kBlockBytes;
    __m512i sc[2], mn[2];
    ScalesQ4K(p + PackedQ4K::kScaleVectors, sc, mn);
    // Two accumulators of each kind a token (even / odd sub-blocks; integer sums, so the split
    // changes nothing) keep the dependent chains short when there are few tokens.
    __m512i isc[2][T], imin[2][T];
    for (int t = 0; t < T; ++t)
      isc[0][t] = isc[1][t] = imin[0][t] = imin[1][t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;  // sub-block
        const __m512i s = ByteToWord(sc[j >> 2], j & 3, false);
        const __m512i mm = ByteToWord(mn[j >> 2], j & 3, true);
        __m512i v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m512i q = _mm512_loadu_si512(p + PackedQ4K::kQuants + 64 * (8 * c + k));
          v[k] = _mm512_and_si512(h ? _mm512_srli_epi16(q, 4) : q, m4);
        }
        for (int t = 0; t < T; ++t) {
          const int8_t* a = g.a.qs + (t0 + t) * g.a.qs_stride + bb * kQKK + 32 * j;
          __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            d0 = _mm512_dpbusd_epi32(d0, v[k], _mm512_set1_epi32(static_cast<int>(Load32(a + 4 * k))));
            d1 = _mm512_dpbusd_epi32(d1, v[4 + k],
                                     _mm512_set1_epi32(static_cast<int>(Load32(a + 16 + 4 * k))));
          }
          isc[h][t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isc[h][t], d0, s), d1, s);
          const int16_t* sums = g.a.sums + (t0 + t) * g.a.sums_stride + bb * 16 + 2 * j;
          imin[h][t] = _mm512_dpwssd_epi32(imin[h][t], mm,
                                           _mm512_set1_epi32(static_cast<int>(Load32(sums))));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ4K::kHeads)));
    const __m512 dmw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ4K::kHeads + 32)));
    for (int t = 0; t < T; ++t)
      acc[t] = ScaleSuper(_mm512_add_epi32(isc[0][t], isc[1][t]),
                          _mm512_add_epi32(imin[0][t], imin[1][t]), dw, dmw,
                          g.a.d[(t0 + t) * g.a.d_stride + bb], acc[t]);
  }
  for (int t = 0; t < T; ++t)
    StoreRows(g.y + (t0 + t) * g.ldy + r, acc[t], static_cast<int>(r_end - r));
}

// ---- Q6_K panels, packed at load time: per 16-row panel and super-block, exactly the 16 rows'
// bytes rearranged (3360 = 16 x 210), every vector one dword a row. First the rows' 16 int8
// scales as four vectors, scales 4q, 4q + 2, 4q + 1, 4q + 3 in vector q (two shifts give the
// int16 pairs (4q, 4q + 1) and (4q + 2, 4q + 3)); they lead the block so that the block reads
// front to back (with them at the end, their load missed the cache at every super-block: the
// GEMV read 9-10 GB/s from memory instead of 11-15). Then 4 groups of 12 vectors: group
// 2 * half + k16 holds values 128 * half + 32 * s + 16 * k16 + 0..15, s = 0..3 (sub-blocks
// 8 * half + 2 * s + k16): 4 vectors of ql bytes 64 * half + 16 * k16 + 4k.. (low nibbles:
// s = 0, high: s = 2), 4 of the ql bytes 32 further (s = 1, 3), 4 of qh bytes 32 * half +
// 16 * k16 + 4k.. (bits 2s, 2s + 1: value s). Then the 16 d (fp16). A value decodes to u = q + 32
// in 0..63 (nibble | high bits << 4: an and, a shift, a vpternlogd); a sub-block's dot of u
// against the token's int8 values is 4 vpdpbusd, times the row's scale with vpmulld (the dot
// does not fit int16), and the -32 offset is one vpdpwssd per two sub-blocks of the scales
// against the token's 16-value sums: the super-block's exact integer sum, as KQ6_K::Finish
// computes it one row at a time, so packed and row-major results are the same bits.
struct PackedQ6K {
  static constexpr int64_t kScales = 0;
  static constexpr int64_t kGroups = kScales + 4 * 64;
  static constexpr int64_t kGroupBytes = 12 * 64;
  static constexpr int64_t kHeads = kGroups + 4 * kGroupBytes;
  static constexpr int64_t kBlockBytes = kHeads + 32;
  static_assert(kBlockBytes == 16 * static_cast<int64_t>(sizeof(BlockQ6_K)));
};

void PackPanelsQ6K(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  PackSuperBlockPanels<BlockQ6_K, PackedQ6K::kBlockBytes>(
      w, row_bytes, rows, cols, out, [](const BlockQ6_K* blk, uint8_t* o, int i) {
        for (int g = 0; g < 4; ++g) {
          const int half = g >> 1, k16 = g & 1;
          uint8_t* grp = o + PackedQ6K::kGroups + g * PackedQ6K::kGroupBytes + 4 * i;
          for (int k = 0; k < 4; ++k) {
            std::memcpy(grp + 64 * k, blk->ql + 64 * half + 16 * k16 + 4 * k, 4);
            std::memcpy(grp + 64 * (4 + k), blk->ql + 64 * half + 32 + 16 * k16 + 4 * k, 4);
            std::memcpy(grp + 64 * (8 + k), blk->qh + 32 * half + 16 * k16 + 4 * k, 4);
          }
        }
        for (int q = 0; q < 4; ++q) {
          const int8_t* sc = blk->scales + 4 * q;
          const int8_t v[4] = {sc[0], sc[2], sc[1], sc[3]};
          std::memcpy(o + PackedQ6K::kScales + 64 * q + 4 * i, v, 4);
        }
        std::memcpy(o + PackedQ6K::kHeads + 2 * i, &blk->d, 2);
      });
}

// T tokens from t0 against the Q6_K panel of rows [r, r_end) (no software prefetch, as for Q4_K).
template <int T>
void PanelTileQ6K(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end,
                  int64_t t0) {
  const int64_t nb = g.cols / kQKK;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t bb = 0; bb < nb; ++bb) {
    const uint8_t* p = panel + bb * PackedQ6K::kBlockBytes;
    const uint8_t* scales = p + PackedQ6K::kScales;
    __m512i isc[T], off[T];
    for (int t = 0; t < T; ++t) off[t] = isc[t] = zero;
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {  // the -32 offset: scale pairs (4q, 4q + 1), (4q + 2, 4q + 3)
      const __m512i v = _mm512_loadu_si512(scales + 64 * q);
      const __m512i w0 = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8), w1 = _mm512_srai_epi16(v, 8);
      for (int t = 0; t < T; ++t) {
        const int16_t* sums = g.a.sums + (t0 + t) * g.a.sums_stride + bb * 16 + 4 * q;
        off[t] = _mm512_dpwssd_epi32(off[t], w0, _mm512_set1_epi32(static_cast<int>(Load32(sums))));
        off[t] = _mm512_dpwssd_epi32(off[t], w1,
                                     _mm512_set1_epi32(static_cast<int>(Load32(sums + 2))));
      }
    }
#pragma GCC unroll 4
    for (int grp = 0; grp < 4; ++grp) {
      const uint8_t* q = p + PackedQ6K::kGroups + grp * PackedQ6K::kGroupBytes;
      __m512i xs[8], hs[4];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) xs[k] = _mm512_loadu_si512(q + 64 * k);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) hs[k] = _mm512_loadu_si512(q + 64 * (8 + k));
#pragma GCC unroll 2
      for (int sp = 0; sp < 2; ++sp) {  // s = sp (low nibbles) and s = sp + 2 (high nibbles)
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m512i x = xs[4 * sp + k];
          const __m512i h = hs[k];
          // high bits 2s, 2s + 1 of each byte moved to bits 4, 5; | nibble (ternary 0xEA).
          const __m512i hl = sp ? _mm512_slli_epi16(h, 2) : _mm512_slli_epi16(h, 4);
          const __m512i hh = sp ? _mm512_srli_epi16(h, 2) : h;
          lo[k] = _mm512_ternarylogic_epi32(hl, m30, _mm512_and_si512(x, m4), 0xEA);
          hi[k] = _mm512_ternarylogic_epi32(hh, m30, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
                                            0xEA);
        }
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int s = sp + 2 * e;
          const int j = 8 * (grp >> 1) + 2 * s + (grp & 1);  // sub-block
          // Sub-block j's scale as int32: byte (0, 2, 1, 3)[j % 4] of scale vector j / 4.
          constexpr int kByte[4] = {0, 2, 1, 3};
          const __m512i sc = _mm512_srai_epi32(
              _mm512_slli_epi32(_mm512_loadu_si512(scales + 64 * (j >> 2)), 24 - 8 * kByte[j & 3]),
              24);
          const __m512i* v = e ? hi : lo;
          for (int t = 0; t < T; ++t) {
            const int8_t* a = g.a.qs + (t0 + t) * g.a.qs_stride + bb * kQKK + 16 * j;
            const __m512i d0 = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(zero, v[0], _mm512_set1_epi32(static_cast<int>(Load32(a)))),
                v[1], _mm512_set1_epi32(static_cast<int>(Load32(a + 4))));
            const __m512i d1 = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(zero, v[2], _mm512_set1_epi32(static_cast<int>(Load32(a + 8)))),
                v[3], _mm512_set1_epi32(static_cast<int>(Load32(a + 12))));
            isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sc));
          }
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ6K::kHeads)));
    for (int t = 0; t < T; ++t) {
      const __m512i isum = _mm512_sub_epi32(isc[t], _mm512_slli_epi32(off[t], 5));
      const __m512 da = _mm512_set1_ps(g.a.d[(t0 + t) * g.a.d_stride + bb]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, da), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t)
    StoreRows(g.y + (t0 + t) * g.ldy + r, acc[t], static_cast<int>(r_end - r));
}

struct TilesQ4K {
  template <int T>
  static void Run(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end, int64_t t0) {
    PanelTileQ4K<T>(g, panel, r, r_end, t0);
  }
};
struct TilesQ6K {
  template <int T>
  static void Run(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end, int64_t t0) {
    PanelTileQ6K<T>(g, panel, r, r_end, t0);
  }
};

// Every token of the call against the K-quant panels of rows [r0, r1), 4 tokens a tile.
template <class Tiles>
void PanelsK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += 16) {
    const uint8_t* panel = g.panels + (r / 16) * g.panel_bytes;
    const int64_t r_end = std::min(r + 16, r1);
    int64_t t = 0;
    for (; t + 4 <= g.n_tokens; t += 4) Tiles::template Run<4>(g, panel, r, r_end, t);
    switch (g.n_tokens - t) {
      case 3: Tiles::template Run<3>(g, panel, r, r_end, t); break;
      case 2: Tiles::template Run<2>(g, panel, r, r_end, t); break;
      case 1: Tiles::template Run<1>(g, panel, r, r_end, t); break;
      default: break;
    }
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

PENG_DEFINE_TILE_DRIVER(RunK, TileK, class)
PENG_DEFINE_TILE_DRIVER(RunF, TileF, DType)

// K-quant and float GEMV (one token) is memory bound: 4 rows in flight. GEMM tiles are sized
// to the 32 zmm.
template <class K>
void KernelK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if constexpr (std::is_same_v<K, KQ4_K>) {
    if (g.panels && r0 % 16 == 0) return PanelsK<TilesQ4K>(g, r0, r1);
  }
  if constexpr (std::is_same_v<K, KQ6_K>) {
    if (g.panels && r0 % 16 == 0) return PanelsK<TilesQ6K>(g, r0, r1);
  }
  if (g.n_tokens == 1) return RunK<K, 4, 1>(g, r0, r1);
  return RunK<K, 2, 4>(g, r0, r1);
}
template <DType kT>
void KernelF(const MatMulArgs& g, int64_t r0, int64_t r1) {
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
    case DType::kQ4_K: return &KernelK<KQ4_K>;
    case DType::kQ5_K: return &KernelK<KQ5_K>;
    case DType::kQ6_K: return &KernelK<KQ6_K>;
    default: return nullptr;
  }
}

QuantizeActFn Avx512QuantizeAct() { return &QuantizeAct; }

size_t Avx512PanelBytes(DType t, int64_t cols) {
  const int64_t nb = cols / kQK;
  switch (t) {
    case DType::kQ4_0: return nb * Packed<KQ4_0>::kBlockBytes;
    case DType::kQ4_1: return nb * Packed<KQ4_1>::kBlockBytes;
    case DType::kQ5_0: return nb * Packed<KQ5_0>::kBlockBytes;
    case DType::kQ5_1: return nb * Packed<KQ5_1>::kBlockBytes;
    case DType::kQ8_0: return nb * Packed<KQ8_0>::kBlockBytes;
    case DType::kQ4_K: return cols / kQKK * PackedQ4K::kBlockBytes;
    case DType::kQ6_K: return cols / kQKK * PackedQ6K::kBlockBytes;
    default: return 0;
  }
}

void Avx512PackPanels(DType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out) {
  switch (t) {
    case DType::kQ4_0: return PackPanelsOf<KQ4_0>(w, row_bytes, rows, cols, out);
    case DType::kQ4_1: return PackPanelsOf<KQ4_1>(w, row_bytes, rows, cols, out);
    case DType::kQ5_0: return PackPanelsOf<KQ5_0>(w, row_bytes, rows, cols, out);
    case DType::kQ5_1: return PackPanelsOf<KQ5_1>(w, row_bytes, rows, cols, out);
    case DType::kQ8_0: return PackPanelsOf<KQ8_0>(w, row_bytes, rows, cols, out);
    case DType::kQ4_K: return PackPanelsQ4K(w, row_bytes, rows, cols, out);
    case DType::kQ6_K: return PackPanelsQ6K(w, row_bytes, rows, cols, out);
    default: return;
  }
}

}  // namespace peng::kernels
