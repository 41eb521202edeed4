// peng tokenize: print the token ids of a text as a JSON array.
#include <cstdio>

#include "engine/llm.h"
#include "tools/commands.h"

namespace peng::tools {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool no_bos = false;
  bool no_special = false;
  bool pieces = false;
};

int RunTokenize(const TokenizeArgs& a) {
  auto tok = Tokenizer::ForModel(a.model);
  if (!tok.ok()) return Fail(tok.status().ToString());
  if (!*tok) return Fail(a.model + ": this model folder has no tokenizer.json");
  const Tokenizer& t = **tok;
  const bool bos = !a.no_bos && t.add_bos_default();
  std::vector<int32_t> ids = t.Encode(a.text, bos, !a.no_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]";
  std::puts(out.c_str());
  if (a.pieces) {
    for (int32_t id : ids) std::fprintf(stderr, "%d\t'%s'\n", id, t.TokenText(id).c_str());
  }
  return 0;
}

}  // namespace

void RegisterTokenize(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* c = app.add_subcommand("tokenize", "Print the token ids of a text as JSON");
  c->add_option("-m,--model", a->model, "GGUF file or Hugging Face model folder")->required();
  c->add_option("--text", a->text, "Text to tokenize")->required();
  c->add_flag("--no-bos", a->no_bos, "Do not add the BOS token");
  c->add_flag("--no-special", a->no_special, "Treat special-token text as plain text");
  c->add_flag("--pieces", a->pieces, "Also print each token's text to stderr");
  c->callback([a, exit_code] { *exit_code = RunTokenize(*a); });
}

}  // namespace peng::tools
