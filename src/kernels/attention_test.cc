// PagedAttention and KvWrite against a naive double-precision attention over contiguous K/V,
// with the cache scattered over physical blocks in shuffled order, on every ISA this CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/attention_ops.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {
namespace {

struct Case {
  const char* name;
  int n_heads, n_kv_heads, head_dim, v_head_dim;
  int64_t n_q, pos0;
  DType dtype;
  int sliding_window = 0;
  float softcap = 0.f;
  int block_size = 16;
};

std::vector<Isa> AllIsas() {
  std::vector<Isa> out;
  for (Isa isa : kAllIsas)
    if (IsaSupported(isa)) out.push_back(isa);
  return out;
}

// Contiguous K [T, n_kv, dk] / V [T, n_kv, dv] and queries [n_q, n_heads, dk]; the values are
// rounded through fp16 when the cache is F16, and each head's row through the rotated Q8_0
// blocks when it is Q8_0 (rotated, quantized, read back and rotated back: writing such a row
// again gives the same blocks), so that the oracle sees what the cache holds.
struct Data {
  std::vector<float> q, k, v;
};

Data MakeData(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  const int64_t t = c.pos0 + c.n_q;
  Data data;
  data.q.resize(c.n_q * c.n_heads * c.head_dim);
  data.k.resize(t * c.n_kv_heads * c.head_dim);
  data.v.resize(t * c.n_kv_heads * c.v_head_dim);
  for (float& x : data.q) x = 3.f * d(rng);
  for (auto* vec : {&data.k, &data.v}) {
    for (float& x : *vec) {
      x = d(rng);
      if (c.dtype == DType::kF16) x = F16ToF32(F32ToF16(x));
    }
  }
  if (c.dtype == DType::kQ8_0) {
    for (auto [vec, dim] : {std::pair{&data.k, c.head_dim}, std::pair{&data.v, c.v_head_dim}}) {
      std::vector<uint8_t> blocks(RowBytes(DType::kQ8_0, dim));
      for (size_t i = 0; i < vec->size(); i += dim) {
        ref::HadamardRows(vec->data() + i, 1, dim, RotationBlock(dim));
        ref::F32ToQ8_0Row(vec->data() + i, blocks.data(), dim);
        ref::Q8_0ToF32Row(blocks.data(), vec->data() + i, dim);
        ref::HadamardRows(vec->data() + i, 1, dim, RotationBlock(dim));
      }
    }
  }
  return data;
}

std::vector<double> NaiveAttention(const Case& c, const Data& d, float scale) {
  const int group = c.n_heads / c.n_kv_heads;
  std::vector<double> out(c.n_q * c.n_heads * c.v_head_dim, 0.0);
  for (int64_t t = 0; t < c.n_q; ++t) {
    const int64_t p = c.pos0 + t;
    const int64_t lo = c.sliding_window > 0 ? std::max<int64_t>(0, p - c.sliding_window + 1) : 0;
    for (int h = 0; h < c.n_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> s;
      for (int64_t j = lo; j <= p; ++j) {
        double dot = 0;
        for (int i = 0; i < c.head_dim; ++i) {
          dot += double{d.q[(t * c.n_heads + h) * c.head_dim + i]} *
                 d.k[(j * c.n_kv_heads + kvh) * c.head_dim + i];
        }
        dot *= scale;
        if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
        s.push_back(dot);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* o = &out[(t * c.n_heads + h) * c.v_head_dim];
      for (int64_t j = lo; j <= p; ++j) {
        for (int i = 0; i < c.v_head_dim; ++i)
          o[i] += s[j - lo] / sum * d.v[(j * c.n_kv_heads + kvh) * c.v_head_dim + i];
      }
    }
  }
  return out;
}

// A paged cache whose logical blocks live in shuffled physical blocks (plus spare blocks), with
// every slot first filled with NaN so that reading anything never written poisons the result.
struct PagedCache {
  std::vector<uint8_t> k_bytes, v_bytes;
  std::vector<int32_t> block_table;
  KvLayerView view;
};

PagedCache MakeCache(const Case& c, uint32_t seed) {
  PagedCache pc;
  const int64_t t = c.pos0 + c.n_q;
  const int64_t n_logical = (t + c.block_size - 1) / c.block_size;
  const int64_t num_blocks = n_logical + 3;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  pc.block_table.assign(perm.begin(), perm.begin() + n_logical);
  const int64_t slots = num_blocks * c.block_size * c.n_kv_heads;
  pc.k_bytes.resize(RowBytes(c.dtype, slots * c.head_dim));
  pc.v_bytes.resize(RowBytes(c.dtype, slots * c.v_head_dim));
  for (auto* bytes : {&pc.k_bytes, &pc.v_bytes}) {
    if (c.dtype == DType::kQ8_0) {  // every block's scale 0x7e7e: an fp16 NaN
      std::fill(bytes->begin(), bytes->end(), 0x7e);
    } else if (c.dtype == DType::kF16) {
      std::fill_n(reinterpret_cast<uint16_t*>(bytes->data()), bytes->size() / 2, 0x7e00);
    } else {
      std::fill_n(reinterpret_cast<float*>(bytes->data()), bytes->size() / 4,
                  std::numeric_limits<float>::quiet_NaN());
    }
  }
  pc.view = {pc.k_bytes.data(), pc.v_bytes.data(), c.dtype,      num_blocks,
             c.block_size,      c.n_kv_heads,      c.head_dim,   c.v_head_dim};
  return pc;
}

// The case's heads, window and softcap with softmax scale `scale`.
AttentionParams Params(const Case& c, float scale) {
  AttentionParams p;
  p.n_heads = c.n_heads;
  p.scale = scale;
  p.sliding_window = c.sliding_window;
  p.softcap = c.softcap;
  return p;
}

// MakeCache with every position's keys and values of `data` written (KvWrite).
PagedCache FilledCache(const Case& c, const Data& data, uint32_t seed) {
  PagedCache pc = MakeCache(c, seed);
  for (int64_t p = 0; p < c.pos0 + c.n_q; ++p)
    KvWrite(pc.view, pc.block_table.data(), p, &data.k[p * c.n_kv_heads * c.head_dim],
            &data.v[p * c.n_kv_heads * c.v_head_dim]);
  return pc;
}

void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  const Data data = MakeData(c, 7);
  const AttentionParams params = Params(c, 1.f / std::sqrt(static_cast<float>(c.head_dim)));
  const std::vector<double> want = NaiveAttention(c, data, params.scale);
  const Isa saved = ActiveIsa();
  ThreadPool pool(3);
  for (Isa isa : AllIsas()) {
    SCOPED_TRACE(IsaName(isa));
    SetActiveIsa(isa);
    PagedCache pc = FilledCache(c, data, 11);
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> out(want.size(), -1.f);
      PagedAttention(data.q.data(), c.n_q, c.pos0, pc.view, pc.block_table.data(), params,
                     out.data(), tp);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], want[i], 2e-6) << "i=" << i << " pool=" << (tp != nullptr);
    }
  }
  SetActiveIsa(saved);
}

