#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace peng {

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::ForModel(const std::string& model_path) {
  if (IsDirectory(model_path)) {
    if (PathExists(model_path + "/tokenizer.json")) return FromHfFolder(model_path);
    // A folder converted from a GGUF by `peng quantize` keeps the vocabulary in a
    // metadata-only GGUF.
    if (PathExists(model_path + "/tokenizer.gguf")) {
      PENG_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf,
                            GgufFile::Open(model_path + "/tokenizer.gguf"));
      return FromGguf(*gguf);
    }
    return std::unique_ptr<Tokenizer>();
  }
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
  return FromGguf(*gguf);
}

}  // namespace peng
