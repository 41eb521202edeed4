// Tests of MatMul / MatMulRows / DequantizeRow: GGUF fixtures from the gguf python package
// (exact), every SIMD ISA against the scalar reference (tight tolerance), the reference against
// a double-precision dot of dequantized operands, odd shapes, row slices and thread pools.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/cpu_features.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/quant_blocks.h"
#include "kernels/ref/matmul_ref.h"
#include "kernels/test_util.h"

namespace peng::kernels {
namespace {

const DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                           DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::string SourceDir() {
  if (const char* e = std::getenv("PENG_SOURCE_DIR")) return e;
#ifdef PENG_SOURCE_DIR
  return PENG_SOURCE_DIR;
#else
  return ".";
#endif
}

std::vector<char> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void PutF16(uint8_t* p, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(p, &h, 2);
}

// A random weight matrix [rows, cols] of type t: random bytes with finite fp16 scale fields.
std::vector<uint8_t> RandomWeights(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> w(RowBytes(t, cols) * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> scale(1e-3f, 0.05f);
  if (t == DType::kF32) {
    for (size_t i = 0; i < w.size() / 4; ++i) {
      const float v = normal(rng);
      std::memcpy(&w[4 * i], &v, 4);
    }
    return w;
  }
  if (t == DType::kF16 || t == DType::kBF16) {
    for (size_t i = 0; i < w.size() / 2; ++i) {
      const uint16_t h = t == DType::kF16 ? F32ToF16(normal(rng)) : F32ToBf16(normal(rng));
      std::memcpy(&w[2 * i], &h, 2);
    }
    return w;
  }
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const int bb = GetDTypeInfo(t).block_bytes;
  for (size_t off = 0; off < w.size(); off += bb) {
    uint8_t* b = &w[off];
    const float sign = byte(rng) & 1 ? 1.f : -1.f;
    switch (t) {
      case DType::kQ4_1:
      case DType::kQ5_1:
      case DType::kQ4_K:
      case DType::kQ5_K:
        PutF16(b, scale(rng));
        PutF16(b + 2, sign * scale(rng));
        break;
      case DType::kQ6_K:
        PutF16(b + 208, sign * scale(rng));
        break;
      default:
        PutF16(b, sign * scale(rng));
    }
  }
  return w;
}

// Random matrices of the given types and row counts, `cols` columns each, and views of them (the
// parts of a MatMulGroup).
struct RandomMatrices {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
};
template <size_t N>
RandomMatrices MakeMatrices(const DType (&types)[N], const int64_t (&rows)[N], int64_t cols,
                            std::mt19937& rng) {
  RandomMatrices m;
  m.bytes.resize(N);
  for (size_t i = 0; i < N; ++i) {
    m.bytes[i] = RandomWeights(types[i], rows[i], cols, rng);
    m.views.push_back(test_util::View(types[i], rows[i], cols, m.bytes[i]));
  }
  return m;
}

std::vector<float> RandomActs(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  x[n / 3] = 8.f;  // an outlier, as real activations have
  return x;
}

using test_util::View;

// y_ref[t * rows + r] from the scalar reference, and mag = sum |w| |x| (the error scale).
void Reference(DType t, const std::vector<uint8_t>& w, int64_t rows, int64_t cols,
               const std::vector<float>& x, int64_t n_tokens, std::vector<float>* y,
               std::vector<double>* mag) {
  y->assign(rows * n_tokens, 0.f);
  mag->assign(rows * n_tokens, 0.0);
  const size_t rb = RowBytes(t, cols);
  const bool quant = GetDTypeInfo(t).quantized;
  const int ab = quant ? ActBlockSize(t) : 1;
  std::vector<int8_t> qs(cols);
  std::vector<float> d(cols / ab), wf(cols);
  std::vector<int16_t> sums(cols / 16 + 1);
  for (int64_t tk = 0; tk < n_tokens; ++tk) {
    const float* xt = x.data() + tk * cols;
    if (quant) ref::QuantizeAct(xt, cols, ab, qs.data(), d.data(), sums.data());
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* wr = w.data() + r * rb;
      (*y)[tk * rows + r] = quant ? ref::VecDotQ(t, cols, wr, qs.data(), d.data(), sums.data())
                                  : ref::VecDotF(t, cols, wr, xt);
      ref::DequantizeRow(t, wr, wf.data(), cols);
      double m = 0;
      for (int64_t c = 0; c < cols; ++c) m += std::fabs(double{wf[c]} * xt[c]);
      (*mag)[tk * rows + r] = m;
    }
  }
}

int64_t ColsFor(DType t, int64_t blocks) {
  return GetDTypeInfo(t).quantized ? blocks * GetDTypeInfo(t).block_size : blocks * 32;
}

class MatMulTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  void TearDown() override { SetActiveIsa(BestIsa()); }
};

// DequantizeRow equals the values the gguf python package computes, bit for bit.
TEST_P(MatMulTypeTest, DequantizeMatchesGgufFixture) {
  const DType t = GetParam();
  if (t == DType::kF32) GTEST_SKIP() << "F32 is a copy";
  std::string name = DTypeName(t);
  for (auto& c : name) c = static_cast<char>(std::tolower(c));
  const std::string base = SourceDir() + "/tests/data/quant/" + name;
  const std::vector<char> raw = ReadFile(base + ".raw");
  const std::vector<char> want_bytes = ReadFile(base + ".f32");
  ASSERT_FALSE(raw.empty()) << base << ".raw missing (run tools/gen_quant_fixtures.py)";
  const int64_t n = static_cast<int64_t>(want_bytes.size() / 4);
  ASSERT_EQ(RowBytes(t, n), raw.size());
  std::vector<float> want(n), got(n);
  std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
  DequantizeRow(t, raw.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << name << " value " << i;
}

// Every supported ISA agrees with the scalar reference; the integer parts are exact, so only
// FP32 summation order differs: |err| <= 2e-6 * sum|w x|.
TEST_P(MatMulTypeTest, EveryIsaMatchesReference) {
  const DType t = GetParam();
  std::mt19937 rng(7);
  for (int64_t blocks : {1, 3, 8}) {
    const int64_t cols = ColsFor(t, blocks), rows = 37;
    const auto w = RandomWeights(t, rows, cols, rng);
    for (int64_t n_tokens : {1, 2, 3, 5, 17, 70}) {
      const auto x = RandomActs(cols * n_tokens, rng);
      std::vector<float> y_ref;
      std::vector<double> mag;
      Reference(t, w, rows, cols, x, n_tokens, &y_ref, &mag);
      for (Isa isa : kAllIsas) {
        if (!IsaSupported(isa)) continue;
        SetActiveIsa(isa);
        std::vector<float> y(rows * n_tokens, -1.f);
        MatMul(View(t, rows, cols, w), x.data(), n_tokens, y.data(), nullptr);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], y_ref[i], 2e-6 * mag[i] + 1e-30)
              << DTypeName(t) << " " << IsaName(isa) << " cols " << cols << " tokens " << n_tokens
              << " i " << i;
      }
    }
  }
}