TEST(PagedAttention, MhaDecode) { RunCase({"mha", 4, 4, 64, 64, 1, 200, DType::kF32}); }
TEST(PagedAttention, MhaDecodeF16) { RunCase({"mha16", 4, 4, 64, 64, 1, 200, DType::kF16}); }
TEST(PagedAttention, GqaDecodeLong) { RunCase({"gqa", 8, 2, 128, 128, 1, 1500, DType::kF16}); }
// A decode token's keys past kPartKeys (256) go in parts of 256, merged after: 256 keys are one
// part, 257 two (the last of one key), 1501 six; a window of 300 from key 401 two; MHA (one
// head a kv head) and an F32 cache.
TEST(PagedAttention, DecodeInParts) {
  RunCase({"one_part", 8, 2, 64, 64, 1, 255, DType::kF16});
  RunCase({"two_parts", 8, 2, 64, 64, 1, 256, DType::kF16});
  RunCase({"window_parts", 8, 2, 64, 64, 1, 700, DType::kF16, /*sliding_window=*/300});
  RunCase({"mha_parts", 4, 4, 64, 64, 1, 900, DType::kF32});
  RunCase({"softcap_parts", 8, 4, 128, 128, 1, 600, DType::kF16, 0, /*softcap=*/2.f});
}
TEST(PagedAttention, GqaPrefillFromZero) {
  RunCase({"gqa_prefill", 8, 2, 64, 64, 40, 0, DType::kF32});
}
TEST(PagedAttention, ChunkedPrefillHeadDim256) {
  RunCase({"chunk256", 8, 2, 256, 256, 37, 45, DType::kF16});
  RunCase({"chunk256_f32", 8, 2, 256, 256, 37, 45, DType::kF32});
}
TEST(PagedAttention, SlidingWindow) {
  RunCase({"swa", 8, 2, 64, 64, 20, 100, DType::kF32, /*sliding_window=*/50});
  RunCase({"swa16", 8, 2, 64, 64, 1, 300, DType::kF16, /*sliding_window=*/33});
}
TEST(PagedAttention, Softcap) {
  RunCase({"softcap", 8, 4, 256, 256, 5, 60, DType::kF16, 0, /*softcap=*/2.f});
}
TEST(PagedAttention, VHeadDimDiffers) {
  RunCase({"mla_like", 4, 4, 192, 128, 6, 70, DType::kF32});
  RunCase({"mla_like16", 4, 1, 192, 128, 1, 90, DType::kF16});
}
// A Q8_0 cache (32-value blocks with an fp16 scale, the values' rows rounded through it in
// MakeData): decode in one part and in parts, prefill tiles (from zero and chunked, the blocks
// widened once for the tiles), head_dim 256 and 32, a window, a softcap, V narrower than K.
TEST(PagedAttention, Q8_0Cache) {
  RunCase({"q8_decode", 8, 2, 64, 64, 1, 200, DType::kQ8_0});
  RunCase({"q8_parts", 8, 2, 128, 128, 1, 700, DType::kQ8_0});
  RunCase({"q8_mha_parts", 4, 4, 64, 64, 1, 300, DType::kQ8_0, /*sliding_window=*/290});
  RunCase({"q8_prefill", 8, 2, 64, 64, 40, 0, DType::kQ8_0});
  RunCase({"q8_chunk256", 8, 2, 256, 256, 37, 45, DType::kQ8_0});
  RunCase({"q8_dim32_window", 6, 3, 32, 32, 20, 100, DType::kQ8_0, /*sliding_window=*/50});
  RunCase({"q8_softcap", 8, 4, 128, 128, 5, 60, DType::kQ8_0, 0, /*softcap=*/2.f});
  RunCase({"q8_v_narrower", 4, 1, 192, 128, 1, 90, DType::kQ8_0});
  RunCase({"q8_v_narrower_prefill", 4, 4, 192, 128, 6, 70, DType::kQ8_0});
}
TEST(PagedAttention, OddDimsAndBlockSize) {
  Case c{"odd", 6, 3, 20, 12, 9, 33, DType::kF16};
  c.block_size = 5;
  RunCase(c);
  c.dtype = DType::kF32;
  c.block_size = 32;
  RunCase(c);
}

