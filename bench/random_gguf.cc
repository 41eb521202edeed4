// A model's shapes without its weights, and back: benchmarks and device checks at a real
// model's size on a machine the model file cannot reach (the GPU machine takes at most 64 MiB
// of files; scripts/gpu_check.sh).
//
//   random_gguf skeleton MODEL.gguf OUT.skel.gguf   every metadata key of MODEL (tokenizer,
//       config) and the list of its tensors (name, type, shape) in the key
//       peng.skeleton.tensors; no tensor data (a few MB)
//   random_gguf fill OUT.skel.gguf MODEL.gguf [SEED]   a GGUF with that metadata and those
//       tensors, random weights (quant/random_weights.h; vectors such as norm weights uniform
//       in [0.5, 1.5], matrices in [-0.1, 0.1])
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "quant/random_weights.h"

namespace peng {
namespace {

constexpr const char* kKey = "peng.skeleton.tensors";

int Fail(const std::string& msg) {
  std::fprintf(stderr, "random_gguf: %s\n", msg.c_str());
  return 1;
}

void CopyMetadata(const GgufFile& in, GgufWriter* w) {
  for (const auto& [key, value] : in.metadata())
    if (key != kKey && key != "general.alignment") w->AddValue(key, value);
}

int Skeleton(const std::string& in_path, const std::string& out_path) {
  auto in = GgufFile::Open(in_path);
  if (!in.ok()) return Fail(in.status().ToString());
  GgufWriter w;
  CopyMetadata(**in, &w);
  std::vector<std::string> tensors;
  for (const TensorView& t : (*in)->tensors()) {
    std::ostringstream s;
    s << t.name << '\t' << DTypeName(t.dtype);
    for (int64_t d : t.shape) s << '\t' << d;
    tensors.push_back(s.str());
  }
  w.AddStringArray(kKey, tensors);
  const Status st = w.WriteFile(out_path);
  if (!st.ok()) return Fail(st.ToString());
  std::printf("%s: %zu tensors\n", out_path.c_str(), tensors.size());
  return 0;
}

std::optional<DType> TypeNamed(const std::string& name) {
  for (int i = 0; i < static_cast<int>(DType::kCount); ++i)
    if (name == DTypeName(static_cast<DType>(i))) return static_cast<DType>(i);
  return std::nullopt;
}

int Fill(const std::string& skel_path, const std::string& out_path, uint64_t seed) {
  auto in = GgufFile::Open(skel_path);
  if (!in.ok()) return Fail(in.status().ToString());
  const std::vector<std::string>* list = (*in)->GetStringArray(kKey);
  if (!list) return Fail(skel_path + ": not a skeleton (no " + kKey + ")");
  GgufWriter w;
  CopyMetadata(**in, &w);
  struct Tensor {
    DType type;
    int64_t values;
    bool vector;  // 1-D (norm weights, biases): values around 1
  };
  std::vector<Tensor> tensors;
  for (const std::string& line : *list) {
    std::istringstream s(line);
    std::string name, type, dim;
    std::getline(s, name, '\t');
    std::getline(s, type, '\t');
    std::vector<int64_t> shape;
    while (std::getline(s, dim, '\t')) shape.push_back(std::strtoll(dim.c_str(), nullptr, 10));
    const std::optional<DType> t = TypeNamed(type);
    if (!t || shape.empty()) return Fail(skel_path + ": bad tensor entry '" + line + "'");
    const Status st = w.DeclareTensor(name, *t, shape);
    if (!st.ok()) return Fail(st.ToString());
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    tensors.push_back({*t, n, shape.size() == 1});
  }
  std::mt19937_64 rng(seed);
  const Status st = w.WriteFile(out_path, [&](size_t i, const std::string&,
                                              std::vector<uint8_t>* bytes) {
    const Tensor& t = tensors[i];
    return FillRandomWeights(t.type, t.values, bytes->data(), &rng, t.vector ? 0.5f : -0.1f,
                             t.vector ? 1.5f : 0.1f);
  });
  if (!st.ok()) return Fail(st.ToString());
  std::printf("%s: %zu tensors of random weights\n", out_path.c_str(), list->size());
  return 0;
}

}  // namespace
}  // namespace peng

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "skeleton" && argc == 4) return peng::Skeleton(argv[2], argv[3]);
  if (mode == "fill" && (argc == 4 || argc == 5))
    return peng::Fill(argv[2], argv[3], argc == 5 ? std::strtoull(argv[4], nullptr, 10) : 1);
  std::fprintf(stderr,
               "usage: random_gguf skeleton MODEL.gguf OUT.skel.gguf\n"
               "       random_gguf fill SKELETON.gguf OUT.gguf [SEED]\n");
  return 2;
}
