// CudaDevice's mixture-of-experts ops (included by cuda_device.cu after the class, whose
// declarations say what each does: one translation unit): routing (inside the router's GEMV
// where it fits), the experts' GEMVs per (token, slot) pair, prefill's pairs grouped by expert,
// the slot sum.
#pragma once

namespace peng::backend::cuda {
namespace {

void CudaDevice::MoeRoute(const float* logits, const float* bias, int64_t T,
                          const kernels::MoeRouting& p, int32_t* ids, float* w) {
  if (T == 0) return;
  if (p.n_experts > kernels::kMaxRoutedExperts || p.k > kMaxTopK || p.n_group > kMaxGroups) {
    Keep(Unimplemented(name_ + ": routing over more than 512 experts, 16 groups or top-16"));
    return;
  }
  Launch(MoeRouteKernel, T, kWarp, launch_, logits, bias, T, p, ids, w);
  Note(cudaGetLastError());
}

void CudaDevice::MatMulMoeRoute(const DeviceMatrix& r, const float* x, int64_t T, float* logits,
                                const float* bias, const kernels::MoeRouting& p, int32_t* ids,
                                float* w) {
  if (!RouteTailFits(r, T, p)) {
    Device::MatMulMoeRoute(r, x, T, logits, bias, p, ids, w);
    return;
  }
  WithType(r.dtype, [&]<DType D>() {
    Launch(RouterKernel<D>, dim3(Blocks(r.rows, kRowsPerBlock), T), kRowsPerBlock * kWarp, launch_,
           static_cast<const uint8_t*>(r.data), r.row_bytes, r.rows, r.cols, x, T, logits, bias, p,
           ids, w, route_done_);
  });
  Note(cudaGetLastError());
}

// Whether the routed experts' products of a step of T tokens are a GEMV per (token, slot)
// pair: up to kExpertsGemvMaxTokens tokens, and only below kQMmaMinTokens where the grouped
// products run on the tensor cores; else the pairs are grouped by expert
// (GroupedExpertsMatMul), each expert's rows read once a tile instead of once a pair.
bool CudaDevice::PerPairExperts(int64_t T) const {
  return T <= kExpertsGemvMaxTokens && !(mma_gemv_ && T >= kQMmaMinTokens);
}
// Format of the experts' per-pair GEMVs; kFp32Act where the pairs are grouped (they quantize
// on their own): the fused forms then compose from ExpertsMatMul.
ActFormat CudaDevice::ExpertsFormat(const DeviceExperts& w, int64_t T, int64_t rows) const {
  return PerPairExperts(T) ? Format(w.dtype, w.int8_activations, w.cols, T, rows) : kFp32Act;
}

void CudaDevice::ExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T,
                               const int32_t* ids, int k, bool x_per_slot, float* y) {
  if (T == 0) return;
  if (!PerPairExperts(T)) {
    GroupedExpertsMatMul(w, x, T, ids, k, x_per_slot, y);
    return;
  }
  if (QuantizedExperts(x, T, ids, k, x_per_slot, {{&w, y}})) return;
  WithType(w.dtype, [&]<DType D>() {
    auto kernel = ExpertsGemvKernel<D>;
    for (int64_t p0 = 0; p0 < T * k; p0 += kMaxGridY) {
      const dim3 grid(Blocks(w.rows, kRowsPerBlock), std::min(kMaxGridY, T * k - p0));
      Launch(kernel, grid, kRowsPerBlock * kWarp, launch_, w.data, w.scales, w.row_bytes, w.rows,
             w.cols, x, ids, k, x_per_slot, p0, y);
    }
  });
  Note(cudaGetLastError());
}

void CudaDevice::GatedExpertsMatMul(GatedActivation act, const float* gate, const float* up,
                                    float* h, int64_t T, int k, int64_t n, const DeviceExperts& w,
                                    const int32_t* ids, float* y) {
  if (T == 0) return;
  const ActFormat f = n == w.cols ? ExpertsFormat(w, T, T * k) : kFp32Act;
  if (f == kFp32Act) {
    Device::GatedExpertsMatMul(act, gate, up, h, T, k, n, w, ids, y);
    return;
  }
  const Ew op = act == GatedActivation::kSilu ? Ew::kSilu : Ew::kGelu;
  // The activation inside the GEMV's blocks (GatedExpertsQGemvKernel), under the rule of
  // LaunchQGemv's: at most kFusedInputBlocksPerSm blocks a multiprocessor, a block taking 1,
  // 2 or 4 times its rows.
  const int64_t pairs = T * k, most = int64_t{kFusedInputBlocksPerSm} * sm_count_;
  int passes = 1;
  auto blocks = [&](int p) { return Blocks(w.rows, kRowsPerBlock * p) * pairs; };
  while (passes < 4 && blocks(passes) > most) passes *= 2;
  if (fused_input_ && n <= kFusedInputValues && blocks(passes) <= most) {
    ExpertMats m;
    m.experts[0] = w.data;
    m.scales[0] = w.scales;
    m.y[0] = y;
    const FusedInput fi{.kind = FusedInput::kGated,
                        .x = gate,
                        .up = up,
                        .op = op,
                        .y = h,
                        .n = n,
                        .q32 = {},
                        .q256 = {},
                        .route = {}};
    WithType(w.dtype, [&]<DType D>() {
      if constexpr (layout::kIntDot<D>) {
        Launch(GatedExpertsQGemvKernel<D>, dim3(Blocks(w.rows, kRowsPerBlock * passes), pairs),
               kRowsPerBlock * kWarp, launch_, m, w.row_bytes, w.rows, fi, ids, int64_t{0}, passes);
      }
    });
    Note(cudaGetLastError());
    return;
  }
  const QActOut q = WriteOut(f, w.cols);
  Launch(GatedQuantKernel, dim3(Blocks(n, 256), T * k), 256, launch_, op, gate, up, h, n,
         Q32Slot(f, q), Q256Slot(f, q));
  Note(cudaGetLastError());
  QuantizedExperts(h, T, ids, k, /*x_per_slot=*/true, {{&w, y}}, /*quantize=*/false);
}

void CudaDevice::ExpertsMatMuls(const float* x, int64_t T, const int32_t* ids, int k,
                                bool x_per_slot, std::initializer_list<ExpertsOut> outs) {
  if (T == 0) return;
  // Quantized by NormMatMuls already, for these experts' blocks, and nothing has written the
  // scratch since.
  const DeviceExperts& w = *outs.begin()->w;
  const bool ready = !x_per_slot && prepared_.x == x && prepared_.T == T &&
                     prepared_.writes == act_writes_ && prepared_.format == ExpertsFormat(w, T, T);
  if (QuantizedExperts(x, T, ids, k, x_per_slot, outs, /*quantize=*/!ready)) return;
  for (const ExpertsOut& o : outs) ExpertsMatMul(*o.w, x, T, ids, k, x_per_slot, o.y);
}

void CudaDevice::SlotSum(const float* y, const float* w, int64_t T, int k, int64_t n, float* out) {
  if (T == 0) return;
  Launch(SlotSumKernel, Blocks(T * n, 256), 256, launch_, y, w, T, k, n, out);
  Note(cudaGetLastError());
}

void CudaDevice::MoeDown(GatedActivation act, float* gate, const float* up, int64_t T, int k,
                         int64_t n, const DeviceExperts& down, const int32_t* ids,
                         const float* w, const SharedExperts& shared, float* ys, float* out) {
  if (T == 0) return;
  const DeviceMatrix* sd = shared.down;
  const ActFormat f = n == down.cols ? ExpertsFormat(down, T, T * k) : kFp32Act;
  bool fits = fused_moe_down_ && fused_input_ && f != kFp32Act && n <= kFusedInputValues;
  if (sd)
    fits &= sd->dtype == down.dtype && Format(*sd, T) == f && sd->rows == down.rows &&
            shared.n == sd->cols && shared.n <= kFusedInputValues;
  const int64_t pairs = T * (k + (sd ? 1 : 0));
  const int64_t most = int64_t{kFusedInputBlocksPerSm} * sm_count_;
  int passes = 1;
  auto blocks = [&](int p) { return Blocks(down.rows, kRowsPerBlock * p); };
  while (passes < 8 && blocks(passes) * pairs > most) passes *= 2;
  fits &= blocks(passes) * pairs <= most && T * blocks(passes) <= kMoeDownCounts;
  if (!fits) {
    Device::MoeDown(act, gate, up, T, k, n, down, ids, w, shared, ys, out);
    return;
  }
  MoeDownArgs a;
  a.experts = down.data;
  a.scales = down.scales;
  a.row_bytes = down.row_bytes;
  a.gate = gate;
  a.up = up;
  a.n = n;
  if (sd) {
    a.shared = static_cast<const uint8_t*>(sd->data);
    a.shared_scale = sd->dtype == DType::kI8 ? sd->scales : nullptr;
    a.shared_row_bytes = sd->row_bytes;
    a.shared_gate = shared.gate;
    a.shared_up = shared.up;
    a.shared_n = shared.n;
  }
  a.rows = down.rows;
  a.op = act == GatedActivation::kSilu ? Ew::kSilu : Ew::kGelu;
  a.ids = ids;
  a.w = w;
  a.k = k;
  a.ys = ys;
  a.out = out;
  a.done = moe_down_done_;
  WithType(down.dtype, [&]<DType D>() {
    if constexpr (layout::kIntDot<D>)
      Launch(MoeDownKernel<D>, dim3(blocks(passes), pairs), kRowsPerBlock * kWarp, launch_, a,
             passes);
  });
  Note(cudaGetLastError());
}

bool CudaDevice::QuantizedExperts(const float* x, int64_t T, const int32_t* ids, int k,
                                  bool x_per_slot, std::initializer_list<ExpertsOut> outs,
                                  bool quantize) {
  const DeviceExperts& w = *outs.begin()->w;
  const int64_t x_rows = x_per_slot ? T * k : T;
  const ActFormat f = ExpertsFormat(w, T, x_rows);
  if (f == kFp32Act || outs.size() > 2) return false;
  ExpertMats m;
  int i = 0;
  for (const ExpertsOut& o : outs) {
    if (o.w->dtype != w.dtype || o.w->rows != w.rows || o.w->cols != w.cols) return false;
    m.experts[i] = o.w->data;
    m.scales[i] = o.w->scales;
    m.y[i++] = o.y;
  }
  if (quantize) {
    const QActOut q = WriteOut(f, w.cols);
    Launch(QuantizeActKernel, dim3(Blocks(w.cols, 256), x_rows), 256, launch_, x, w.cols,
           Q32Slot(f, q), Q256Slot(f, q));
  }
  WithType(w.dtype, [&]<DType D>() {
    if constexpr (layout::kIntDot<D>) {
      for (int64_t p0 = 0; p0 < T * k; p0 += kMaxGridY) {
        const dim3 grid(Blocks(w.rows, kRowsPerBlock), std::min(kMaxGridY, T * k - p0), i);
        Launch(ExpertsQGemvKernel<D>, grid, kRowsPerBlock * kWarp, launch_, m, w.row_bytes, w.rows,
               Act(f, w.cols), ids, k, x_per_slot, p0);
      }
    }
  });
  Note(cudaGetLastError());
  return true;
}

void CudaDevice::GroupedExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T,
                                      const int32_t* ids, int k, bool x_per_slot, float* y) {
  const int64_t n_pairs = T * k;
  const int E = static_cast<int>(w.experts.size());
  if (E > kernels::kMaxRoutedExperts) {
    Keep(Unimplemented(name_ + ": more than 512 experts"));
    return;
  }
  if (!Grow(&group_, &group_bytes_, GroupBytes(E, n_pairs))) return;
  int32_t* offsets = static_cast<int32_t*>(group_);
  int32_t* tile_start = offsets + (E + 1);
  int32_t* cursor = tile_start + (E + 1);
  int32_t* list = cursor + (E + 1);
  // The activations quantized as the GEMVs take them (on the tensor cores in tiles of
  // kQMmaTileTokens pairs, GroupedExpertsQMmaKernel; PENG_CUDA_MMA_GEMV=0: by dp4a in tiles of
  // kTokenTile, GroupedExpertsQGemvKernel): in the scratch where their rows fit, else in one
  // of their own (the routed experts' down projection over a long prompt's pairs).
  const int64_t x_rows = x_per_slot ? n_pairs : T;
  const ActFormat f = Format(w.dtype, w.int8_activations, w.cols, /*T=*/1, /*rows=*/1);
  const bool mma = f != kFp32Act && mma_gemv_;
  const int tile_pairs = mma ? kQMmaTileTokens : kTokenTile;
  Launch(ExpertTilesKernel, 1, 256, launch_, ids, n_pairs, E, tile_pairs, offsets, tile_start,
         cursor);
  Launch(ScatterPairsKernel, Blocks(n_pairs, 256), 256, launch_, ids, n_pairs, offsets, cursor,
         list);
  QActOut q;
  if (f != kFp32Act && x_rows <= kMaxActRows) {
    q = WriteOut(f, w.cols);
  } else if (f != kFp32Act) {
    if (!Grow(&group_act_, &group_act_bytes_, ActRegionBytes(w.cols, x_rows))) return;
    q = ActAt(static_cast<uint8_t*>(group_act_), x_rows, f, w.cols);
  }
  if (f != kFp32Act)
    Launch(QuantizeActKernel, dim3(Blocks(w.cols, 256), x_rows), 256, launch_, x, w.cols,
           Q32Slot(f, q), Q256Slot(f, q));
  // At most ceil(n_pairs / tile_pairs) + E tiles; blocks past the last one return at once.
  const int64_t max_tiles = Blocks(n_pairs, tile_pairs) + E;
  WithType(w.dtype, [&]<DType D>() {
    for (int64_t g0 = 0; g0 < max_tiles; g0 += kMaxGridY) {
      const dim3 grid(Blocks(w.rows, kRowsPerBlock), std::min(kMaxGridY, max_tiles - g0));
      if constexpr (layout::kIntDot<D>) {
        if (mma) {
          Launch(GroupedExpertsQMmaKernel<D>,
                 dim3(Blocks(w.rows, kQMmaRows), std::min(kMaxGridY, max_tiles - g0)),
                 kQMmaWarps * kWarp, launch_, w.data, w.scales, w.row_bytes, w.rows,
                 QAct{q.qs, q.d, q.s, w.cols}, k, x_per_slot, E, offsets, tile_start, list, g0,
                 y);
          continue;
        }
        if (f != kFp32Act) {
          Launch(GroupedExpertsQGemvKernel<D>, grid, kRowsPerBlock * kWarp, launch_, w.data,
                 w.scales, w.row_bytes, w.rows, QAct{q.qs, q.d, q.s, w.cols}, k, x_per_slot, E,
                 offsets, tile_start, list, g0, y);
          continue;
        }
      }
      Launch(GroupedExpertsGemvKernel<D>, grid, kRowsPerBlock * kWarp, launch_, w.data, w.scales,
             w.row_bytes, w.rows, w.cols, x, k, x_per_slot, E, offsets, tile_start, list, g0, y);
    }
  });
  Note(cudaGetLastError());
}

}  // namespace
}  // namespace peng::backend::cuda
