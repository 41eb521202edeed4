// quant_config.json: how the weights of a model folder written by `peng quantize` are stored.
//
//   {"format": "peng-int8", "format_version": 1, "scheme": "w8a16" | "w8a8",
//    "weight_dtype": "int8", "symmetric": true, "granularity": "per_channel", "group_size": -1,
//    "scale_suffix": "_scale", "activation": "per_token_dynamic" (w8a8) | "none" (w8a16),
//    "quantized": [HF tensor names], "skipped": [{"name": ..., "reason": ...}], "source": ...}
//
// Every quantized tensor NAME (a 2-D [rows, cols] weight) is stored as I8 and has a companion
// F32 tensor NAME + "_scale" of shape [rows] (or [rows, 1]): w[r, c] = scale[r] * q[r, c].
// Everything else keeps a floating-point dtype. ValidateQuantizedTensors() checks that the
// config and the tensors agree, so a mismatched folder fails at load with a message naming the
// tensor instead of producing garbage.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "core/tensor.h"

namespace peng {

enum class QuantScheme { kNone, kW8A16, kW8A8 };

inline constexpr int kQuantFormatVersion = 1;
inline constexpr const char* kQuantScaleSuffix = "_scale";

const char* QuantSchemeName(QuantScheme s);  // "none", "w8a16", "w8a8"
// "w8a16" / "w8a8" -> scheme; anything else is an InvalidArgument naming the accepted values.
StatusOr<QuantScheme> ParseQuantScheme(const std::string& s);

struct QuantConfig {
  QuantScheme scheme = QuantScheme::kNone;
  int format_version = kQuantFormatVersion;
  int group_size = -1;                 // -1 = one scale per output channel (row)
  std::vector<std::string> quantized;  // HF tensor names stored as I8
  std::vector<std::pair<std::string, std::string>> skipped;  // name, reason
  std::string source;                  // what was quantized (informational)

  nlohmann::json ToJson() const;
  // `where` names the file in error messages.
  static StatusOr<QuantConfig> FromJson(const nlohmann::json& j, const std::string& where);
};

// Checks the tensors of a folder against its quant config (`cfg` null when the folder has no
// quant_config.json): every I8 tensor is 2-D, listed as quantized and has an F32 scale of
// `rows` finite, non-negative values; every listed tensor exists as I8; no stray scales.
// Tensors are named as stored (HF names).
Status ValidateQuantizedTensors(const QuantConfig* cfg, const std::vector<const TensorView*>& all,
                                const std::string& where);

}  // namespace peng