// A token's outputs are bit-identical whether it is multiplied alone (decode) or in a batch
// (prefill): every level keeps the per-output arithmetic independent of the tile shape (the
// engine's batched greedy output relies on it; on i8mm smmla tiles vs the sdot decode tile).
TEST_P(MatMulTypeTest, EveryIsaIsBatchInvariant) {
  const DType t = GetParam();
  std::mt19937 rng(13);
  const int64_t cols = ColsFor(t, 4), rows = 23, n_tokens = 7;
  const auto w = RandomWeights(t, rows, cols, rng);
  const auto x = RandomActs(cols * n_tokens, rng);
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa)) continue;
    SetActiveIsa(isa);
    std::vector<float> batch(rows * n_tokens), one(rows);
    MatMul(View(t, rows, cols, w), x.data(), n_tokens, batch.data(), nullptr);
    for (int64_t tk = 0; tk < n_tokens; ++tk) {
      MatMul(View(t, rows, cols, w), x.data() + tk * cols, 1, one.data(), nullptr);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(batch[tk * rows + r], one[r])
            << DTypeName(t) << " " << IsaName(isa) << " token " << tk << " row " << r;
    }
  }
}

// The types AVX-512 packs into panels at load time (PackPanels).
bool HasAvx512Panels(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ6_K || t == DType::kF32 ||
         t == DType::kF16 || t == DType::kBF16;
}