// A batch of sequences (a prefill chunk next to decodes at other positions, sharing one cache
// layer, as the engine's batches do) gives exactly PagedAttention of each, with and without a
// pool.
TEST(PagedAttention, BatchEqualsEachSequence) {
  const Case c{"batch", 8, 2, 64, 64, 5, 40, DType::kF16};
  const Data data = MakeData(c, 3);
  PagedCache pc = FilledCache(c, data, 5);
  const AttentionParams params = Params(c, 0.125f);
  const int64_t row = c.n_heads * c.head_dim;
  struct S {
    int64_t first_q, n_q;
  };
  const S parts[] = {{0, 5}, {2, 1}, {0, 1}, {4, 1}};
  std::vector<std::vector<float>> want(4), got(4);
  std::vector<AttentionSeq> seqs;
  for (int i = 0; i < 4; ++i) {
    const float* q = data.q.data() + parts[i].first_q * row;
    want[i].assign(parts[i].n_q * row, 0.f);
    PagedAttention(q, parts[i].n_q, c.pos0 + parts[i].first_q, pc.view, pc.block_table.data(),
                   params, want[i].data(), nullptr);
    got[i].assign(parts[i].n_q * row, -1.f);
    seqs.push_back({q, parts[i].n_q, c.pos0 + parts[i].first_q, pc.block_table.data(),
                    got[i].data()});
  }
  ThreadPool pool(3);
  for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
    PagedAttentionBatch(seqs.data(), 4, pc.view, params, tp);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << "seq " << i;
  }
}

