// MLA latent-cache kernels against a plain double-precision reference: rows written through a
// scrambled block table read back unchanged (F32), fp16-rounded (F16) or through 32-value
// blocks (Q8_0), and the absorbed
// attention equals softmax(scale * q . row) weighted sums of the rows' latent parts.
#include "kernels/mla.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/attention_ops.h"
#include "kernels/isa.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {
namespace {

struct Cache {
  std::vector<uint8_t> bytes;
  KvLayerView view;
  std::vector<int32_t> table;
};

Cache MakeCache(DType dtype, int block_size, int64_t blocks, int row) {
  Cache c;
  c.bytes.assign(RowBytes(dtype, blocks * block_size * row), 0);
  c.view.k = c.bytes.data();
  c.view.v = c.bytes.data() + c.bytes.size();
  c.view.dtype = dtype;
  c.view.num_blocks = blocks;
  c.view.block_size = block_size;
  c.view.n_kv_heads = 1;
  c.view.head_dim = row;
  c.view.v_head_dim = 0;
  for (int64_t b = 0; b < blocks; ++b)
    c.table.push_back(static_cast<int32_t>((b * 5 + 2) % blocks));
  return c;
}

TEST(MlaTest, LayoutCheck) {
  Cache c = MakeCache(DType::kF32, 4, 8, 24);
  EXPECT_TRUE(IsMlaLayout(c.view, 24));
  EXPECT_FALSE(IsMlaLayout(c.view, 25));
  KvLayerView dense = c.view;
  dense.n_kv_heads = 2;
  EXPECT_FALSE(IsMlaLayout(dense, 24));
  dense = c.view;
  dense.v_head_dim = 24;
  EXPECT_FALSE(IsMlaLayout(dense, 24));
}

// What a cache row holds, read back: F32 the values, F16 each rounded to fp16, Q8_0 the row
// rotated (ref::HadamardRows in runs of RotationBlock), in 32-value blocks (ref::F32ToQ8_0Row),
// read back and rotated back.
std::vector<float> Stored(DType dt, const float* x, int n, int row) {
  std::vector<float> out(x, x + n);
  if (dt == DType::kF16) {
    for (float& v : out) v = F16ToF32(F32ToF16(v));
  } else if (dt == DType::kQ8_0) {
    std::vector<uint8_t> blocks(RowBytes(dt, row));
    for (int i = 0; i < n; i += row) {
      ref::HadamardRows(out.data() + i, 1, row, RotationBlock(row));
      ref::F32ToQ8_0Row(out.data() + i, blocks.data(), row);
      ref::Q8_0ToF32Row(blocks.data(), out.data() + i, row);
      ref::HadamardRows(out.data() + i, 1, row, RotationBlock(row));
    }
  }
  return out;
}

TEST(MlaTest, WriteReadRoundTrip) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(DTypeName(dt));
    const int row = dt == DType::kQ8_0 ? 96 : 13;
    Cache c = MakeCache(dt, 4, 8, row);
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> rows(30 * row), back(30 * row);
    for (float& v : rows) v = nd(rng);
    for (int p = 0; p < 30; ++p) MlaKvWrite(c.view, c.table.data(), p, rows.data() + p * row);
    MlaKvRead(c.view, c.table.data(), 0, 30, back.data());
    EXPECT_EQ(back, Stored(dt, rows.data(), 30 * row, row));
    back.resize(5 * row);
    MlaKvRead(c.view, c.table.data(), 7, 5, back.data());
    EXPECT_EQ(back, Stored(dt, rows.data() + 7 * row, 5 * row, row));
  }
}