// Weights packed at load time into the active ISA's panels give the row-major results bit for
// bit: decode and batches of every tile width, a row count that leaves a partial last panel, an
// odd block count (float rows: a partial column step), row slices on a panel boundary (the
// packed path) and off it (the row-major path), one thread and two.
TEST_P(MatMulTypeTest, PackedPanelsGiveTheRowMajorResults) {
  const DType t = GetParam();
  ThreadPool pool(2);
  bool packed_any = false;
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa)) continue;
    SetActiveIsa(isa);
    for (const int64_t rows : {16, 41}) {
      std::mt19937 rng(static_cast<unsigned>(rows) * 7 + 3);
      // (float rows: a partial last 16-column step, zero padding in the panels)
      const int64_t cols = GetDTypeInfo(t).quantized
                               ? ColsFor(t, GetDTypeInfo(t).block_size == 32 ? 3 : 2)
                               : 72;
      const auto w = RandomWeights(t, rows, cols, rng);
      const int64_t n_tokens = 9;
      const auto x = RandomActs(cols * n_tokens, rng);
      TensorView plain = View(t, rows, cols, w), packed = plain;
      const std::shared_ptr<const uint8_t> panels = PackPanels(plain);
      const bool expect_panels = isa == Isa::kAvx512 && HasAvx512Panels(t);
      ASSERT_EQ(panels != nullptr, expect_panels) << DTypeName(t) << " " << IsaName(isa);
      if (!panels) continue;
      packed_any = true;
      packed.panels = panels.get();
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        for (const int64_t nt : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, n_tokens}) {
          for (const bool exact : {false, true}) {  // (exact: the F32 copy, without panels)
            SetExactActivations(exact);
            std::vector<float> want(rows * nt), got(rows * nt);
            MatMul(packed, x.data(), nt, got.data(), p);  // (first: exact mode's F32 copy of
            MatMul(plain, x.data(), nt, want.data(), p);  // the weights is made from it)
            SetExactActivations(false);
            ASSERT_EQ(want, got) << DTypeName(t) << " rows " << rows << " tokens " << nt
                                 << (exact ? " exact" : "");
          }
        }
        for (const int64_t begin : {int64_t{16}, int64_t{5}}) {
          const int64_t n = rows - begin;
          std::vector<float> want(n * 2), got(n * 2);
          MatMulRows(plain, begin, rows, x.data(), 2, want.data(), n, p);
          MatMulRows(packed, begin, rows, x.data(), 2, got.data(), n, p);
          ASSERT_EQ(want, got) << DTypeName(t) << " rows " << begin << ".." << rows;
        }
      }
    }
  }
  if (IsaSupported(Isa::kAvx512) && HasAvx512Panels(t)) {
    EXPECT_TRUE(packed_any);
  }
}

// The same for any row slice and any sub-batch: a token's output of a row is bit-identical
// whether it comes from the whole matrix and a 65-token batch (a 64-token chunk and a
// one-token chunk), from a slice that starts on an odd row or holds a single row (on i8mm the
// row is then paired with a different partner or with itself in the smmla tile), alone
// (decode path) or in batches of 2 and 3 tokens starting anywhere.
TEST_P(MatMulTypeTest, EveryIsaIsInvariantToSlicesAndChunks) {
  const DType t = GetParam();
  std::mt19937 rng(17);
  const int64_t cols = ColsFor(t, 2), rows = 21, n_tokens = 65;
  const auto w = RandomWeights(t, rows, cols, rng);
  const auto x = RandomActs(cols * n_tokens, rng);
  const TensorView v = View(t, rows, cols, w);
  const int64_t slices[][2] = {{0, 21}, {1, 4}, {7, 8}, {9, 20}, {20, 21}};
  const int64_t batches[][2] = {{0, 1}, {3, 1}, {64, 1}, {0, 2}, {5, 2}, {62, 3}, {63, 2}};
  for (Isa isa : kAllIsas) {
    if (!IsaSupported(isa)) continue;
    SetActiveIsa(isa);
    std::vector<float> full(rows * n_tokens);
    MatMul(v, x.data(), n_tokens, full.data(), nullptr);
    for (const auto& s : slices)
      for (const auto& bt : batches) {
        const int64_t n = s[1] - s[0], t0 = bt[0], nt = bt[1];
        std::vector<float> y(n * nt, 42.f);
        MatMulRows(v, s[0], s[1], x.data() + t0 * cols, nt, y.data(), n, nullptr);
        for (int64_t tk = 0; tk < nt; ++tk)
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(y[tk * n + i], full[(t0 + tk) * rows + s[0] + i])
                << DTypeName(t) << " " << IsaName(isa) << " rows [" << s[0] << ", " << s[1]
                << ") token " << t0 + tk << " of a batch of " << nt;
      }
  }
}