// A prefill row's result does not depend on the other rows of its 16-row tile: the same 40
// tokens (3 heads a kv head, so tiles straddle tokens) attended in one chunk and in chunks of
// 7 and of 2 tokens (other tile boundaries, other key ranges a tile) give the same bits, on
// every ISA, also with a sliding window that starts inside a block.
TEST(PagedAttention, PrefillRowsDoNotDependOnTheirTile) {
  for (const int window : {0, 21}) {
    Case c{"tiles", 6, 2, 64, 64, 40, 0, DType::kF16, window};
    SCOPED_TRACE(window);
    const Data data = MakeData(c, 9);
    PagedCache pc = FilledCache(c, data, 10);
    const AttentionParams params = Params(c, 0.125f);
    const int64_t row = c.n_heads * c.head_dim;
    const Isa saved = ActiveIsa();
    for (Isa isa : AllIsas()) {
      SCOPED_TRACE(IsaName(isa));
      SetActiveIsa(isa);
      std::vector<float> whole(c.n_q * row, -1.f);
      PagedAttention(data.q.data(), c.n_q, 0, pc.view, pc.block_table.data(), params,
                     whole.data(), nullptr);
      for (const int64_t chunk : {7, 2}) {
        std::vector<float> parts(c.n_q * row, -1.f);
        for (int64_t t = 0; t < c.n_q; t += chunk) {
          const int64_t n = std::min(chunk, c.n_q - t);
          PagedAttention(data.q.data() + t * row, n, t, pc.view, pc.block_table.data(), params,
                         parts.data() + t * row, nullptr);
        }
        EXPECT_EQ(parts, whole) << "chunks of " << chunk;
      }
    }
    SetActiveIsa(saved);
  }
}

// A decode batch (one token a sequence, the engine's steady state): the heads of a kv head are
// one work item and the threads take contiguous ranges of tokens (7 tokens over 3 threads: 3,
// 3 and 1). Every sequence's output equals PagedAttention of it alone, bit for bit.
TEST(PagedAttention, DecodeBatchEqualsEachSequence) {
  const Case c{"decode_batch", 8, 2, 64, 64, 1, 60, DType::kF16};
  const Data data = MakeData(c, 4);
  PagedCache pc = FilledCache(c, data, 6);
  const AttentionParams params = Params(c, 0.125f);
  const int64_t row = c.n_heads * c.head_dim;
  const int64_t positions[] = {60, 3, 17, 0, 33, 48, 16};  // 7 sequences sharing the cache
  std::vector<std::vector<float>> want(7), got(7), qs(7);
  std::vector<AttentionSeq> seqs;
  for (int i = 0; i < 7; ++i) {
    qs[i] = data.q;  // the case's one query row, scaled: a different query each
    for (float& x : qs[i]) x *= 1.f + 0.1f * static_cast<float>(i);
    want[i].assign(row, 0.f);
    PagedAttention(qs[i].data(), 1, positions[i], pc.view, pc.block_table.data(), params,
                   want[i].data(), nullptr);
    got[i].assign(row, -1.f);
    seqs.push_back({qs[i].data(), 1, positions[i], pc.block_table.data(), got[i].data()});
  }
  ThreadPool pool(3);
  for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (auto& g : got) std::fill(g.begin(), g.end(), -1.f);
    PagedAttentionBatch(seqs.data(), 7, pc.view, params, tp);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(got[i], want[i]) << "seq " << i << " pool " << !!tp;
  }
}

