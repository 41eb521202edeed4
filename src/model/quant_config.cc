#include "model/quant_config.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

namespace peng {

const char* QuantSchemeName(QuantScheme s) {
  switch (s) {
    case QuantScheme::kW8A16: return "w8a16";
    case QuantScheme::kW8A8: return "w8a8";
    default: return "none";
  }
}

StatusOr<QuantScheme> ParseQuantScheme(const std::string& s) {
  if (s == "w8a16") return QuantScheme::kW8A16;
  if (s == "w8a8") return QuantScheme::kW8A8;
  return InvalidArgument("unknown quantization scheme '" + s + "' (expected w8a16 or w8a8)");
}

nlohmann::json QuantConfig::ToJson() const {
  nlohmann::json skip = nlohmann::json::array();
  for (const auto& [name, reason] : skipped) skip.push_back({{"name", name}, {"reason", reason}});
  return {{"format", "peng-int8"},
          {"format_version", format_version},
          {"scheme", QuantSchemeName(scheme)},
          {"weight_dtype", "int8"},
          {"symmetric", true},
          {"granularity", "per_channel"},
          {"group_size", group_size},
          {"scale_dtype", "float32"},
          {"scale_suffix", kQuantScaleSuffix},
          {"activation", scheme == QuantScheme::kW8A8 ? "int8_per_token_dynamic" : "none"},
          {"activation_group_size", scheme == QuantScheme::kW8A8 ? 32 : 0},
          {"accumulation", "float32"},
          {"source", source},
          {"quantized", quantized},
          {"skipped", skip}};
}

StatusOr<QuantConfig> QuantConfig::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return InvalidArgument(where + ": expected a JSON object");
  QuantConfig c;
  auto str = [&](const char* key) -> StatusOr<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      return InvalidArgument(where + ": missing string field '" + key + "'");
    return it->get<std::string>();
  };
  PENG_ASSIGN_OR_RETURN(std::string format, str("format"));
  if (format != "peng-int8")
    return InvalidArgument(where + ": unknown format '" + format + "' (expected peng-int8)");
  auto v = j.find("format_version");
  if (v == j.end() || !v->is_number_integer())
    return InvalidArgument(where + ": missing integer field 'format_version'");
  c.format_version = v->get<int>();
  if (c.format_version < 1 || c.format_version > kQuantFormatVersion)
    return InvalidArgument(where + ": format_version " + std::to_string(c.format_version) +
                           " is not supported (this peng reads version " +
                           std::to_string(kQuantFormatVersion) + ")");
  PENG_ASSIGN_OR_RETURN(std::string scheme, str("scheme"));
  auto sch = ParseQuantScheme(scheme);
  if (!sch.ok()) return InvalidArgument(where + ": " + sch.status().message());
  c.scheme = *sch;
  auto g = j.find("group_size");
  if (g != j.end()) {
    if (!g->is_number_integer()) return InvalidArgument(where + ": 'group_size' must be an integer");
    c.group_size = g->get<int>();
  }
  if (c.group_size != -1)
    return Unimplemented(where + ": group_size " + std::to_string(c.group_size) +
                         " is not supported (only -1, one scale per output channel)");
  if (j.contains("weight_dtype") && j["weight_dtype"] != "int8")
    return InvalidArgument(where + ": weight_dtype must be \"int8\"");
  if (j.contains("scale_suffix") && j["scale_suffix"] != kQuantScaleSuffix)
    return InvalidArgument(where + ": scale_suffix must be \"" + kQuantScaleSuffix + "\"");
  auto q = j.find("quantized");
  if (q == j.end() || !q->is_array())
    return InvalidArgument(where + ": missing array field 'quantized'");
  for (const auto& n : *q) {
    if (!n.is_string()) return InvalidArgument(where + ": 'quantized' must list tensor names");
    c.quantized.push_back(n.get<std::string>());
  }
  if (auto s = j.find("skipped"); s != j.end() && s->is_array()) {
    for (const auto& e : *s) {
      if (e.is_object() && e.contains("name") && e["name"].is_string())
        c.skipped.emplace_back(e["name"].get<std::string>(), e.value("reason", std::string()));
    }
  }
  if (j.contains("source") && j["source"].is_string()) c.source = j["source"].get<std::string>();
  return c;
}