// The reference equals a double-precision dot of the dequantized weights with the dequantized
// quantized activations, and stays close to the unquantized product.
TEST_P(MatMulTypeTest, ReferenceMatchesDoubleDot) {
  const DType t = GetParam();
  std::mt19937 rng(11);
  const int64_t cols = ColsFor(t, 4), rows = 9;
  const auto w = RandomWeights(t, rows, cols, rng);
  const auto x = RandomActs(cols, rng);
  const bool quant = GetDTypeInfo(t).quantized;
  const int ab = quant ? ActBlockSize(t) : 1;
  std::vector<int8_t> qs(cols);
  std::vector<float> d(cols / ab), xa(x), wf(cols);
  std::vector<int16_t> sums(cols / 16);
  if (quant) {
    ref::QuantizeAct(x.data(), cols, ab, qs.data(), d.data(), sums.data());
    for (int64_t c = 0; c < cols; ++c) xa[c] = static_cast<float>(qs[c]) * d[c / ab];
    for (int64_t g = 0; g < cols / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += qs[16 * g + i];
      EXPECT_EQ(sums[g], s);
    }
  }
  std::vector<float> y(rows);
  MatMul(View(t, rows, cols, w), x.data(), 1, y.data(), nullptr);
  const size_t rb = RowBytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) {
    ref::DequantizeRow(t, w.data() + r * rb, wf.data(), cols);
    double exact = 0, unquant = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) {
      exact += double{wf[c]} * xa[c];
      unquant += double{wf[c]} * x[c];
      mag += std::fabs(double{wf[c]} * x[c]);
    }
    EXPECT_NEAR(y[r], exact, 2e-6 * mag) << DTypeName(t) << " row " << r;
    EXPECT_NEAR(y[r], unquant, 0.02 * mag) << DTypeName(t) << " row " << r;
  }
}

// Row slices write y[t * ldy + (r - row_begin)] and leave the rest of y alone; pools of 1 and
// 2 threads give the same bits as no pool.
TEST_P(MatMulTypeTest, RowsSlicesAndPools) {
  const DType t = GetParam();
  std::mt19937 rng(5);
  const int64_t cols = ColsFor(t, 2), rows = 70, n_tokens = 3, ldy = 50;
  const auto w = RandomWeights(t, rows, cols, rng);
  const auto x = RandomActs(cols * n_tokens, rng);
  const TensorView v = View(t, rows, cols, w);
  std::vector<float> full(rows * n_tokens);
  MatMul(v, x.data(), n_tokens, full.data(), nullptr);
  ThreadPool pool1(1), pool2(2);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool2}) {
    std::vector<float> y2(rows * n_tokens);
    MatMul(v, x.data(), n_tokens, y2.data(), pool);
    EXPECT_EQ(y2, full);
    std::vector<float> y(ldy * n_tokens, 42.f);
    MatMulRows(v, 13, 56, x.data(), n_tokens, y.data(), ldy, pool);
    for (int64_t tk = 0; tk < n_tokens; ++tk)
      for (int64_t i = 0; i < ldy; ++i) {
        const float want = i < 43 ? full[tk * rows + 13 + i] : 42.f;
        ASSERT_EQ(y[tk * ldy + i], want) << DTypeName(t) << " t " << tk << " i " << i;
      }
  }
}

