// backend::Device on one NVIDIA GPU. Weights are uploaded once in their stored type, in the
// device layout (weight_layout.h: the 32-value block formats as per-field arrays); every
// quantized format is decoded inside the kernels 32 values (one "unit") at a time:
//   GEMV (n_tokens <= kGemvMaxTokens), block-quantized and INT8 W8A8 weights: the activations
//     quantized as the CPU quantizes them (once for all the matrices that share them, inside
//     the RMSNorm or activation kernel before where there is one); one to four warps an output
//     row, a unit a lane, dp4a against up to kTokenTile tokens; the epilogue (INT8's row scale,
//     bias, residual add) in the store; from kQMmaMinTokens tokens on, the same arithmetic on
//     the tensor cores (qmma_kernels.cuh: tiles of 16 rows and 32 tokens, int8 mma.sync).
//     Exact mode (kernels::SetExactActivations), float and INT8 W8A16 weights: FP32
//     activations, lane l decoding value l of each unit.
//   GEMM (prefill): the matrix is decoded into an FP16 scratch copy and multiplied by the FP16
//     activations (a row past 2^15 scaled by a power of two) with cublasGemmEx (FP32
//     accumulation, CUBLAS_COMPUTE_32F).
//   MoE prefill: the (token, slot) pairs grouped by expert, an expert's rows read once a tile
//     (of 32 pairs on the tensor cores, of 8 by dp4a).
// Paged attention in decode steps runs one thread block per (token, head) over the sequence's
// blocks, each warp scoring 32 keys at a time with its own online softmax, merged across warps
// at the end; steps with prompts take tiles of a sequence's (token, head) rows that read each
// key once for all of them -- on the tensor cores (mma.sync, FP16 operands, FP32 accumulation)
// over an F16 cache outside exact mode, else on the FP32 cores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/attention_mma_kernels.cuh"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/logits_kernels.cuh"
#include "backend/cuda/mla_kernels.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/qmma_kernels.cuh"
#include "backend/cuda/runtime.h"
#include "kernels/ops.h"
#ifdef PENG_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif

namespace peng::backend::cuda {
namespace {

// The activations a product takes: FP32, or quantized -- in blocks of 32 or 256 (the GGUF
// formats' activation blocks) or in INT8 W8A8's groups of 32 -- each form in a scratch region
// of its own (CudaDevice::ActOut: region format - 1).
enum ActFormat : int { kFp32Act = 0, kBlocks32, kBlocks256, kW8A8Groups };
// The kernels' two quantizer slots (q32, q256) for a format: its QActOut in the one it fills.
QActOut Q32Slot(ActFormat f, const QActOut& q) { return f == kBlocks256 ? QActOut{} : q; }
QActOut Q256Slot(ActFormat f, const QActOut& q) { return f == kBlocks256 ? q : QActOut{}; }

static_assert(kTopMax == Device::kTopLogitsMax && kTopWide == Device::kTopLogitsWide);

class CudaDevice final : public Device {
 public:
  ~CudaDevice() override {
    cudaSetDevice(index_);
    cudaStreamSynchronize(stream_);
    ClearGraphs();
    for (void* p : blocks_) cudaFree(p);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  static StatusOr<std::unique_ptr<Device>> Open(int index) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return NotFound(std::string("no CUDA device: ") + cudaGetErrorString(e));
    if (index >= n)
      return InvalidArgument("cuda:" + std::to_string(index) + ": this machine has " +
                             std::to_string(n) + " CUDA device(s)");
    std::unique_ptr<CudaDevice> d(new CudaDevice());
    d->index_ = index;
    PENG_RETURN_IF_ERROR(Check(cudaSetDevice(index), "cudaSetDevice"));
    cudaDeviceProp prop{};
    PENG_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties"));
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", prop.totalGlobalMem / 1073741824.0);
    d->sm_count_ = prop.multiProcessorCount;
    d->name_ = "cuda:" + std::to_string(index) + " (" + prop.name + ", " + mem + ", sm_" +
               std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    PENG_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking),
                               "cudaStreamCreate"));
    // Programmatic dependent launch (runtime.h) where the GPU has it (sm_90 and later);
    // PENG_CUDA_PDL=0 turns it off.
    d->launch_ = {d->stream_, prop.major >= 9 && EnvOn("PENG_CUDA_PDL"), &d->launches_};
    if (cublasCreate(&d->blas_) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate failed");
    cublasSetStream(d->blas_, d->stream_);
    // GroupedExpertsMatMul's scratch for steps of up to kGemvMaxTokens tokens, which may be
    // recorded as graphs (no allocation may happen then).
    if (!d->Grow(&d->group_, &d->group_bytes_,
                 GroupBytes(kernels::kMaxRoutedExperts, kGemvMaxTokens * kMaxTopK)))
      return d->Synchronize();
    PENG_ASSIGN_OR_RETURN(void* done, d->Alloc(sizeof(unsigned) * (1 + kMoeDownCounts)));
    d->route_done_ = static_cast<unsigned*>(done);
    d->moe_down_done_ = d->route_done_ + 1;
    d->Fill(done, 0, sizeof(unsigned) * (1 + kMoeDownCounts));
    // The parts of split decode attention (AttnArgs::part, done), for the steps that split.
    PENG_ASSIGN_OR_RETURN(void* part, d->Alloc(sizeof(float) * kAttnSplitRows * kAttnMaxSplits *
                                              (2 + kMaxMlaLatent)));
    PENG_ASSIGN_OR_RETURN(void* counts, d->Alloc(sizeof(unsigned) * kAttnSplitRows));
    d->attn_part_ = static_cast<float*>(part);
    d->attn_done_ = static_cast<unsigned*>(counts);
    d->Fill(counts, 0, sizeof(unsigned) * kAttnSplitRows);
    return std::unique_ptr<Device>(std::move(d));
  }

  std::string Name() const override { return name_; }
  int64_t FreeMemoryBytes() const override {
    size_t free = 0, total = 0;
    cudaSetDevice(index_);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return static_cast<int64_t>(free);
  }
  int64_t TotalMemoryBytes() const override {
    size_t free = 0, total = 0;
    cudaSetDevice(index_);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return static_cast<int64_t>(total);
  }