Status ValidateQuantizedTensors(const QuantConfig* cfg, const std::vector<const TensorView*>& all,
                                const std::string& where) {
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView* t : all) by_name[t->name] = t;
  const size_t suffix_len = std::strlen(kQuantScaleSuffix);
  auto is_scale_name = [&](const std::string& n) {
    return n.size() > suffix_len && n.compare(n.size() - suffix_len, suffix_len,
                                              kQuantScaleSuffix) == 0;
  };
  std::set<std::string> listed;
  if (cfg) listed.insert(cfg->quantized.begin(), cfg->quantized.end());
  for (const TensorView* t : all) {
    if (t->dtype != DType::kI8) {
      if (is_scale_name(t->name)) {
        const std::string base = t->name.substr(0, t->name.size() - suffix_len);
        auto it = by_name.find(base);
        if (it == by_name.end() || it->second->dtype != DType::kI8)
          return DataLoss(where + ": scale tensor '" + t->name + "' has no INT8 tensor '" +
                          base + "'");
      }
      continue;
    }
    if (!cfg)
      return DataLoss(where + ": tensor '" + t->name +
                      "' is INT8 but the folder has no quant_config.json");
    if (!listed.count(t->name))
      return DataLoss(where + ": INT8 tensor '" + t->name +
                      "' is not listed in quant_config.json 'quantized'");
    if (t->ndim() != 2 && t->ndim() != 3)
      return DataLoss(where + ": INT8 tensor '" + t->name + "' has shape " + t->ShapeString() +
                      ", expected a 2-D matrix (or a 3-D stack of matrices)");
    const std::string sname = t->name + kQuantScaleSuffix;
    auto it = by_name.find(sname);
    if (it == by_name.end())
      return DataLoss(where + ": INT8 tensor '" + t->name + "' has no scale tensor '" + sname +
                      "'");
    const TensorView* s = it->second;
    // One scale per row: [rows] or [rows, 1] for a matrix, [n, rows] for a stack of n.
    const int64_t rows = t->rows();
    const bool shape_ok =
        t->ndim() == 3 ? (s->ndim() == 2 && s->dim(0) == t->dim(0) && s->dim(1) == t->dim(1))
                       : ((s->ndim() == 1 && s->dim(0) == rows) ||
                          (s->ndim() == 2 && s->dim(0) == rows && s->dim(1) == 1));
    if (s->dtype != DType::kF32 || !shape_ok)
      return DataLoss(where + ": scale tensor '" + sname + "' is " + DTypeName(s->dtype) + " " +
                      s->ShapeString() + ", expected F32 " +
                      (t->ndim() == 3 ? "[" + std::to_string(t->dim(0)) + ", " +
                                            std::to_string(t->dim(1)) + "]"
                                      : "[" + std::to_string(rows) + "]"));
    const float* sv = static_cast<const float*>(s->data);
    for (int64_t r = 0; r < rows; ++r) {
      float v;
      std::memcpy(&v, sv + r, sizeof v);
      if (!std::isfinite(v) || v < 0)
        return DataLoss(where + ": scale tensor '" + sname + "' has an invalid value " +
                        std::to_string(v) + " at row " + std::to_string(r));
    }
  }
  if (cfg) {
    for (const std::string& n : cfg->quantized) {
      auto it = by_name.find(n);
      if (it == by_name.end() || it->second->dtype != DType::kI8)
        return DataLoss(where + ": quant_config.json lists '" + n +
                        "' as quantized but the checkpoint has no INT8 tensor of that name");
    }
  }
  return OkStatus();
}

}  // namespace peng