// MlaPagedAttention of n_q queries from pos0 (H heads, rows of r = 20 latent values and 6 of
// k_pe -- 64 and 32 for a Q8_0 cache, whose rows are whole 32-value blocks --, an F32, F16 or
// Q8_0 cache in shuffled blocks of `block_size`) against a float64 softmax over the rows the
// cache holds; returns its output.
std::vector<float> ExpectMatchesReference(DType dt, int H, int64_t n_q, int64_t pos0,
                                          int block_size, ThreadPool* pool) {
  const bool q8 = dt == DType::kQ8_0;
  const int r = q8 ? 64 : 20, dr = q8 ? 32 : 6, row = r + dr;
  const float scale = q8 ? 0.15f : 0.3f;
  const int64_t end = pos0 + n_q;
  int64_t blocks = (end + block_size - 1) / block_size;
  if (blocks % 5 == 0) ++blocks;  // (MakeCache's table, (5 b + 2) mod blocks, a permutation)
  Cache c = MakeCache(dt, block_size, blocks, row);
  std::mt19937 rng(static_cast<unsigned>(pos0 + 17));
  std::normal_distribution<float> nd;
  std::vector<float> rows(end * row);
  for (float& v : rows) v = nd(rng);
  for (int64_t p = 0; p < end; ++p) MlaKvWrite(c.view, c.table.data(), p, rows.data() + p * row);
  const std::vector<float> stored = Stored(dt, rows.data(), static_cast<int>(end * row), row);
  std::vector<float> q(n_q * H * row), out(n_q * H * r, -1.f);
  for (float& v : q) v = nd(rng);
  MlaParams p;
  p.n_heads = H;
  p.kv_lora_rank = r;
  p.scale = scale;
  MlaPagedAttention(q.data(), n_q, pos0, c.view, c.table.data(), p, out.data(), pool);
  for (int64_t t = 0; t < n_q; ++t) {
    for (int h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * row;
      const int64_t pos = pos0 + t;
      std::vector<double> s(pos + 1);
      double m = -INFINITY, sum = 0;
      for (int64_t u = 0; u <= pos; ++u) {
        double d = 0;
        for (int j = 0; j < row; ++j) d += double{qh[j]} * stored[u * row + j];
        s[u] = d * scale;
        m = std::max(m, s[u]);
      }
      for (double& v : s) sum += v = std::exp(v - m);
      for (int j = 0; j < r; ++j) {
        double want = 0;
        for (int64_t u = 0; u <= pos; ++u) want += s[u] / sum * stored[u * row + j];
        EXPECT_NEAR(out[(t * H + h) * r + j], want, 2e-5 * (1 + std::abs(want)))
            << "token " << t << " head " << h << " dim " << j;
      }
    }
  }
  return out;
}

TEST(MlaTest, AttentionMatchesReference) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (int64_t pos0 : {0, 5, 9}) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + " threads " + std::to_string(threads) + " pos0 " +
                     std::to_string(pos0));
        ExpectMatchesReference(dt, 3, 7, pos0, 4, &pool);
      }
    }
  }
}

// A decode token's heads as the lanes of query tiles, its keys in parts of 128: positions 0, 127
// (one part), 128 (a last part of one key) and 300 (three parts), 3 heads and 20 (tiles of 16
// and 4), F32, F16 and Q8_0 caches, on every ISA this CPU runs; with a pool of 3 the heads go in
// smaller tiles (more items) and the results are the same bits.
TEST(MlaTest, DecodeInTilesMatchesReference) {
  ThreadPool pool(3);
  const Isa saved = ActiveIsa();
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa)) continue;
    SetActiveIsa(isa);
    for (DType dt : {DType::kF32, DType::kF16, DType::kQ8_0}) {
      for (int H : {3, 20}) {
        for (int64_t pos : {0, 127, 128, 300}) {
          SCOPED_TRACE(std::string(IsaName(isa)) + " " + DTypeName(dt) + " heads " +
                       std::to_string(H) + " pos " + std::to_string(pos));
          const std::vector<float> alone = ExpectMatchesReference(dt, H, 1, pos, 16, nullptr);
          EXPECT_EQ(ExpectMatchesReference(dt, H, 1, pos, 16, &pool), alone);
        }
      }
    }
  }
  SetActiveIsa(saved);
}

