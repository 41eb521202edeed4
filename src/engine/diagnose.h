// Where two models disagree: when `peng eval compare` finds a deviation above its threshold it
// localises it to a layer and, when both models have the same weight matrices, to a tensor.
//
//  * Layers: both models run one window; the residual stream after the embeddings and after
//    each layer is compared (relative L2 error ||h_m - h_r|| / ||h_r|| over all tokens). The
//    culprit is the layer whose output error grew the most over its input's.
//  * Tensors: every weight matrix present in both models under the same (GGUF-style) name and
//    shape is dequantized row by row and compared (relative Frobenius error). Honest INT8 keeps
//    every matrix within ~1%; a corrupted scale stands out by orders of magnitude.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/llm.h"

namespace peng::eval {

struct TensorDeviation {
  std::string name;
  double rel = 0;  // ||W_m - W_r||_F / ||W_r||_F
};

struct Diagnosis {
  // layer_rel[0] = embeddings, layer_rel[i] = output of layer i - 1.
  std::vector<double> layer_rel;
  int worst_layer = -1;       // 0-based layer whose output error grew the most
  double worst_layer_growth = 0;
};

// Per-layer residual-stream deviation on one window (empty when the shapes differ).
// `exact_ref`: run the reference with FP32 activations (kernels::SetExactActivations).
StatusOr<Diagnosis> DiagnoseLayers(Llm& model, Llm& ref, std::span<const int32_t> window,
                                   bool exact_ref);

// Relative Frobenius error of every same-named, same-shaped weight matrix (largest first).
std::vector<TensorDeviation> CompareWeights(const Model& model, const Model& ref,
                                            ThreadPool* pool);

}  // namespace peng::eval