// Decode tokens whose keys go in parts (kPartKeys) and tokens of one part give the same bits
// alone, together in a decode batch and in a batch with a prefill chunk, with and without a pool
// (the parts depend only on the token's own context).
TEST(PagedAttention, DecodeInPartsIsTheSameBitsInAnyBatch) {
  const Case c{"parts_batch", 8, 2, 64, 64, 1, 1100, DType::kF16};
  const Data data = MakeData(c, 12);
  PagedCache pc = FilledCache(c, data, 13);
  const AttentionParams params = Params(c, 0.125f);
  const int64_t row = c.n_heads * c.head_dim;
  const int64_t positions[] = {1100, 520, 256, 255, 90};
  constexpr int kN = 5;
  std::vector<std::vector<float>> qs(kN), want(kN), got(kN);
  std::vector<AttentionSeq> seqs;
  for (int i = 0; i < kN; ++i) {
    qs[i] = data.q;
    for (float& x : qs[i]) x *= 1.f - 0.1f * static_cast<float>(i);
    want[i].assign(row, 0.f);
    PagedAttention(qs[i].data(), 1, positions[i], pc.view, pc.block_table.data(), params,
                   want[i].data(), nullptr);
    got[i].assign(row, -1.f);
    seqs.push_back({qs[i].data(), 1, positions[i], pc.block_table.data(), got[i].data()});
  }
  // A prefill chunk of 4 tokens at 600 (queries from the decode rows) for the mixed batch.
  std::vector<float> chunk_q(4 * row), chunk_out(4 * row);
  for (int64_t i = 0; i < 4 * row; ++i) chunk_q[i] = qs[i / row][i % row];
  ThreadPool pool(3);
  for (const bool mixed : {false, true}) {
    std::vector<AttentionSeq> batch = seqs;
    if (mixed) batch.insert(batch.begin() + 2, {chunk_q.data(), 4, 600, pc.block_table.data(),
                                                chunk_out.data()});
    for (ThreadPool* tp : {static_cast<ThreadPool*>(nullptr), &pool}) {
      for (auto& g : got) std::fill(g.begin(), g.end(), -1.f);
      PagedAttentionBatch(batch.data(), static_cast<int64_t>(batch.size()), pc.view, params, tp);
      for (int i = 0; i < kN; ++i)
        EXPECT_EQ(got[i], want[i]) << "seq " << i << " mixed " << mixed << " pool " << !!tp;
    }
  }
}

TEST(KvWrite, F16BitsMatchScalarConversion) {
  const Isa saved = ActiveIsa();
  const int n_kv = 2, dim = 19;
  std::vector<float> k(n_kv * dim), v(n_kv * dim);
  for (int i = 0; i < n_kv * dim; ++i) {
    k[i] = std::ldexp(1.2345f + i, i - 24);  // spans fp16 subnormals to overflow
    v[i] = -0.1f * i;
  }
  for (Isa isa : AllIsas()) {
    SetActiveIsa(isa);
    std::vector<uint16_t> kc(2 * 4 * n_kv * dim), vc(kc.size());
    const KvLayerView view{kc.data(), vc.data(), DType::kF16, 2, 4, n_kv, dim, dim};
    const int32_t table[2] = {1, 0};
    KvWrite(view, table, 6, k.data(), v.data());  // logical block 1 -> physical 0, slot 2
    for (int i = 0; i < n_kv * dim; ++i) {
      EXPECT_EQ(kc[2 * n_kv * dim + i], F32ToF16(k[i])) << IsaName(isa) << " " << i;
      EXPECT_EQ(vc[2 * n_kv * dim + i], F32ToF16(v[i])) << IsaName(isa) << " " << i;
    }
  }
  SetActiveIsa(saved);
}

// The Q8_0 blocks of a row (ref::F32ToQ8_0Row): per 32 values an fp16 scale d = fp16(amax /
// 127) and q = round-to-nearest-even(x * 127 / amax): a run of 0 .. 31 / 4 (exact values), a
// run of zeros (d = 0, q = 0), and random runs, each value within d / 2 of x.
TEST(Q8_0Row, Blocks) {
  std::vector<float> x(128, 0.f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (int i = 0; i < 32; ++i) x[i] = 0.25f * static_cast<float>(i);
  for (int i = 64; i < 128; ++i) x[i] = u(rng);
  std::vector<uint8_t> y(RowBytes(DType::kQ8_0, 128));
  ref::F32ToQ8_0Row(x.data(), y.data(), 128);
  uint16_t d0;
  std::memcpy(&d0, y.data(), 2);
  EXPECT_EQ(d0, F32ToF16(7.75f / 127.f));  // amax of the first run: 31 / 4
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(static_cast<int8_t>(y[2 + i]), std::nearbyint(0.25f * i * (127.f / 7.75f))) << i;
  for (int i = 34; i < 68; ++i) EXPECT_EQ(y[i], 0) << i;
  std::vector<float> back(128);
  ref::Q8_0ToF32Row(y.data(), back.data(), 128);
  for (int i = 0; i < 128; ++i) {
    uint16_t d;
    std::memcpy(&d, y.data() + i / 32 * 34, 2);
    EXPECT_LE(std::fabs(back[i] - x[i]), 0.5f * F16ToF32(d) * 1.01f) << i;
  }
}

// ref::HadamardRows against the matrix H[i][j] = (-1)^popcount(i & j) / sqrt(n) in float64, runs
// of 32 and 64 over rows of 128; applied twice it gives the row back.
TEST(HadamardRows, IsTheOrthonormalMatrixAndItsOwnInverse) {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const int block : {32, 64}) {
    std::vector<float> x(3 * 128);
    for (float& v : x) v = u(rng);
    std::vector<float> y = x;
    ref::HadamardRows(y.data(), 3, 128, block);
    for (int r = 0; r < 3 * 128 / block; ++r) {
      for (int i = 0; i < block; ++i) {
        double want = 0;
        for (int j = 0; j < block; ++j)
          want += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[r * block + j];
        want /= std::sqrt(static_cast<double>(block));
        EXPECT_NEAR(y[r * block + i], want, 2e-6) << "block " << block << " run " << r;
      }
    }
    ref::HadamardRows(y.data(), 3, 128, block);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 2e-6) << i;
  }
}

