#include "backend/device.h"

#include <cstdlib>
#include <map>
#include <string>

#ifdef PENG_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#endif

namespace peng::backend {

std::unique_ptr<Device> CreateHostDevice(ThreadPool* pool);  // host_device.cc

StatusOr<float*> Device::UploadFloats(const float* host, int64_t n) {
  PENG_ASSIGN_OR_RETURN(void* p, Alloc(n * static_cast<int64_t>(sizeof(float))));
  PENG_RETURN_IF_ERROR(CopyToDevice(p, host, n * static_cast<int64_t>(sizeof(float))));
  return static_cast<float*>(p);
}

void Device::NormMatMuls(const float* x, const float* norm_w, float w_offset, float eps,
                         float* y, int64_t n_tokens, int64_t n,
                         std::initializer_list<MatMulOut> outs, const DeviceExperts*,
                         const MoeRouteOut* route) {
  RmsNorm(x, norm_w, w_offset, y, n_tokens, n, eps);
  MatMuls(y, n_tokens, outs);
  if (route)
    MatMulMoeRoute(*route->router, y, n_tokens, route->logits, route->bias, route->p, route->ids,
                   route->w);
}

void Device::GatedMatMuls(GatedActivation act, const float* gate, const float* up, float* h,
                          int64_t n_tokens, int64_t n, std::initializer_list<MatMulOut> outs) {
  Gated(act, gate, up, h, n_tokens * n);
  MatMuls(h, n_tokens, outs);
}

void Device::ExpertsMatMuls(const float* x, int64_t n_tokens, const int32_t* ids, int k,
                            bool x_per_slot, std::initializer_list<ExpertsOut> outs) {
  for (const ExpertsOut& o : outs) ExpertsMatMul(*o.w, x, n_tokens, ids, k, x_per_slot, o.y);
}

void Device::AttentionMatMuls(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                              const kernels::AttentionParams& p, float* out,
                              std::initializer_list<MatMulOut> outs, const RopeKv* rope) {
  if (rope) {
    NormHeads(*rope, b.n_tokens);
    RopeKvWrite(rope->q, rope->k, b, *rope->cfg, rope->inv_freq, kv, rope->k_rows, rope->v_rows,
                rope->norm);
  }
  PagedAttention(q, kv, b, p, out);
  MatMuls(out, b.n_tokens, outs);
}

void Device::AddRmsNorm(float* y, float* x, const float* w, float w_offset, int64_t n_rows,
                        int64_t n, float eps) {
  RmsNorm(x, w, w_offset, x, n_rows, n, eps);
  Add(y, x, n_rows * n);
}

void Device::NormHeads(const RopeKv& rope, int64_t n_tokens) {
  const HeadNorms& h = rope.head_norm;
  if (!h.q_w) return;
  RmsNorm(rope.q.x, h.q_w, h.w_offset, rope.q.x, n_tokens * rope.q.n_heads, h.n, h.eps,
          rope.q.head_stride);
  RmsNorm(rope.k.x, h.k_w, h.w_offset, rope.k.x, n_tokens * rope.k.n_heads, h.n, h.eps,
          rope.k.head_stride);
}

void Device::RopeMlaAbsorbQuery(const RopeKv& rope, const kernels::KvLayerView& kv,
                                const float* q, const StepBatch& b, const MlaWeights& w,
                                const kernels::MlaParams& p, float* out) {
  NormHeads(rope, b.n_tokens);
  RopeKvWrite(rope.q, rope.k, b, *rope.cfg, rope.inv_freq, kv, rope.k_rows, rope.v_rows,
              rope.norm);
  MlaAbsorbQuery(q, b, w, p, out);
}

void Device::MlaProjectMatMuls(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                               const kernels::MlaParams& p, float* out,
                               std::initializer_list<MatMulOut> outs) {
  MlaProjectOutput(o_lat, b, w, p, out);
  MatMuls(out, b.n_tokens, outs);
}

void Device::MatMulMoeRoute(const DeviceMatrix& router, const float* x, int64_t n_tokens,
                            float* logits, const float* bias, const kernels::MoeRouting& p,
                            int32_t* ids, float* w) {
  MatMul(router, x, n_tokens, logits);
  MoeRoute(logits, bias, n_tokens, p, ids, w);
}

void Device::GatedExpertsMatMul(GatedActivation act, const float* gate, const float* up,
                                float* h, int64_t n_tokens, int k, int64_t n,
                                const DeviceExperts& w, const int32_t* ids, float* y) {
  Gated(act, gate, up, h, n_tokens * k * n);
  ExpertsMatMul(w, h, n_tokens, ids, k, /*x_per_slot=*/true, y);
}

void Device::MoeDown(GatedActivation act, float* gate, const float* up, int64_t n_tokens, int k,
                     int64_t n, const DeviceExperts& down, const int32_t* ids, const float* w,
                     const SharedExperts& shared, float* ys, float* out) {
  GatedExpertsMatMul(act, gate, up, gate, n_tokens, k, n, down, ids, ys);
  if (!shared.down) {
    SlotSum(ys, w, n_tokens, k, down.rows, out);
    return;
  }
  GatedMatMuls(act, shared.gate, shared.up, shared.gate, n_tokens, shared.n,
               {{shared.down, out, nullptr, true, SlotRows{ys, w, k}}});
}

void Device::RopeKvWrite(const RopeHeads& q, const RopeHeads& k, const StepBatch& b,
                         const kernels::RopeConfig& cfg, const float* inv_freq,
                         const kernels::KvLayerView& kv, const float* k_rows,
                         const float* v_rows, const RowNorm& norm) {
  if (norm.x) RmsNorm(norm.x, norm.w, 0.f, norm.x, b.n_tokens, norm.n, norm.eps, norm.stride);
  for (const RopeHeads* h : {&q, &k})
    if (h->x) Rope(h->x, h->n_heads, h->head_stride, h->token_stride, b, cfg, inv_freq);
  KvWrite(kv, b, k_rows, v_rows);
}

StatusOr<DeviceMatrix> Device::Describe(const TensorView& w, const float* int8_scales) const {
  if (w.ndim() != 2) return InvalidArgument(w.name + ": a device matrix must be 2-D");
  if (!SupportsWeights(w.dtype))
    return Unimplemented(w.name + ": weights of type " + DTypeName(w.dtype) + " on " + Name());
  if (w.dtype == DType::kI8 && !int8_scales)
    return InvalidArgument(w.name + ": INT8 weights need their scales");
  DeviceMatrix m;
  m.dtype = w.dtype;
  m.rows = w.rows();
  m.cols = w.cols();
  m.row_bytes = w.row_bytes();
  m.data = w.data;
  m.scales = int8_scales;
  m.host = w;
  return m;
}

StatusOr<DeviceExperts> Device::UploadExperts(const std::vector<const TensorView*>& experts,
                                              std::vector<void*>* allocs,
                                              const std::vector<const float*>& int8_scales,
                                              bool int8_activations) {
  if (experts.empty()) return InvalidArgument("no experts to upload");
  if (!int8_scales.empty() && int8_scales.size() != experts.size())
    return InvalidArgument("INT8 experts: one scale array per expert");
  DeviceExperts out;
  out.int8_activations = int8_activations;
  std::vector<const uint8_t*> ptrs;
  std::vector<const float*> scales;  // (INT8)
  for (size_t i = 0; i < experts.size(); ++i) {
    const TensorView* t = experts[i];
    if (!t) {  // another rank's expert
      ptrs.push_back(nullptr);
      scales.push_back(nullptr);
      out.experts.emplace_back();
      continue;
    }
    const float* s = int8_scales.empty() ? nullptr : int8_scales[i];
    PENG_ASSIGN_OR_RETURN(DeviceMatrix m, Upload(*t, s));
    m.int8_activations = int8_activations;
    if (m.data != t->data) allocs->push_back(const_cast<void*>(m.data));
    if (m.scales != s) allocs->push_back(const_cast<float*>(m.scales));
    scales.push_back(m.scales);
    if (out.rows > 0 && (m.dtype != out.dtype || m.rows != out.rows || m.cols != out.cols))
      return InvalidArgument(t->name + ": experts of one layer differ in type or shape");
    out.dtype = m.dtype;
    out.rows = m.rows;
    out.cols = m.cols;
    out.row_bytes = m.row_bytes;
    ptrs.push_back(static_cast<const uint8_t*>(m.data));
    out.experts.push_back(std::move(m));
  }
  if (out.rows == 0) return InvalidArgument("no expert of the layer is held here");
  const int64_t bytes = static_cast<int64_t>(ptrs.size() * sizeof(void*));
  PENG_ASSIGN_OR_RETURN(void* table, Alloc(bytes));
  allocs->push_back(table);
  PENG_RETURN_IF_ERROR(CopyToDevice(table, ptrs.data(), bytes));
  out.data = static_cast<const uint8_t* const*>(table);
  if (out.dtype == DType::kI8) {
    PENG_ASSIGN_OR_RETURN(void* st, Alloc(bytes));
    allocs->push_back(st);
    PENG_RETURN_IF_ERROR(CopyToDevice(st, scales.data(), bytes));
    out.scales = static_cast<const float* const*>(st);
  }
  return out;
}

void Device::CopyKvBlock(const kernels::KvLayerView& kv, int32_t src, int32_t dst) {
  const int64_t rows = int64_t{kv.block_size} * kv.n_kv_heads;
  const auto kb = static_cast<int64_t>(RowBytes(kv.dtype, rows * kv.head_dim));
  const auto vb = static_cast<int64_t>(RowBytes(kv.dtype, rows * kv.v_head_dim));
  char* k = static_cast<char*>(kv.k);
  char* v = static_cast<char*>(kv.v);
  CopyOnDevice(k + dst * kb, k + src * kb, kb);
  if (v) CopyOnDevice(v + dst * vb, v + src * vb, vb);  // (an MLA latent cache has no V)
}

int CudaDeviceCount() {
#ifdef PENG_HAVE_CUDA
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

namespace {
std::map<std::string, DeviceFactory>& Registered() {
  static std::map<std::string, DeviceFactory> m;
  return m;
}
}  // namespace

void RegisterDevice(const std::string& name, DeviceFactory factory) {
  Registered()[name] = factory;
}

StatusOr<int> ParseDeviceSpec(const std::string& spec) {
  if (spec == "host" || Registered().count(spec)) return -1;
  if (spec == "cuda") return 0;
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 10) {
    char* end = nullptr;
    const long v = std::strtol(spec.c_str() + 5, &end, 10);
    if (*end == '\0' && spec[5] >= '0' && spec[5] <= '9') return static_cast<int>(v);
  }
  return InvalidArgument("unknown device '" + spec + "' (expected cpu, host, cuda or cuda:N)");
}

StatusOr<std::unique_ptr<Device>> CreateDevice(const std::string& spec, ThreadPool* pool) {
  if (const auto it = Registered().find(spec); it != Registered().end()) return it->second();
  PENG_ASSIGN_OR_RETURN(int index, ParseDeviceSpec(spec));
  if (index < 0) return CreateHostDevice(pool);
#ifdef PENG_HAVE_CUDA
  // Plain "cuda" in an MPI job: one GPU per rank of this host (its local rank).
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (spec == "cuda" && local && cuda::DeviceCount() > 0)
    index = std::atoi(local) % cuda::DeviceCount();
  return cuda::CreateDevice(index);
#else
  return Unimplemented("--device " + spec +
                       ": this peng was built without the CUDA backend (cmake -DPENG_CUDA=ON "
                       "with the CUDA toolkit installed)");
#endif
}

}  // namespace peng::backend