// MatMulGroup over matrices of mixed types (both activation block sizes, float and quantized)
// and inputs (shared and per part) gives exactly each matrix's own MatMul, for GEMV and GEMM and
// for pools of 1, 2 and 3 threads (a GEMV's byte-balanced cuts fall inside and between the
// matrices; a GEMM's units are dealt dynamically, see the next test).
TEST(MatMulTest, GroupEqualsSeparateProducts) {
  std::mt19937 rng(11);
  const int64_t cols = 512;
  const DType types[] = {DType::kQ5_0, DType::kQ4_K, DType::kF16, DType::kQ8_0, DType::kQ6_K};
  const int64_t rows[] = {200, 48, 17, 130, 64};
  constexpr int n = 5;
  const RandomMatrices m = MakeMatrices(types, rows, cols, rng);
  const std::vector<TensorView>& v = m.views;
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (int64_t n_tokens : {1, 7}) {
    const auto x = RandomActs(cols * n_tokens, rng);
    const auto own_x = RandomActs(cols * n_tokens, rng);  // parts 1 and 3 have their own input
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool2, &pool3}) {
      std::vector<std::vector<float>> want(n), got(n);
      MatMulOut outs[n];
      for (int i = 0; i < n; ++i) {
        const float* xi = i % 2 == 1 ? own_x.data() : nullptr;
        want[i].resize(rows[i] * n_tokens);
        got[i].assign(rows[i] * n_tokens, 42.f);
        MatMul(v[i], xi ? xi : x.data(), n_tokens, want[i].data(), nullptr);
        outs[i] = {&v[i], got[i].data(), xi};
      }
      MatMulGroup(outs, n, x.data(), n_tokens, pool);
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(got[i], want[i]) << DTypeName(types[i]) << " tokens " << n_tokens << " threads "
                                   << (pool ? pool->num_threads() : 0);
    }
  }
}