// Every ISA's HadamardRows (the attentions' rotation of queries and outputs, and of the rows a
// Q8_0 cache stores) gives the reference's bits: runs of 64 and 32 (vectorised) and of 16 and
// 128 (the reference's loops).
TEST(HadamardRows, EveryIsaGivesTheReferenceBits) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> x(5 * 128);
  for (float& v : x) v = u(rng);
  const Isa saved = ActiveIsa();
  for (Isa isa : AllIsas()) {
    SetActiveIsa(isa);
    const AttnOps ops = SelectAttnOps();
    for (const int block : {64, 32, 16, 128}) {
      std::vector<float> want = x, got = x;
      ref::HadamardRows(want.data(), 5, 128, block);
      ops.hadamard(got.data(), 5, 128, block);
      EXPECT_EQ(got, want) << IsaName(isa) << " block " << block;
    }
  }
  SetActiveIsa(saved);
}

// KvWrite into a Q8_0 cache stores each head's row rotated in runs of 64 (head_dim 64) and then
// in Q8_0 blocks -- the same bytes on every ISA, neighbouring slots untouched -- and the row
// read back and rotated back is within the blocks' rounding of the input (an outlier of 40 in
// a row of values below 1, as Qwen2's keys have, leaves the other values far closer than the
// unrotated blocks would: d / 2 = 0.16 there).
TEST(KvWrite, Q8_0RowsRotated) {
  const Isa saved = ActiveIsa();
  const int n_kv = 2, dim = 64;
  std::vector<float> k(n_kv * dim), v(n_kv * dim);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  k[5] = 40.f;  // an outlier
  std::vector<float> rotated = k;
  ref::HadamardRows(rotated.data(), n_kv, dim, 64);
  const size_t row = RowBytes(DType::kQ8_0, n_kv * dim);
  std::vector<uint8_t> want(row);
  ref::F32ToQ8_0Row(rotated.data(), want.data(), n_kv * dim);
  for (Isa isa : AllIsas()) {
    SCOPED_TRACE(IsaName(isa));
    SetActiveIsa(isa);
    std::vector<uint8_t> kc(2 * 4 * row, 0xee), vc(kc.size(), 0xee);
    const KvLayerView view{kc.data(), vc.data(), DType::kQ8_0, 2, 4, n_kv, dim, dim};
    const int32_t table[2] = {1, 0};
    KvWrite(view, table, 6, k.data(), v.data());  // logical block 1 -> physical 0, slot 2
    const uint8_t* kr = kc.data() + 2 * row;
    EXPECT_EQ(std::vector<uint8_t>(kr, kr + row), want);
    EXPECT_EQ(kc[2 * row - 1], 0xee);  // slot 1 untouched
    EXPECT_EQ(kc[3 * row], 0xee);      // slot 3 untouched
    std::vector<float> back(n_kv * dim);
    ref::Q8_0ToF32Row(kr, back.data(), n_kv * dim);
    ref::HadamardRows(back.data(), n_kv, dim, 64);
    double err2 = 0, bound2 = 0;
    for (int i = 0; i < n_kv * dim; ++i) {
      uint16_t d;
      std::memcpy(&d, kr + i / 32 * 34, 2);
      err2 += (back[i] - k[i]) * (back[i] - k[i]);
      bound2 += 0.25 * F16ToF32(d) * F16ToF32(d);
      if (i != 5) {
        EXPECT_LT(std::fabs(back[i] - k[i]), 0.08f) << i;
      }
    }
    EXPECT_LE(err2, bound2 * 1.01);  // the rotation keeps the blocks' error's length
  }
  SetActiveIsa(saved);
}

}  // namespace
}  // namespace peng::kernels
