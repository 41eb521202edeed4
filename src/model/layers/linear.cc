#include "model/layers/linear.h"

#include <cstdlib>
#include <cstring>

#include "kernels/ops.h"

namespace peng {

void Int8Acts::Resize(int64_t t, int64_t c) {
  tokens = t;
  cols = c;
  if (static_cast<int64_t>(q.size()) < t * c) q.resize(t * c);
  const int64_t n_scales = t * (c / kernels::kInt8ActGroup);
  if (static_cast<int64_t>(scales.size()) < n_scales) scales.resize(n_scales);
}

StatusOr<const float*> BindVector(const ModelFiles& files, const std::string& name, int64_t n,
                                  bool optional, std::deque<std::vector<float>>* owned) {
  const TensorView* t = files.Find(name);
  if (!t) {
    if (optional) return static_cast<const float*>(nullptr);
    return NotFound(files.path() + ": missing tensor '" + name + "'");
  }
  if (t->numel() != n)
    return DataLoss(files.path() + ": tensor '" + name + "' has shape " + t->ShapeString() +
                    ", expected " + std::to_string(n) + " values");
  if (t->dtype == DType::kF32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0)
    return static_cast<const float*>(t->data);
  if (t->dtype != DType::kF32 && !kernels::MatMulSupports(t->dtype))
    return Unimplemented(files.path() + ": tensor '" + name + "' has unsupported type " +
                         DTypeName(t->dtype));
  std::vector<float>& v = owned->emplace_back(n);
  if (t->dtype == DType::kF32) {
    std::memcpy(v.data(), t->data, n * sizeof(float));
  } else {
    kernels::DequantizeRow(t->dtype, t->data, v.data(), n);
  }
  return static_cast<const float*>(v.data());
}

StatusOr<Linear> Linear::Bind(const ModelFiles& files, const std::string& name, int64_t rows,
                              int64_t cols) {
  PENG_ASSIGN_OR_RETURN(Linear l, BindView(files, name, rows, cols));
  l.AttachPanels();
  return l;
}

void Linear::AttachPanels() {
  owned_panels_.reset();
  if (!w_) return;
  std::shared_ptr<const uint8_t> packed = kernels::PackPanels(*w_);  // (INT8 too: Int8View)
  if (!packed) return;
  auto view = std::make_shared<TensorView>(*w_);
  view->panels = packed.get();
  owned_view_ = view;
  w_ = view.get();
  owned_panels_ = std::move(packed);
}

StatusOr<Linear> Linear::BindView(const ModelFiles& files, const std::string& name, int64_t rows,
                                  int64_t cols) {
  PENG_ASSIGN_OR_RETURN(const TensorView* t, files.Require(name));
  if (t->ndim() != 2 || t->dim(0) != rows || t->dim(1) != cols)
    return DataLoss(files.path() + ": tensor '" + name + "' has shape " + t->ShapeString() +
                    ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  Linear l;
  l.w_ = t;
  l.name_ = name;
  l.rows_ = rows;
  l.cols_ = cols;
  if (t->dtype != DType::kI8) {
    if (!kernels::MatMulSupports(t->dtype))
      return Unimplemented(files.path() + ": tensor '" + name + "' has unsupported type " +
                           DTypeName(t->dtype));
    return l;
  }
  // INT8: ModelFiles validated the scale's presence, dtype and shape against quant_config.json.
  const TensorView* s = files.Find(name + kQuantScaleSuffix);
  if (!s || s->numel() != rows || s->dtype != DType::kF32)
    return DataLoss(files.path() + ": INT8 tensor '" + name + "' has no valid scale tensor");
  PENG_RETURN_IF_ERROR(l.AttachInt8Scales(files, static_cast<const float*>(s->data)));
  PENG_RETURN_IF_ERROR(l.CheckW8A8Range(files));
  return l;
}

StatusOr<Linear> Linear::BindSlice(const ModelFiles& files, const std::string& name, int64_t n,
                                   int64_t total_rows, int64_t cols, int64_t index, int64_t row0,
                                   int64_t rows, const std::string& display_name) {
  PENG_ASSIGN_OR_RETURN(const TensorView* t, files.Require(name));
  if (t->ndim() != 3 || t->dim(0) != n || t->dim(1) != total_rows || t->dim(2) != cols)
    return DataLoss(files.path() + ": tensor '" + name + "' has shape " + t->ShapeString() +
                    ", expected [" + std::to_string(n) + ", " + std::to_string(total_rows) + ", " +
                    std::to_string(cols) + "]");
  if (index < 0 || index >= n || row0 < 0 || rows <= 0 || row0 + rows > total_rows)
    return InvalidArgument(files.path() + ": slice [" + std::to_string(index) + "][" +
                           std::to_string(row0) + ":" + std::to_string(row0 + rows) +
                           "] is outside tensor '" + name + "' " + t->ShapeString());
  if (t->dtype != DType::kI8 && !kernels::MatMulSupports(t->dtype))
    return Unimplemented(files.path() + ": tensor '" + name + "' has unsupported type " +
                         DTypeName(t->dtype) + " for a stacked (3-D) matrix");
  auto view = std::make_shared<TensorView>();
  view->name = display_name;
  view->dtype = t->dtype;
  view->shape = {rows, cols};
  const size_t row_bytes = t->row_bytes();
  view->data = static_cast<const uint8_t*>(t->data) +
               static_cast<size_t>(index * total_rows + row0) * row_bytes;
  view->size_bytes = static_cast<size_t>(rows) * row_bytes;
  Linear l;
  l.owned_view_ = view;
  l.w_ = view.get();
  l.name_ = display_name;
  l.rows_ = rows;
  l.cols_ = cols;
  if (t->dtype == DType::kI8) {
    // INT8 stacked matrices keep one scale per row of every matrix: NAME_scale [n, total_rows].
    const TensorView* s = files.Find(name + kQuantScaleSuffix);
    if (!s || s->dtype != DType::kF32 || s->numel() != n * total_rows)
      return DataLoss(files.path() + ": INT8 tensor '" + name + "' has no valid scale tensor");
    PENG_RETURN_IF_ERROR(l.AttachInt8Scales(files, static_cast<const float*>(s->data) +
                                                       index * total_rows + row0));
    PENG_RETURN_IF_ERROR(l.CheckW8A8Range(files));
  }
  l.AttachPanels();
  return l;
}

namespace {
// Values per stored block of a matrix: the granularity of a column split.
int64_t BlockValues(DType t) {
  return t == DType::kI8 ? int64_t{kernels::kInt8ColAlign} : int64_t{GetDTypeInfo(t).block_size};
}
}  // namespace

StatusOr<int64_t> Linear::ColumnGranularity(const ModelFiles& files, const std::string& name) {
  PENG_ASSIGN_OR_RETURN(const TensorView* t, files.Require(name));
  return BlockValues(t->dtype);
}

StatusOr<Linear> Linear::BindShard(const ModelFiles& files, const std::string& name,
                                   int64_t rows_total, int64_t cols_total, int64_t row0,
                                   int64_t rows, int64_t col0, int64_t cols) {
  PENG_ASSIGN_OR_RETURN(Linear l, BindView(files, name, rows_total, cols_total));
  if (row0 < 0 || rows <= 0 || row0 + rows > rows_total || col0 < 0 || cols <= 0 ||
      col0 + cols > cols_total)
    return InvalidArgument(files.path() + ": shard [" + std::to_string(row0) + ":" +
                           std::to_string(row0 + rows) + ", " + std::to_string(col0) + ":" +
                           std::to_string(col0 + cols) + "] is outside tensor '" + name + "' " +
                           l.w_->ShapeString());
  if (row0 != 0 || rows != rows_total) {  // whole rows: a view into the file
    const TensorView& t = *l.w_;
    auto view = std::make_shared<TensorView>();
    view->name = name;
    view->dtype = t.dtype;
    view->shape = {rows, cols_total};
    view->data = t.row(row0);
    view->size_bytes = static_cast<size_t>(rows) * t.row_bytes();
    l.owned_view_ = view;
    l.w_ = view.get();
    l.rows_ = rows;
    if (l.int8_) PENG_RETURN_IF_ERROR(l.AttachInt8Scales(files, l.scales_ + row0));
  }
  if (col0 != 0 || cols != cols_total) return l.Columns(files, col0, cols);
  l.AttachPanels();
  return l;
}

StatusOr<Linear> Linear::Columns(const ModelFiles& files, int64_t col0, int64_t cols) const {
  const TensorView& t = *w_;
  const int64_t g = BlockValues(t.dtype);
  if (col0 < 0 || cols <= 0 || col0 + cols > cols_)
    return InvalidArgument(files.path() + ": columns " + std::to_string(col0) + ":" +
                           std::to_string(col0 + cols) + " are outside tensor '" + name_ + "' " +
                           t.ShapeString());
  if (col0 % g != 0 || cols % g != 0)
    return InvalidArgument(files.path() + ": cannot split tensor '" + name_ + "' (" +
                           DTypeName(t.dtype) + ", blocks of " + std::to_string(g) +
                           " values) at columns " + std::to_string(col0) + ":" +
                           std::to_string(col0 + cols) +
                           " for tensor parallelism: choose another tensor-parallel size");
  const size_t in_row = t.row_bytes();
  const size_t off = RowBytes(t.dtype, col0), row_bytes = RowBytes(t.dtype, cols);
  auto view = std::make_shared<TensorView>();
  view->name = t.name;
  view->dtype = t.dtype;
  view->shape = {rows_, cols};
  view->size_bytes = static_cast<size_t>(rows_) * row_bytes;
  Linear l = *this;
  const size_t n = (view->size_bytes + 63) / 64 * 64;
  l.owned_bytes_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(std::aligned_alloc(64, n)),
                                            [](uint8_t* p) { std::free(p); });
  if (!l.owned_bytes_) return ResourceExhausted("out of memory for a shard of '" + name_ + "'");
  for (int64_t r = 0; r < rows_; ++r)
    std::memcpy(l.owned_bytes_.get() + r * row_bytes,
                static_cast<const uint8_t*>(t.data) + r * in_row + off, row_bytes);
  view->data = l.owned_bytes_.get();
  l.owned_view_ = view;
  l.w_ = view.get();
  l.cols_ = cols;
  if (l.int8_) PENG_RETURN_IF_ERROR(l.AttachInt8Scales(files, l.scales_));  // checks cols
  l.AttachPanels();
  return l;
}

Status Linear::AttachInt8Scales(const ModelFiles& files, const float* scales) {
  if (cols_ % kernels::kInt8ColAlign != 0 || cols_ > kernels::kInt8MaxCols)
    return Unimplemented(files.path() + ": INT8 tensor '" + name_ + "' has " +
                         std::to_string(cols_) + " columns; INT8 kernels need a multiple of " +
                         std::to_string(kernels::kInt8ColAlign));
  int8_ = true;
  scheme_ = files.quant_scheme();
  if (reinterpret_cast<uintptr_t>(scales) % alignof(float) == 0) {
    scales_ = scales;
  } else {
    owned_scales_ = std::make_shared<std::vector<float>>(rows_);
    std::memcpy(owned_scales_->data(), scales, rows_ * sizeof(float));
    scales_ = owned_scales_->data();
  }
  return OkStatus();
}

Status Linear::CheckW8A8Range(const ModelFiles& files) const {
  // W8A8 takes symmetric weights only: its kernels multiply |x| by w with x's sign
  // (int8_gemm.h), and -128 has no positive twin. peng quantize writes [-127, 127]; a folder
  // written otherwise is refused here rather than multiplied wrongly.
  if (!int8_activations()) return OkStatus();
  const auto* q = static_cast<const uint8_t*>(w_->data);
  const void* bad = std::memchr(q, 0x80, static_cast<size_t>(rows_ * cols_));
  if (!bad) return OkStatus();
  return InvalidArgument(files.path() + ": INT8 tensor '" + name_ + "' holds -128 (row " +
                         std::to_string((static_cast<const uint8_t*>(bad) - q) / cols_) +
                         "); W8A8 weights must be in [-127, 127], as peng quantize writes them");
}

bool Linear::WantsInt8Acts() const {
  return int8_activations() && !kernels::ExactActivations();
}

int64_t Linear::bytes() const {
  return static_cast<int64_t>(w_->size_bytes) + (int8_ ? rows_ * 4 : 0);
}

void WeightTraffic::Add(const Linear& l, int64_t times) {
  bytes += l.bytes() * times;
  const bool integer = l.is_int8() || GetDTypeInfo(l.tensor().dtype).quantized;
  (integer ? int_multiply_adds : float_multiply_adds) += l.rows() * l.cols() * times;
}

kernels::Int8Weights Linear::Int8View() const {
  return {static_cast<const int8_t*>(w_->data), scales_, rows_, cols_, w_->panels};
}

void Linear::Forward(const float* x, const Int8Acts* xq, int64_t n_tokens, float* y,
                     ThreadPool* pool, Int8Acts* scratch) const {
  if (!int8_) {
    kernels::MatMul(*w_, x, n_tokens, y, pool);
    return;
  }
  if (!WantsInt8Acts()) {
    kernels::Int8MatMulW8A16(Int8View(), x, n_tokens, y, pool);
    return;
  }
  if (!xq || xq->tokens != n_tokens || xq->cols != cols_) {
    scratch->Resize(n_tokens, cols_);
    kernels::QuantizeActivations(x, n_tokens, cols_, scratch->q.data(), scratch->scales.data());
    xq = scratch;
  }
  kernels::Int8MatMul(Int8View(), xq->q.data(), xq->scales.data(), n_tokens, y, pool);
}

void Linear::ForwardGroup(const Linear* const* ls, float* const* ys, int n, const float* x,
                          const Int8Acts* xq, int64_t n_tokens, ThreadPool* pool,
                          Int8Acts* scratch) {
  constexpr int kMax = kernels::kMaxMatMulGroup;
  bool grouped = n <= kMax;
  for (int i = 0; i < n && grouped; ++i) grouped = !ls[i]->int8_;
  if (!grouped) {
    for (int i = 0; i < n; ++i) ls[i]->Forward(x, xq, n_tokens, ys[i], pool, scratch);
    return;
  }
  kernels::MatMulOut outs[kMax];
  for (int i = 0; i < n; ++i) outs[i] = {ls[i]->w_, ys[i], nullptr};
  kernels::MatMulGroup(outs, n, x, n_tokens, pool);
}

void Linear::DequantizeRow(int64_t r, float* out) const {
  if (!int8_) {
    kernels::DequantizeRow(w_->dtype, w_->row(r), out, cols_);
    return;
  }
  const int8_t* q = static_cast<const int8_t*>(w_->data) + r * cols_;
  const float s = scales_[r];
  for (int64_t c = 0; c < cols_; ++c) out[c] = s * static_cast<float>(q[c]);
}

}  // namespace peng