  StatusOr<void*> Alloc(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<int64_t>(bytes, 256));
    if (e != cudaSuccess) {
      cudaGetLastError();  // (the failed call's error is not the next launch's)
      return ResourceExhausted(name_ + ": cannot allocate " + std::to_string(bytes) +
                               " bytes of device memory (" + std::to_string(FreeMemoryBytes()) +
                               " free): " + cudaGetErrorString(e));
    }
    blocks_.insert(p);
    return p;
  }
  void Free(void* p) override {
    if (blocks_.erase(p)) {
      cudaStreamSynchronize(stream_);
      cudaFree(p);
    }
  }
  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
    Lost(e);
    return Check(e, "upload");
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    PENG_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download"));
    return Synchronize();
  }
  void* AllocHost(int64_t bytes) override {
    void* p = nullptr;
    return cudaMallocHost(&p, std::max<int64_t>(bytes, 1)) == cudaSuccess ? p : nullptr;
  }
  void FreeHost(void* p) override {
    if (p) cudaFreeHost(p);
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Fill(void* dst, uint8_t value, int64_t bytes) override {
    Note(cudaMemsetAsync(dst, value, bytes, stream_));
  }
  Status Synchronize() override {
    Note(cudaStreamSynchronize(stream_));
    Status s = error_;
    (void)(error_ = OkStatus());
    return s;
  }
  Status Health() const override { return lost_; }

  // CUDA graphs of decode steps; PENG_CUDA_GRAPHS=0 turns them off.
  bool SupportsGraphs() const override { return graphs_on_; }
  void BeginGraph() override {
    Note(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capture_start_ = launches_;
  }
  Status EndGraph(uint64_t key) override {
    cudaGraph_t g = nullptr;
    PENG_RETURN_IF_ERROR(Check(cudaStreamEndCapture(stream_, &g), "cudaStreamEndCapture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    PENG_RETURN_IF_ERROR(Check(e, "cudaGraphInstantiate"));
    if (graphs_.size() >= kMaxGraphs) ClearGraphs();
    graphs_[key] = {exec, launches_ - capture_start_};
    Note(cudaGraphLaunch(exec, stream_));
    return OkStatus();
  }
  bool LaunchGraph(uint64_t key) override {
    const auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    Note(cudaGraphLaunch(it->second.exec, stream_));
    launches_ += it->second.launches;
    return true;
  }
  void ClearGraphs() override {
    if (graphs_.empty()) return;
    cudaStreamSynchronize(stream_);
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
  }
  int64_t KernelLaunches() const override { return launches_; }

  double MeasureReadBandwidth(int64_t bytes) override {
    StatusOr<void*> buf = Alloc(bytes + 256);
    if (!buf.ok()) return 0;
    Fill(*buf, 0, bytes + 256);
    const double s = FastestOf3([&] {
      Launch(ReadKernel, sm_count_ * 8, kReadThreads, launch_, static_cast<const float4*>(*buf),
             bytes / 16, static_cast<float*>(*buf) + bytes / 4);
    });
    Free(*buf);
    return Synchronize().ok() && s > 0 ? bytes / s : 0;
  }

  // 100 empty kernels of sm_count_ blocks of 256 threads (the shape of a GEMV over many rows)
  // on the stream, recorded and replayed where graphs are on; the best of 3 runs after one
  // warm-up. (Not counted in KernelLaunches.)
  double MeasureKernelFloor() override {
    constexpr int kKernels = 100;
    LaunchStream ls = launch_;
    ls.launches = nullptr;
    auto kernels = [&] {
      for (int i = 0; i < kKernels; ++i) Launch(EmptyKernel, sm_count_, 256, ls);
    };
    cudaGraphExec_t exec = nullptr;
    if (graphs_on_) {
      cudaGraph_t g = nullptr;
      Note(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      kernels();
      Note(cudaStreamEndCapture(stream_, &g));
      if (g) {
        Note(cudaGraphInstantiate(&exec, g, 0));
        cudaGraphDestroy(g);
      }
    }
    const double s = FastestOf3([&] { exec ? Note(cudaGraphLaunch(exec, stream_)) : kernels(); });
    if (exec) cudaGraphExecDestroy(exec);
    return Synchronize().ok() ? s / kKernels : 0;
  }
  // The shortest of 3 timings (CUDA events around the work `enqueue` puts on the stream), after
  // one warm-up; 0 when none could be timed.
  template <typename F>
  double FastestOf3(F&& enqueue) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double best = 0;
    for (int pass = 0; pass < 4; ++pass) {
      cudaEventRecord(a, stream_);
      enqueue();
      cudaEventRecord(b, stream_);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (pass > 0 && ms > 0) best = best > 0 ? std::min(best, ms * 1e-3) : ms * 1e-3;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
  }

  StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Communicator* group) override {
#ifdef PENG_HAVE_NCCL
    return CreateNcclCommunicator(group, index_, stream_);
#else
    return Unimplemented(name_ + ": built without NCCL, no collectives across GPUs");
#endif
  }

  bool SupportsWeights(DType t) const override {
    return WithType(t, Nothing{});
  }
  StatusOr<DeviceMatrix> Upload(const TensorView& w, const float* int8_scales) override {
    PENG_ASSIGN_OR_RETURN(DeviceMatrix m, Describe(w, int8_scales));
    m.row_bytes = layout::DeviceRowBytes(m.dtype, m.cols);
    const int64_t bytes = static_cast<int64_t>(m.row_bytes) * m.rows;
    PENG_ASSIGN_OR_RETURN(void* p, Alloc(bytes));
    if (!layout::Repacked(m.dtype)) {
      PENG_RETURN_IF_ERROR(CopyToDevice(p, w.data, bytes));
    } else {  // repacked, a slice of rows at a time
      const int64_t rows_per_slice = std::max<int64_t>(1, (int64_t{16} << 20) / m.row_bytes);
      std::vector<uint8_t> slice(static_cast<size_t>(rows_per_slice) * m.row_bytes);
      for (int64_t r0 = 0; r0 < m.rows; r0 += rows_per_slice) {
        const int64_t n = std::min(rows_per_slice, m.rows - r0);
        for (int64_t r = 0; r < n; ++r)
          layout::RepackRow(m.dtype, static_cast<const uint8_t*>(w.data) + (r0 + r) * w.row_bytes(),
                            m.cols, slice.data() + r * m.row_bytes);
        PENG_RETURN_IF_ERROR(CopyToDevice(static_cast<uint8_t*>(p) + r0 * m.row_bytes,
                                          slice.data(), n * m.row_bytes));
        PENG_RETURN_IF_ERROR(Synchronize());  // (the slice is reused)
      }
    }
    m.data = p;
    if (int8_scales) {
      PENG_ASSIGN_OR_RETURN(m.scales, UploadFloats(int8_scales, m.rows));
    }
    // The quantized GEMVs' activation scratch, sized here for the widest matrix: never grown
    // while a graph is being recorded (no allocation may happen then).
    if (m.cols > act_cols_) {
      ClearGraphs();  // (recorded steps point at the old scratch)
      Free(act_);
      act_ = nullptr;
      act_cols_ = 0;
      PENG_ASSIGN_OR_RETURN(act_, Alloc(3 * ActRegionBytes(m.cols)));
      act_cols_ = m.cols;
    }
    return m;
  }

  void MatMul(const DeviceMatrix& w, const float* x, int64_t T, float* y) override {
    MatMuls(x, T, {{&w, y}});
  }
  void MatMuls(const float* x, int64_t T, std::initializer_list<MatMulOut> outs) override {
    if (T <= 0) return;
    QActOut q32, q256;
    if (!Quantizations(T, outs, &q32, &q256)) {
      Products(x, T, outs);
      return;
    }
    ProductsAfter({.kind = FusedInput::kPlain, .x = x, .n = outs.begin()->w->cols, .q32 = q32,
                   .q256 = q256, .route = {}},
                  T, outs);
  }
  // The norm writes the quantized activations the products need as it goes -- and the routed
  // experts' (`experts`), where their region is free or already holds the same blocks: the
  // next ExpertsMatMuls over y then finds them ready (prepared_).
  // The router and the routing (`route`) in the products' launch where the norm runs inside
  // it (RouteTail: a float router as MatMulMoeRoute fuses it, in F32, over up to
  // kRouteTailTokens tokens); else MatMulMoeRoute after them.
  void NormMatMuls(const float* x, const float* norm_w, float w_offset, float eps, float* y,
                   int64_t T, int64_t n, std::initializer_list<MatMulOut> outs,
                   const DeviceExperts* experts, const MoeRouteOut* route) override {
    if (T <= 0) return;
    QActOut q32, q256;
    Quantizations(T, outs, &q32, &q256);
    const ActFormat ef = experts && experts->cols == n ? ExpertsFormat(*experts, T, T) : kFp32Act;
    QActOut& eq = ef == kBlocks256 ? q256 : q32;
    const bool prepare = ef != kFp32Act && (!eq.qs || eq.w8a8 == (ef == kW8A8Groups));
    if (prepare) eq = WriteOut(ef, n);
    prepared_ = prepare ? Prepared{y, T, act_writes_, ef} : Prepared{};
    FusedInput f{.kind = FusedInput::kNorm, .x = x, .w = norm_w, .w_offset = w_offset,
                 .eps = eps, .y = y, .n = n, .q32 = q32, .q256 = q256, .route = {}};
    const bool tail = route && route->router->dtype == DType::kF32 && route->router->cols == n &&
                      RouteTailFits(*route->router, T, route->p);
    if (tail)
      f.route = {.w = static_cast<const uint8_t*>(route->router->data),
                 .row_bytes = route->router->row_bytes,
                 .rows = route->router->rows,
                 .z = 0,
                 .logits = route->logits,
                 .bias = route->bias,
                 .p = route->p,
                 .ids = route->ids,
                 .weights = route->w,
                 .done = route_done_};
    if (!ProductsAfter(f, T, outs) && route)
      MatMulMoeRoute(*route->router, y, T, route->logits, route->bias, route->p, route->ids,
                     route->w);
  }
  // Whether the routing over router r's logits can run in the last block of the router's launch
  // (RouteInLastBlock).
  bool RouteTailFits(const DeviceMatrix& r, int64_t T, const kernels::MoeRouting& p) const {
    return fused_route_ && T > 0 && T <= kRouteTailTokens && p.n_experts <= kRouteTailExperts &&
           r.rows == p.n_experts && p.k <= kMaxTopK && p.n_group <= kMaxGroups && !r.scales &&
           (r.dtype == DType::kF32 || r.dtype == DType::kF16 || r.dtype == DType::kBF16);
  }
  void GatedMatMuls(GatedActivation act, const float* gate, const float* up, float* h, int64_t T,
                    int64_t n, std::initializer_list<MatMulOut> outs) override {
    if (T <= 0) return;
    QActOut q32, q256;
    const Ew op = act == GatedActivation::kSilu ? Ew::kSilu : Ew::kGelu;
    if (!Quantizations(T, outs, &q32, &q256)) {
      Elementwise(op, h, gate, up, 0, T * n);
      Products(h, T, outs);
      return;
    }
    ProductsAfter({.kind = FusedInput::kGated, .x = gate, .up = up, .op = op, .y = h, .n = n,
                   .q32 = q32, .q256 = q256, .route = {}},
                  T, outs);
  }
  // The products over the rows f produces: f inside the first quantized product's GEMV where
  // its tile of tokens fits the block's shared memory (FusedQGemvKernel; LaunchQGemv may still
  // launch it on its own), else f's kernel first. In place (y one of f's inputs, which the
  // GEMV's blocks read while its first block would write y) only for the gated activation and
  // where every product is quantized: the fused kernel then leaves h unwritten
  // (Device::GatedMatMuls allows it).
  // True when f's route rode on the launch (RouteTail: only with f inside the GEMV).
  bool ProductsAfter(const FusedInput& f, int64_t T, std::initializer_list<MatMulOut> outs) {
    const int64_t tile = T == 1 ? 1 : kTokenTile;
    bool quantized = false, all = true;
    for (const MatMulOut& o : outs) {
      const bool q = Format(*o.w, T) != kFp32Act;
      quantized |= q;
      all &= q;
    }
    const bool in_place = f.y && (f.y == f.x || f.y == f.up);
    const bool fuse = fused_input_ && quantized &&
                      (!in_place || (all && f.kind == FusedInput::kGated)) &&
                      tile * f.n <= kFusedInputValues;
    if (!fuse) LaunchInput(f, T);
    return Products(f.y ? f.y : f.x, T, outs, fuse ? &f : nullptr);
  }
  // f's kernel of its own.
  void LaunchInput(const FusedInput& f, int64_t T) {
    const dim3 grid(Blocks(f.n, 256), T);
    switch (f.kind) {
      case FusedInput::kNorm:
        Launch(RmsNormKernel, T, 256, launch_, f.x, f.w, f.w_offset, f.y, f.n, f.eps, f.n, f.q32,
               f.q256, false);
        break;
      case FusedInput::kGated:
        Launch(GatedQuantKernel, grid, 256, launch_, f.op, f.x, f.up, f.y, f.n, f.q32, f.q256);
        break;
      case FusedInput::kPlain:
        Launch(QuantizeActKernel, grid, 256, launch_, f.x, f.n, f.q32, f.q256);
        break;
    }
    Note(cudaGetLastError());
  }

  // One QGemvKernel launch over up to kMaxQMats matrices of one type and cols (blockIdx.z the
  // matrix), with WPR warps a row where the rows alone would not fill the GPU (fewer than 16
  // warps a multiprocessor) and a row has the units for them.
  // input: the kernel that produces the activations, run by the GEMV's blocks (FusedInput)
  // where they are at most kFusedInputBlocksPerSm a multiprocessor -- about what is resident
  // at once at the GEMVs' 40-80 registers a thread -- with a block taking 1, 2 or 4 times its
  // rows (the fewest passes that get there): every block repeats the input's work, so past
  // one wave the input's own kernel (launched here first) costs less.
  // input's route rides on the launch (true) as blocks of z index n where the launch runs input
  // and has one tile of tokens and a block for every 8 of the router's rows.
  // From kQMmaMinTokens tokens on the products run on the tensor cores instead (QMmaKernel,
  // after input's own kernel), a block taking 32 tokens -- 16 or 8 where that leaves fewer
  // blocks than two a multiprocessor (what is resident at once): few rows then spread over
  // more blocks, each decoding its weights for fewer tokens.
  static constexpr int kFusedInputBlocksPerSm = 3;
  bool LaunchQGemv(const QMats& ms, int n, DType type, int64_t cols, const QAct& a, int64_t T,
                   const FusedInput* input = nullptr);  // (device_matmul.cuh)

  // The products of MatMuls over x, its quantized forms (in the scratch regions) written by
  // the kernel before when Quantizations said so. The quantized ones of one type share a
  // launch, up to kMaxQMats of them, in the order they come; the FP32 ones follow. input: the
  // kernel producing x, run inside the first launch (ProductsAfter: some product is quantized).
  bool Products(const float* x, int64_t T, std::initializer_list<MatMulOut> outs,
                const FusedInput* input = nullptr) {
    const MatMulOut* o = outs.begin();
    const size_t n = outs.size();
    uint32_t done = 0;  // bit i: outs[i] launched (the graphs pass a handful)
    bool routed = false;  // (input's route on the launch: LaunchQGemv)
    if (n > 32) {
      Keep(InvalidArgument(name_ + ": MatMuls over more than 32 matrices"));
      return false;
    }
    for (size_t i = 0; i < n; ++i) {  // the quantized products first: input's launch among them
      if (done >> i & 1) continue;
      const ActFormat f = Format(*o[i].w, T);
      if (f == kFp32Act) continue;
      QMats ms;
      int m = 0;
      for (size_t j = i; j < n && m < kMaxQMats; ++j) {
        if ((done >> j & 1) || o[j].w->dtype != o[i].w->dtype) continue;
        const bool int8 = o[j].w->dtype == DType::kI8;  // (W8A8: the row scales in the store)
        ms.m[m++] = {static_cast<const uint8_t*>(o[j].w->data), o[j].w->row_bytes, o[j].w->rows,
                     o[j].y,
                     Epilogue{o[j].bias, o[j].accumulate, o[j].slots,
                              int8 ? o[j].w->scales : nullptr}};
        done |= uint32_t{1} << j;
      }
      routed |= LaunchQGemv(ms, m, o[i].w->dtype, o[i].w->cols, Act(f, o[i].w->cols), T, input);
      input = nullptr;
    }
    for (size_t i = 0; i < n; ++i)
      if (!(done >> i & 1))
        FloatMatMul(*o[i].w, x, T, o[i].y, Epilogue{o[i].bias, o[i].accumulate, o[i].slots});
    return routed;
  }
  // The quantized activations the products of `outs` (sharing one x of T rows: every matrix
  // has x's cols) read: q32 / q256 point into the scratch regions for the block sizes any of
  // them needs; false when none does. Products then reads them: the kernel launched between
  // the two must fill them.
  // (INT8 W8A8 matrices take blocks of 32 of their own arithmetic, in a region of their own:
  // they share an x with no GGUF 32-block matrix -- peng quantize folders hold INT8 and float
  // weights only.)
  bool Quantizations(int64_t T, std::initializer_list<MatMulOut> outs, QActOut* q32,
                     QActOut* q256) {
    bool any = false;
    for (const MatMulOut& o : outs) {
      const ActFormat f = Format(*o.w, T);
      if (f == kFp32Act) continue;
      QActOut* slot = f == kBlocks256 ? q256 : q32;
      if (slot->qs && slot->w8a8 != (f == kW8A8Groups))
        Keep(Unimplemented(name_ + ": INT8 W8A8 and 32-value block weights over one input"));
      *slot = WriteOut(f, o.w->cols);
      any = true;
    }
    return any;
  }
  // Whether a kernel storing rows of `width` values may quantize them for `outs` as it stores
  // them: every product takes blocks of 32 (into *q32) and the rows are whole blocks.
  bool Quantized32(int64_t T, int64_t width, std::initializer_list<MatMulOut> outs,
                   QActOut* q32) {
    QActOut q256;
    return width % 32 == 0 && Quantizations(T, outs, q32, &q256) && !q256.qs;
  }

  // The FP32-activation products: GEMV (exact mode, float and INT8 weights) and GEMM.
  void FloatMatMul(const DeviceMatrix& w, const float* x, int64_t T, float* y,
                   Epilogue ep);  // (device_matmul.cuh)

  void EmbedRows(const DeviceMatrix& w, const StepBatch& b, float scale, float* out,
                 int64_t row0) override {
    if (b.n_tokens == 0) return;
    WithType(w.dtype, [&]<DType D>() {
      Launch(EmbedKernel<D>, b.n_tokens, 128, launch_, static_cast<const uint8_t*>(w.data),
             w.row_bytes, w.rows, w.cols, w.scales, b.d_tokens, row0, scale, out);
    });
    Note(cudaGetLastError());
  }
  void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows,
               int64_t n, float eps, int64_t stride) override {
    if (n_rows == 0) return;
    Launch(RmsNormKernel, n_rows, NormThreads(n), launch_, x, w, w_offset, y, n, eps,
           stride ? stride : n, QActOut{}, QActOut{}, false);
    Note(cudaGetLastError());
  }
  // RmsNorm's block size: rows of a head (up to kMaxHeadDim values) at the attention kernel's,
  // so that its head norm (AttnRope) sums in the same order.
  static int NormThreads(int64_t n) { return n <= kMaxHeadDim ? kAttnWarps * kWarp : 256; }
  // One launch: the normalized row added to y's as it is computed (x left as it was).
  void AddRmsNorm(float* y, float* x, const float* w, float w_offset, int64_t n_rows, int64_t n,
                  float eps) override {
    if (n_rows == 0) return;
    Launch(RmsNormKernel, n_rows, NormThreads(n), launch_, x, w, w_offset, y, n, eps, n,
           QActOut{}, QActOut{}, true);
    Note(cudaGetLastError());
  }
  void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) override {
    if (!b || n_rows * n == 0) return;
    Launch(BiasRowsKernel, Blocks(n_rows * n, 256), 256, launch_, y, b, n_rows, n);
    Note(cudaGetLastError());
  }
  void Add(float* y, const float* x, int64_t n) override {
    Elementwise(Ew::kAdd, y, x, nullptr, 0, n);
  }
  void Scale(float* y, float s, int64_t n) override {
    Elementwise(Ew::kScale, y, nullptr, nullptr, s, n);
  }
  void Softcap(float* y, float cap, int64_t n) override {
    Elementwise(Ew::kSoftcap, y, nullptr, nullptr, cap, n);
  }
  void Gated(GatedActivation act, const float* gate, const float* up, float* out,
             int64_t n) override {
    Elementwise(act == GatedActivation::kSilu ? Ew::kSilu : Ew::kGelu, out, gate, up, 0, n);
  }
  // --- attention (defined in device_attention.cuh)
  void Rope(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
            const StepBatch& b, const kernels::RopeConfig& cfg, const float* inv_freq) override;
  void KvWrite(const kernels::KvLayerView& kv, const StepBatch& b, const float* k,
               const float* v) override;
  void RopeKvWrite(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                   const kernels::RopeConfig& cfg, const float* inv_freq,
                   const kernels::KvLayerView& kv, const float* k_rows, const float* v_rows,
                   const RowNorm& norm) override;
  void PagedAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                      const kernels::AttentionParams& p, float* out) override;
  // The heads' norms, RoPE and the KV write inside the attention kernel where every sequence
  // has one token in the step (AttnRope; PENG_CUDA_FUSED_ROPE=0: RmsNorm and RopeKvKernel
  // first), the output quantized by the attention kernel as it writes it where the products
  // take it (Quantized32).
  void AttentionMatMuls(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                        const kernels::AttentionParams& p, float* out,
                        std::initializer_list<MatMulOut> outs, const RopeKv* rope) override;
  // Whether `rope` can run inside the attention (*inside then says how): a step of one token a
  // sequence, q and k rows laid out as the attention reads them, k's rows the ones stored.
  bool RopeInside(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                  const kernels::AttentionParams& p, const RopeKv& r, AttnRope* inside) const;
  void MlaAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                    const kernels::MlaParams& p, float* out) override;
  void MlaAbsorbQuery(const float* q, const StepBatch& b, const MlaWeights& w,
                      const kernels::MlaParams& p, float* out) override;
  // RoPE, the latent norm and the KV write inside the absorption (MlaRopeKv; at any step: the
  // attention that reads the cache is the next launch) where the rows are laid out as
  // DeepSeek's graph lays them out; PENG_CUDA_FUSED_ROPE=0: RopeKvKernel first.
  void RopeMlaAbsorbQuery(const RopeKv& r, const kernels::KvLayerView& kv, const float* q,
                          const StepBatch& b, const MlaWeights& w, const kernels::MlaParams& p,
                          float* out) override;
  void MlaProjectOutput(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                        const kernels::MlaParams& p, float* out) override;
  // The projected output quantized as it is stored (Quantized32; kWarp = 32 outputs a block).
  void MlaProjectMatMuls(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                         const kernels::MlaParams& p, float* out,
                         std::initializer_list<MatMulOut> outs) override;
  // Whether MLA's stored per-head products quantize their input rows (mla_kernels.cuh).
  bool MlaInputsQuantized() const { return quantized_gemv_ && !kernels::ExactActivations(); }
  // MLA's products with the FP32 copy of kv_b in a prefill (more than kGemvMaxTokens tokens):
  // one strided batched FP32 GEMM over the heads (cuBLAS) for every token, instead of a block a
  // (token, head) that reads the head's matrix again for each token; LaunchMla then does what
  // is left (q_pe, RoPE and the KV write; the decode tokens' stored per-head products, which
  // replace the GEMM's rows). False: not taken (PENG_CUDA_MLA_GEMM=0, no FP32 copy).
  bool MlaGemm(bool absorb, const float* x, const StepBatch& b, const MlaWeights& w,
               const kernels::MlaParams& p, float* out);
  // --- mixture of experts (defined in device_moe.cuh)
  void MoeRoute(const float* logits, const float* bias, int64_t T, const kernels::MoeRouting& p,
                int32_t* ids, float* w) override;
  // The routing inside the router's GEMV (RouterKernel) for a float router over up to
  // kRouteTailTokens tokens and kRouteTailExperts experts (PENG_CUDA_FUSED_ROUTE=0: two
  // launches).
  void MatMulMoeRoute(const DeviceMatrix& r, const float* x, int64_t T, float* logits,
                      const float* bias, const kernels::MoeRouting& p, int32_t* ids,
                      float* w) override;
  void ExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T, const int32_t* ids, int k,
                     bool x_per_slot, float* y) override;
  // The routed hidden quantized by the gated kernel as it is computed.
  void GatedExpertsMatMul(GatedActivation act, const float* gate, const float* up, float* h,
                          int64_t T, int k, int64_t n, const DeviceExperts& w, const int32_t* ids,
                          float* y) override;
  void ExpertsMatMuls(const float* x, int64_t T, const int32_t* ids, int k, bool x_per_slot,
                      std::initializer_list<ExpertsOut> outs) override;
  void SlotSum(const float* y, const float* w, int64_t T, int k, int64_t n, float* out) override;
  // In one kernel (MoeDownKernel) where the pairs' gated activations fit a block's shared
  // memory and the pairs' blocks, a block taking 1, 2, 4 or 8 times its rows, are at most
  // kFusedInputBlocksPerSm a multiprocessor (every block repeats its pair's activation);
  // PENG_CUDA_FUSED_MOE_DOWN=0: GatedExpertsMatMul, then the shared experts' products.
  void MoeDown(GatedActivation act, float* gate, const float* up, int64_t T, int k, int64_t n,
               const DeviceExperts& down, const int32_t* ids, const float* w,
               const SharedExperts& shared, float* ys, float* out) override;
  void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t n_cols,
                  float* dst) override {
    if (n == 0) return;
    Launch(GatherRowsKernel, n, 256, launch_, src, rows, n_cols, dst);
    Note(cudaGetLastError());
  }
  int64_t TopLogitsScratchBytes(int64_t n_rows, int64_t n, int k) const override {
    return k > kTopMax ? n_rows * k * 8 : n_rows * Blocks(n, kTopChunk) * (k * 8 + 4);
  }
  void TopLogits(const float* x, int64_t R, int64_t n, int k, float* val, int32_t* idx,
                 int32_t* first_bad, void* scratch) override {
    if (R == 0) return;
    if (reinterpret_cast<uintptr_t>(scratch) % 8 != 0) {  // (the keys are 8-byte values)
      Keep(InvalidArgument(name_ + ": TopLogits' scratch is not 8-byte aligned"));
      return;
    }
    auto* keys = static_cast<uint64_t*>(scratch);
    if (k > kTopMax) {  // (a few rows after a step: a block a row)
      Launch(TopWideKernel, R, kTopThreads, launch_, x, n, k, keys, val, idx, first_bad);
      Note(cudaGetLastError());
      return;
    }
    const int64_t chunks = Blocks(n, kTopChunk);
    auto* bad = reinterpret_cast<int32_t*>(keys + R * chunks * k);
    for (int64_t r0 = 0; r0 < R; r0 += kMaxGridY) {  // (rows as gridDim.y)
      const int64_t r = std::min(R - r0, kMaxGridY);
      Launch(TopChunksKernel, dim3(chunks, r), kTopThreads, launch_, x + r0 * n, n, k,
             keys + r0 * chunks * k, bad + r0 * chunks);
    }
    Launch(TopMergeKernel, R, kTopThreads, launch_, x, n, static_cast<int>(chunks), k, keys, bad,
           val, idx, first_bad);
    Note(cudaGetLastError());
  }
  void EditLogits(float* x, int64_t R, int64_t n, const LogitEditRow* rows,
                  const LogitEdit* edits, const uint32_t* masks) override {
    if (R == 0) return;
    Launch(EditLogitsKernel, R, 256, launch_, x, n, rows, edits, masks);
    Note(cudaGetLastError());
  }
  void DrawTokens(const float* x, int64_t R, int64_t n, const float* best, int best_stride,
                  const TokenDraw* draws, const DrawResults& out) override {
    if (R == 0) return;
    Launch(DrawKernel, R, kDrawThreads, launch_, x, n, best, best_stride, draws, out);
    Note(cudaGetLastError());
  }

 private:
  CudaDevice() = default;

  // The experts' quantized GEMVs of a decode-sized step for one or two stacked matrices of one
  // type and shape: x quantized once (unless `quantize` is false: the kernel before did), one
  // launch (blockIdx.z the matrix). False (nothing launched) where they take the FP32 path.
  bool QuantizedExperts(const float* x, int64_t T, const int32_t* ids, int k, bool x_per_slot,
                        std::initializer_list<ExpertsOut> outs, bool quantize = true);

  // Prefill: the pairs grouped by expert (moe_kernels.cuh, ExpertTilesKernel), each expert's rows
  // read once per tile of up to kTokenTile of its pairs.
  void GroupedExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T,
                            const int32_t* ids, int k, bool x_per_slot, float* y);

  // GroupedExpertsMatMul's scratch: offsets, tile starts and cursors (E + 1 each), the list.
  static int64_t GroupBytes(int64_t E, int64_t n_pairs) { return (3 * (E + 1) + n_pairs) * 4; }
  // Bytes of one region of the activation scratch: `rows` rows of `cols` int8 values, their
  // scales (at most one per 32) and sums (one per 16), each part 256-byte aligned.
  static int64_t ActPart(int64_t bytes) { return (bytes + 255) / 256 * 256; }
  static int64_t ActRegionBytes(int64_t cols, int64_t rows = kMaxActRows) {
    return ActPart(rows * cols) + ActPart(rows * (cols / 32) * 4) + ActPart(rows * (cols / 16) * 4);
  }
  // The activations of the GEMV of a step of T tokens over `rows` activation rows (T, or the
  // (token, slot) pairs of the experts) and a matrix of type t with `cols` columns: the block
  // formats' blocks of 32 or 256, INT8 of the W8A8 scheme (int8_activations) its groups of 32
  // (kernels::QuantizeActivations' arithmetic); kFp32Act for the FP32 path: exact mode (the
  // tests' FP32 reference, kernels::SetExactActivations), PENG_CUDA_QGEMV=0 (a comparison),
  // float weights and INT8 of W8A16, prefill (the GEMM), or more than the scratch holds.
  ActFormat Format(DType t, bool int8_activations, int64_t cols, int64_t T, int64_t rows) const {
    ActFormat f = t == DType::kI8 && int8_activations ? kW8A8Groups : kFp32Act;
    WithType(t, [&]<DType D>() {
      if constexpr (layout::kQuantized<D>)
        f = layout::kActBlock<D> == 256 ? kBlocks256 : kBlocks32;
    });
    if (f == kFp32Act || !quantized_gemv_ || kernels::ExactActivations() ||
        T > kGemvMaxTokens || rows > kMaxActRows || cols % (f == kBlocks256 ? 256 : 32) != 0 ||
        cols > act_cols_)
      return kFp32Act;
    return f;
  }
  ActFormat Format(const DeviceMatrix& w, int64_t T) const {
    return Format(w.dtype, w.int8_activations, w.cols, T, T);
  }
  bool PerPairExperts(int64_t T) const;  // (device_moe.cuh)
  ActFormat ExpertsFormat(const DeviceExperts& w, int64_t T, int64_t rows) const;
  // The scratch region of format f, laid out for rows of `cols`: where the quantizer writes
  // (ActOut) and what the GEMVs read (Act).
  QActOut ActOut(ActFormat f, int64_t cols) const {
    return ActAt(static_cast<uint8_t*>(act_) + (f - 1) * ActRegionBytes(act_cols_), kMaxActRows,
                 f, cols);
  }
  // A region at `base` of ActRegionBytes(cols', rows) bytes (cols' >= cols), laid out for `rows`
  // rows of `cols`.
  static QActOut ActAt(uint8_t* base, int64_t rows, ActFormat f, int64_t cols) {
    QActOut o;
    o.w8a8 = f == kW8A8Groups;
    o.qs = reinterpret_cast<int8_t*>(base);
    o.d = reinterpret_cast<float*>(base + ActPart(rows * cols));
    o.s = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(o.d) +
                                     ActPart(rows * (cols / 32) * 4));
    return o;
  }
  // ActOut for a kernel that writes the region (counted: act_writes_).
  QActOut WriteOut(ActFormat f, int64_t cols) {
    ++act_writes_;
    return ActOut(f, cols);
  }
  QAct Act(ActFormat f, int64_t cols) const {
    const QActOut o = ActOut(f, cols);
    return {o.qs, o.d, o.s, cols};
  }

  // kernels::RopeConfig as the kernels take it.
  static RopeRotation Rotation(const kernels::RopeConfig& cfg, const float* inv_freq) {
    return {inv_freq, cfg.rot_dim / 2, cfg.style == kernels::RopeStyle::kInterleaved,
            cfg.attention_factor};
  }
  template <typename KV>
  void LaunchRopeKv(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                    const kernels::RopeConfig& cfg, const float* inv_freq, const KvRows<KV>& kv,
                    const RowNorm& norm = {});

  // Paged attention, its output also quantized into `quant` where set (AttnArgs::quant), RoPE
  // and the KV write inside where rope.k is set (AttnArgs::rope).
  void Attention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                 const kernels::AttentionParams& p, float* out, const QActOut& quant,
                 const AttnRope& rope = {});
  // One block per (token, head) over an F16 or F32 cache.
  template <int kMaxK, int kMaxV>
  void LaunchAttention(const AttnArgs& a, DType cache, int64_t n_tokens, int n_heads);
  // Steps with prompt tokens (a sequence of more than one token; not with RoPE inside): the
  // tiles of (token, head) rows instead (AttentionTileKernel), unless PENG_CUDA_TILED_ATTENTION=0.
  bool Tiled(const StepBatch& b, const AttnArgs& a) const {
    return tiled_attention_ && b.d_seq_first_token && b.n_tokens > b.n_seqs && !a.rope.k;
  }
  template <int kDk, int kDv, int kRows, int kKeys, bool kLatent>
  void LaunchAttentionTiles(AttnArgs a, DType cache, const StepBatch& b);
  // Whether the tiles of a step with prompt tokens run on the tensor cores (AttentionMmaKernel,
  // AttentionMmaWideKernel): an F16 cache (16-byte aligned) or, where q8_0, a Q8_0 one, keys
  // of a multiple of 16 values up to max_k, values up to max_v, outside exact mode, unless
  // PENG_CUDA_MMA_ATTENTION=0.
  bool OnTensorCores(const kernels::KvLayerView& kv, int max_k, int max_v,
                     bool q8_0 = false) const;
  template <int kD, int kKeys>
  void LaunchAttentionMma(AttnArgs a, DType cache, const StepBatch& b);
  template <int kDk, int kDv, int kSplit, bool kLatent>
  void LaunchAttentionMmaWide(AttnArgs a, DType cache, const StepBatch& b);
  // The tiles' grid (x: an upper bound on the step's tiles of `rows` rows, y: the KV heads), and
  // the step's sequences in a.
  static dim3 TileGrid(AttnArgs* a, const StepBatch& b, int rows);
  AttnArgs Args(const float* q, float* out, const kernels::KvLayerView& kv, const StepBatch& b);
  static Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return OkStatus();
    return Internal(std::string(what) + ": " + cudaGetErrorString(e));
  }
  // Keeps the first asynchronous error for Synchronize().
  void Note(cudaError_t e) {
    if (e == cudaSuccess) return;
    Lost(e);
    Keep(Internal(name_ + ": " + cudaGetErrorString(e)));
  }
  // Health() after an error that loses the context (runtime.h).
  void Lost(cudaError_t e) {
    if (LosesTheContext(e) && lost_.ok())
      (void)(lost_ = Internal(name_ + ": " + cudaGetErrorString(e) +
                              " (the GPU's context is lost: restart the process)"));
  }
  void Keep(Status s) {
    if (error_.ok()) (void)(error_ = std::move(s));
  }
  void Elementwise(Ew op, float* y, const float* a, const float* b, float s, int64_t n) {
    if (n == 0) return;
    Launch(ElementwiseKernel, Blocks(n, 256), 256, launch_, op, y, a, b, s, n);
    Note(cudaGetLastError());
  }
  // Scratch that grows to the largest request (freed after the stream's pending work).
  bool Grow(void** p, int64_t* have, int64_t need) {
    if (need <= *have) return true;
    if (*p) Free(*p);
    *p = nullptr;
    *have = 0;
    StatusOr<void*> q = Alloc(need);
    if (!q.ok()) {
      Keep(q.status());
      return false;
    }
    *p = *q;
    *have = need;
    return true;
  }

  static constexpr size_t kMaxGraphs = 256;
  int index_ = 0;
  int sm_count_ = 1;  // multiprocessors
  std::string name_;
  bool graphs_on_ = EnvOn("PENG_CUDA_GRAPHS");
  bool quantized_gemv_ = EnvOn("PENG_CUDA_QGEMV");
  bool fused_input_ = EnvOn("PENG_CUDA_FUSED_INPUT");  // ProductsAfter's input inside the GEMV
  bool mma_gemv_ = EnvOn("PENG_CUDA_MMA_GEMV");  // LaunchQGemv's tensor-core products
  bool fused_rope_ = EnvOn("PENG_CUDA_FUSED_ROPE");  // AttentionMatMuls' RoPE inside the attention
  bool fused_route_ = EnvOn("PENG_CUDA_FUSED_ROUTE");  // MatMulMoeRoute in one kernel
  bool tiled_attention_ = EnvOn("PENG_CUDA_TILED_ATTENTION");  // Tiled()
  bool mma_attention_ = EnvOn("PENG_CUDA_MMA_ATTENTION");  // OnTensorCores()
  bool mla_gemm_ = EnvOn("PENG_CUDA_MLA_GEMM");  // MlaGemm()
  bool bf16_gemm_ = EnvOn("PENG_CUDA_BF16_GEMM");  // FloatMatMul: BF16 weights as uploaded
  unsigned* route_done_ = nullptr;  // RouterKernel's count of finished blocks (0 between)
  bool fused_moe_down_ = EnvOn("PENG_CUDA_FUSED_MOE_DOWN");  // MoeDown in one kernel
  // MoeDownKernel's counts of finished blocks, a token's rows at a time (0 between).
  static constexpr int64_t kMoeDownCounts = 4096;
  unsigned* moe_down_done_ = nullptr;
  // Decode attention over long contexts split over blocks (AttentionKernel's gridDim.z): where
  // a step has at most kAttnSplitRows (token, head) pairs, into up to kAttnMaxSplits parts
  // (attention_kernels.cuh; AttnSplits); PENG_CUDA_ATTN_SPLIT=0: never.
  static constexpr int64_t kAttnSplitRows = 256;
  bool attn_split_ = EnvOn("PENG_CUDA_ATTN_SPLIT");
  float* attn_part_ = nullptr;
  unsigned* attn_done_ = nullptr;
  int AttnSplits(int64_t n_tokens, int n_heads) const {
    const int64_t rows = n_tokens * n_heads;
    if (!attn_split_ || rows > kAttnSplitRows) return 1;
    return static_cast<int>(std::clamp<int64_t>(2 * sm_count_ / rows, 1, kAttnMaxSplits));
  }
  struct RecordedGraph {
    cudaGraphExec_t exec;
    int64_t launches;  // the kernels it runs
  };
  std::map<uint64_t, RecordedGraph> graphs_;
  int64_t launches_ = 0, capture_start_ = 0;  // KernelLaunches()
  cudaStream_t stream_ = nullptr;
  LaunchStream launch_;  // the kernels' launches: stream_, with or without PDL
  cublasHandle_t blas_ = nullptr;
  std::set<void*> blocks_;
  Status error_;
  Status lost_;  // Health()
  void* w_half_ = nullptr;
  void* x_half_ = nullptr;
  void* group_ = nullptr;  // GroupedExpertsMatMul's offsets, tiles, cursors and list
  void* group_act_ = nullptr;  // its quantized activations past kMaxActRows rows
  int64_t w_half_bytes_ = 0, x_half_bytes_ = 0, group_bytes_ = 0, group_act_bytes_ = 0;
  // Quantized activations (three regions: blocks of 32, of 256, W8A8's), for matrices of up to
  // act_cols_ columns and kMaxActRows rows: a step's tokens, or its (token, slot) pairs.
  static constexpr int64_t kMaxActRows =
      std::max(kGemvMaxTokens, kExpertsGemvMaxTokens * kMaxTopK);
  void* act_ = nullptr;
  int64_t act_cols_ = 0;
  int64_t act_writes_ = 0;  // kernels enqueued that write the scratch (WriteOut)
  // The activations NormMatMuls quantized for the routed experts: x's T rows, valid while
  // act_writes_ is unchanged.
  struct Prepared {
    const float* x = nullptr;
    int64_t T = 0, writes = -1;
    ActFormat format = kFp32Act;
  };
  Prepared prepared_;
};

}  // namespace
}  // namespace peng::backend::cuda

#include "backend/cuda/device_attention.cuh"
#include "backend/cuda/device_matmul.cuh"
#include "backend/cuda/device_moe.cuh"

namespace peng::backend::cuda {

#if defined(PENG_CUDA_EMULATOR)
// This backend on the CPU (emulator.h): the tests' device "cuda-emu".
namespace {
const bool kRegistered = (RegisterDevice("cuda-emu", [] { return CudaDevice::Open(0); }), true);
}  // namespace
#else
int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

StatusOr<std::unique_ptr<Device>> CreateDevice(int index) { return CudaDevice::Open(index); }
#endif

}  // namespace peng::backend::cuda