// Absorbed (MlaAbsorbQuery -> MlaPagedAttention -> MlaProjectOutput) and expanded
// (MlaExpandedAttention over k_nope / v = kv_b . c) forms against the plain per-head formula:
// 5 queries (one part-filled tile of the expanded form) from 0 and 6, and 40 queries (tiles of
// 16, 16 and 8) from 70 (chunks of keys past some rows' positions), the expanded form on every
// ISA this CPU runs.
TEST(MlaTest, AbsorbedAndExpandedFormsMatchPlainAttention) {
  const int H = 3, r = 20, dn = 8, dr = 6, dv = 5, row = r + dr, dqk = dn + dr;
  const float scale = 0.25f;
  MlaParams p;
  p.n_heads = H;
  p.kv_lora_rank = r;
  p.d_nope = dn;
  p.d_rope = dr;
  p.d_v = dv;
  p.scale = scale;
  ThreadPool pool(2);
  const Isa saved = ActiveIsa();
  for (const auto& [n_q, pos0] : {std::pair<int64_t, int64_t>{5, 0}, {5, 6}, {40, 70}}) {
    const int64_t end = pos0 + n_q;
    Cache c = MakeCache(DType::kF32, 4, (end + 3) / 4, row);
    std::mt19937 rng(static_cast<unsigned>(pos0 + 3));
    std::normal_distribution<float> nd;
    std::vector<float> rows(end * row), w_kvb(H * (dn + dv) * r), q(n_q * H * dqk);
    for (float& v : rows) v = nd(rng);
    for (float& v : w_kvb) v = 0.3f * nd(rng);
    for (float& v : q) v = nd(rng);
    for (int64_t u = 0; u < end; ++u) MlaKvWrite(c.view, c.table.data(), u, rows.data() + u * row);
    // Plain: k_nope / v per head and position, then softmax attention.
    std::vector<float> kv(end * H * (dn + dv));
    for (int64_t u = 0; u < end; ++u)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < dn + dv; ++j) {
          double a = 0;
          for (int k = 0; k < r; ++k)
            a += double{w_kvb[(h * (dn + dv) + j) * r + k]} * rows[u * row + k];
          kv[(u * H + h) * (dn + dv) + j] = static_cast<float>(a);
        }
    std::vector<double> want(n_q * H * dv);
    for (int64_t t = 0; t < n_q; ++t)
      for (int h = 0; h < H; ++h) {
        const float* qh = q.data() + (t * H + h) * dqk;
        std::vector<double> s(pos0 + t + 1);
        double m = -INFINITY, sum = 0;
        for (int64_t u = 0; u <= pos0 + t; ++u) {
          double d = 0;
          for (int j = 0; j < dn; ++j) d += double{qh[j]} * kv[(u * H + h) * (dn + dv) + j];
          for (int j = 0; j < dr; ++j) d += double{qh[dn + j]} * rows[u * row + r + j];
          s[u] = d * scale;
          m = std::max(m, s[u]);
        }
        for (double& v : s) sum += v = std::exp(v - m);
        for (int k = 0; k < dv; ++k) {
          double o = 0;
          for (int64_t u = 0; u <= pos0 + t; ++u)
            o += s[u] / sum * kv[(u * H + h) * (dn + dv) + dn + k];
          want[(t * H + h) * dv + k] = o;
        }
      }
    std::vector<float> ql(n_q * H * row), ol(n_q * H * r), absorbed(n_q * H * dv),
        expanded(n_q * H * dv);
    MlaAbsorbQuery(q.data(), n_q, w_kvb.data(), p, ql.data(), &pool);
    MlaPagedAttention(ql.data(), n_q, pos0, c.view, c.table.data(), p, ol.data(), &pool);
    MlaProjectOutput(ol.data(), n_q, w_kvb.data(), p, absorbed.data(), &pool);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(absorbed[i], want[i], 2e-5 * (1 + std::abs(want[i]))) << "absorbed " << i;
    for (Isa isa : kAllIsas) {
      if (!IsaSupported(isa)) continue;
      SetActiveIsa(isa);
      std::fill(expanded.begin(), expanded.end(), -1.f);
      MlaExpandedAttention(q.data(), n_q, pos0, kv.data(), rows.data(), p, expanded.data(),
                           &pool);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(expanded[i], want[i], 2e-5 * (1 + std::abs(want[i])))
            << "expanded " << i << " n_q " << n_q << " " << IsaName(isa);
      }
    }
    SetActiveIsa(saved);
  }
}

}  // namespace
}  // namespace peng::kernels
