#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace peng {

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::ForModel(const std::string& model_path) {
  if (IsDirectory(model_path)) {
    if (!PathExists(model_path + "/tokenizer.json")) return std::unique_ptr<Tokenizer>();
    return FromHfFolder(model_path);
  }
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::Open(model_path));
  return FromGguf(*gguf);
}

}  // namespace peng