// Several tokens deal 16-row units to the threads from a shared counter (matmul.cc,
// RunPartsDynamic) in chunks of several units: chunks that start in one matrix and end in the
// next, matrices whose last unit is partial, and more threads than the machine has still
// compute every row once and exactly as one thread does.
TEST(MatMulTest, DynamicChunksSpanMatricesAndCoverEveryRowOnce) {
  std::mt19937 rng(13);
  const int64_t cols = 256, n_tokens = 5;
  const DType types[] = {DType::kQ8_0, DType::kQ4_K, DType::kQ4_1};
  const int64_t rows[] = {40, 33, 1000};  // units 3 + 3 + 63: chunks of 4 (2 threads), 2 (4)
  constexpr int n = 3;
  const RandomMatrices m = MakeMatrices(types, rows, cols, rng);
  const auto x = RandomActs(cols * n_tokens, rng);
  std::vector<std::vector<float>> want(n);  // one thread
  for (int i = 0; i < n; ++i) {
    want[i].resize(rows[i] * n_tokens);
    MatMul(m.views[i], x.data(), n_tokens, want[i].data(), nullptr);
  }
  ThreadPool pool2(2), pool4(4);
  for (ThreadPool* pool : {&pool2, &pool4}) {
    for (int rep = 0; rep < 3; ++rep) {  // the chunks go to different threads each time
      std::vector<std::vector<float>> got(n);
      MatMulOut outs[n];
      for (int i = 0; i < n; ++i) {
        got[i].assign(rows[i] * n_tokens, 42.f);
        outs[i] = {&m.views[i], got[i].data(), nullptr};
      }
      MatMulGroup(outs, n, x.data(), n_tokens, pool);
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(got[i], want[i]) << DTypeName(types[i]) << " threads " << pool->num_threads();
    }
    std::vector<float> got(rows[2] * n_tokens, 42.f);  // one matrix alone (MatMul)
    MatMul(m.views[2], x.data(), n_tokens, got.data(), pool);
    ASSERT_EQ(got, want[2]);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTypeTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// IsaName / BestIsa / IsaSupported agree: names are unique and round-trip through PENG_ISA's
// spelling, the best level is supported, each ARM64 level implies the ones below it, and (when
// the test runner says which CPU it emulates, scripts/test_arm64.sh) the runtime choice is the
// expected one: PENG_EXPECT_ISA=dotprod under -cpu cortex-a76, i8mm under -cpu max.
TEST(MatMulTest, IsaLevelsAreCoherent) {
  std::printf("cpu features: %s; best ISA: %s\n", GetCpuFeatures().ToString().c_str(),
              IsaName(BestIsa()));
  EXPECT_TRUE(IsaSupported(BestIsa()));
  EXPECT_TRUE(IsaSupported(Isa::kScalar));
  for (Isa a : kAllIsas) {
    for (Isa b : kAllIsas) {
      if (a != b) {
        EXPECT_STRNE(IsaName(a), IsaName(b));
      }
    }
  }
  if (IsaSupported(Isa::kNeonI8mm)) {
    EXPECT_TRUE(IsaSupported(Isa::kNeonDot));
  }
  if (IsaSupported(Isa::kNeonDot)) {
    EXPECT_TRUE(IsaSupported(Isa::kNeon));
  }
#if defined(__aarch64__)
  EXPECT_TRUE(IsaSupported(Isa::kNeon));
  EXPECT_FALSE(IsaSupported(Isa::kAvx2));
  EXPECT_EQ(IsaSupported(Isa::kNeonDot), GetCpuFeatures().dotprod && GetCpuFeatures().fp16);
#else
  EXPECT_FALSE(IsaSupported(Isa::kNeon));
  EXPECT_FALSE(IsaSupported(Isa::kNeonDot));
  EXPECT_FALSE(IsaSupported(Isa::kNeonI8mm));
#endif
  if (const char* want = std::getenv("PENG_EXPECT_ISA")) {
    EXPECT_STREQ(IsaName(BestIsa()), want);
  }
}

TEST(MatMulTest, Supports) {
  for (DType t : kAllTypes) EXPECT_TRUE(MatMulSupports(t)) << DTypeName(t);
  EXPECT_FALSE(MatMulSupports(DType::kQ2_K));
  EXPECT_FALSE(MatMulSupports(DType::kI32));
}

QuantizeActFn QuantizerOf(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx2) return Avx2QuantizeAct();
  if (isa == Isa::kAvx512) return Avx512QuantizeAct();
#elif defined(__aarch64__)
  if (isa == Isa::kNeon || isa == Isa::kNeonDot || isa == Isa::kNeonI8mm) return NeonQuantizeAct();
#endif
  return &ref::QuantizeAct;
}

// Every ISA's activation quantizer gives the reference's bytes, scales and sums exactly: 32- and
// 256-value blocks, row lengths that leave a partial group of 16 blocks, all-zero blocks, and
// scales in fp16's subnormal range (rounded by vcvtps2ph in the AVX-512 path).
TEST(MatMulTest, EveryIsaQuantizesActivationsLikeTheReference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (int ab : {32, 256}) {
    for (int64_t blocks : {1, 15, 16, 17, 40}) {
      const int64_t n = ab * blocks;
      std::vector<float> x(n);
      for (float& v : x) v = u(rng);
      for (int64_t i = 0; i < ab; ++i) x[i] = 0.f;  // block 0: all zero
      if (blocks > 2)
        for (int64_t i = 2 * ab; i < 3 * ab; ++i) x[i] *= 1e-6f;  // block 2: subnormal fp16 d
      std::vector<int8_t> q_ref(n), q(n);
      std::vector<float> d_ref(blocks), d(blocks);
      std::vector<int16_t> s_ref(n / 16), s(n / 16);
      ref::QuantizeAct(x.data(), n, ab, q_ref.data(), d_ref.data(), s_ref.data());
      for (Isa isa : kAllIsas) {
        if (!IsaSupported(isa)) continue;
        SCOPED_TRACE(std::string(IsaName(isa)) + " ab " + std::to_string(ab) + " blocks " +
                     std::to_string(blocks));
        QuantizerOf(isa)(x.data(), n, ab, q.data(), d.data(), s.data());
        EXPECT_EQ(q, q_ref);
        EXPECT_EQ(d, d_ref);
        EXPECT_EQ(s, s_ref);
      }
    }
  }
}

TEST(MatMulTest, QuantizeActExactValues) {
  float x[32] = {};
  x[0] = 1.f;
  x[1] = -0.5f;
  x[2] = 2.54f;
  x[31] = -2.54f;
  int8_t qs[32];
  float d;
  int16_t sums[2];
  ref::QuantizeAct(x, 32, 32, qs, &d, sums);
  EXPECT_EQ(d, F16ToF32(F32ToF16(2.54f / 127.f)));  // Q8_0 keeps an fp16 scale
  EXPECT_EQ(qs[0], 50);
  EXPECT_EQ(qs[1], -25);
  EXPECT_EQ(qs[2], 127);
  EXPECT_EQ(qs[31], -127);
  EXPECT_EQ(sums[0], 50 - 25 + 127);
  EXPECT_EQ(sums[1], -127);
  // 256-value (Q8_K) blocks keep 1 / (127 / amax) in fp32.
  float y[256] = {};
  y[7] = -3.f;
  y[100] = 1.f;
  int8_t q2[256];
  int16_t s2[16];
  ref::QuantizeAct(y, 256, 256, q2, &d, s2);
  EXPECT_EQ(d, 1.f / (127.f / 3.f));
  EXPECT_EQ(q2[7], -127);
  EXPECT_EQ(q2[100], 42);  // 1 * 127/3 = 42.33
}

}  // namespace
}  // namespace peng::kernels
