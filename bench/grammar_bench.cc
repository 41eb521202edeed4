// Grammar-constrained decoding cost with a real vocabulary: vocabulary trie build, GBNF parse
// and compile time, and the per-token mask time (FillMask) of matchers stepping through a fixed
// JSON text token by token -- cold (a fresh CompiledGrammar: empty mask cache) and warm (every
// state already cached), for 1 and 32 matchers per step.
//
// Then the schema corpus (tests/data/json_schemas): per schema, JSON Schema -> GBNF, parse,
// compile and the first mask (what a new schema adds to a request's time to first token).
//
//   grammar_bench [model.gguf] [corpus_dir]
//   (defaults models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, tests/data/json_schemas)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "grammar/gbnf_builder.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

using namespace peng;
using namespace peng::grammar;

namespace {

const char* kJsonGbnf = R"(
root    ::= ws value ws
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member  ::= string ws ":" ws value
array   ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string  ::= "\"" char* "\""
char    ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number  ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n\r]{0,20}
)";

const char* kJsonText = R"({
  "name": "peng",
  "version": 3,
  "tags": ["llm", "inference", "c++20", "grammar"],
  "author": {"first": "Zoë", "last": "Smith", "email": "zoe@example.com"},
  "ratio": -12.5e-3,
  "nested": {"a": {"b": {"c": [1, 2, {"d": "deep \"quoted\" text \u00e9"}]}}},
  "ok": true,
  "missing": null,
  "description": "A small C++ engine that loads GGUF files and serves an OpenAI-style API. 日本語も少し。"
})";

// Same grammar, other content and nesting: its states are mostly new to the per-state cache.
const char* kOtherText = R"([{"id": 1, "items": [{"sku": "A-1", "qty": 2, "meta": {"color": "red", "tags": []}},
 {"sku": "B-22", "qty": 10, "meta": {"color": "blue \/ green", "tags": ["x", "y"]}}],
 "total": 1.5E+2, "paid": false, "note": "Ça va? 🙂"}, [[[["deep"]]]], {"empty": {}}])";

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

struct Stats {
  std::vector<double> ms;
  void Print(const char* name) {
    std::sort(ms.begin(), ms.end());
    double sum = 0;
    for (double v : ms) sum += v;
    std::printf("%-34s %9.3f %9.3f %9.3f %9.3f\n", name, sum / ms.size(), ms[ms.size() / 2],
                ms[ms.size() * 9 / 10], ms.back());
  }
};

// Steps `batch` matchers through `ids`, timing all FillMask calls of one step together.
Stats Run(const std::shared_ptr<const CompiledGrammar>& c, const std::vector<int32_t>& ids,
          int batch, int64_t vocab) {
  std::vector<Matcher> ms(batch, Matcher(c));
  std::vector<uint32_t> mask(MaskWords(vocab));
  Stats s;
  for (size_t i = 0; i <= ids.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    for (Matcher& m : ms) m.FillMask(mask.data(), vocab);
    s.ms.push_back(Ms(std::chrono::steady_clock::now() - t0));
    if (i == ids.size()) break;
    for (Matcher& m : ms) {
      if (!m.Accept(ids[i])) {
        std::fprintf(stderr, "token %zu (%d) rejected\n", i, ids[i]);
        std::exit(1);
      }
    }
  }
  return s;
}

}  // namespace

// What the engine adds per sequence and step: ApplyMask on a logits row (mask from the cache
// or computed, then -inf on every disallowed id) and Accept of the sampled token. Timed per
// step over `batch` sequences; the logits are restored between steps, untimed.
Stats RunEngineRows(const std::shared_ptr<const CompiledGrammar>& c,
                    const std::vector<int32_t>& ids, int batch, int64_t vocab) {
  std::vector<Matcher> ms(batch, Matcher(c));
  std::vector<float> base(vocab);
  for (int64_t v = 0; v < vocab; ++v) base[v] = static_cast<float>((v * 7919) % 1000) / 100.0f;
  std::vector<std::vector<float>> rows(batch, base);
  Stats s;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (auto& r : rows) std::copy(base.begin(), base.end(), r.begin());
    auto t0 = std::chrono::steady_clock::now();
    for (int b = 0; b < batch; ++b) {
      ms[b].ApplyMask(rows[b].data(), vocab);
      if (!ms[b].Accept(ids[i])) std::exit(1);
    }
    s.ms.push_back(Ms(std::chrono::steady_clock::now() - t0));
  }
  return s;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

// Compile cost of every schema of the corpus: to GBNF, parse, compile, first mask (cold).
int Corpus(const std::string& dir, const std::shared_ptr<const TokenVocab>& vocab) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") files.push_back(e.path());
  if (files.empty()) {
    std::fprintf(stderr, "no schemas in %s\n", dir.c_str());
    return 1;
  }
  std::sort(files.begin(), files.end());
  std::vector<double> to_gbnf, parse, create, first_mask, total;
  size_t max_bytes = 0;
  std::string slowest;
  std::vector<uint32_t> mask(MaskWords(vocab->size()));
  for (const auto& f : files) {
    std::ifstream in(f);
    const auto doc = nlohmann::ordered_json::parse(in);
    auto t0 = std::chrono::steady_clock::now();
    auto gbnf = JsonSchemaToGbnf(doc.at("schema"));
    auto t1 = std::chrono::steady_clock::now();
    if (!gbnf.ok()) {
      std::fprintf(stderr, "%s: %s\n", f.c_str(), gbnf.status().ToString().c_str());
      return 1;
    }
    auto g = Grammar::ParseGbnf(*gbnf);
    auto t2 = std::chrono::steady_clock::now();
    if (!g.ok()) return 1;
    auto c = CompiledGrammar::Create(*g, vocab);
    auto t3 = std::chrono::steady_clock::now();
    if (!c.ok()) return 1;
    Matcher m(*c);
    m.FillMask(mask.data(), vocab->size());
    auto t4 = std::chrono::steady_clock::now();
    to_gbnf.push_back(Ms(t1 - t0));
    parse.push_back(Ms(t2 - t1));
    create.push_back(Ms(t3 - t2));
    first_mask.push_back(Ms(t4 - t3));
    total.push_back(Ms(t4 - t0));
    if (total.back() >= *std::max_element(total.begin(), total.end())) slowest = f.filename();
    max_bytes = std::max(max_bytes, gbnf->size());
  }
  std::printf("\nschema corpus: %zu schemas (largest grammar %zu bytes)\n", files.size(),
              max_bytes);
  std::printf("%-34s %9s %9s %9s\n", "per schema (ms)", "median", "p90", "max");
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("%-34s %9.3f %9.3f %9.3f\n", name, Percentile(v, 0.5), Percentile(v, 0.9),
                Percentile(v, 1.0));
  };
  row("JSON Schema -> GBNF", to_gbnf);
  row("ParseGbnf", parse);
  row("CompiledGrammar::Create", create);
  row("first FillMask (cold)", first_mask);
  row("total", total);
  std::printf("slowest: %s\n", slowest.c_str());
  return 0;
}

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
  auto tok = Tokenizer::ForModel(path);
  if (!tok.ok() || !*tok) {
    std::fprintf(stderr, "%s: no tokenizer: %s\n", path.c_str(), tok.status().ToString().c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto vocab = TokenVocab::Build(**tok);
  double vocab_ms = Ms(std::chrono::steady_clock::now() - t0);
  t0 = std::chrono::steady_clock::now();
  auto g = Grammar::ParseGbnf(kJsonGbnf);
  double parse_ms = Ms(std::chrono::steady_clock::now() - t0);
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", g.status().ToString().c_str());
    return 1;
  }
  t0 = std::chrono::steady_clock::now();
  auto compiled = CompiledGrammar::Create(*g, vocab);
  double compile_ms = Ms(std::chrono::steady_clock::now() - t0);
  if (!compiled.ok()) return 1;
  auto ids = (*tok)->Encode(kJsonText, false);
  const int64_t n = vocab->size();
  std::printf("vocabulary: %lld tokens; text: %zu tokens\n", (long long)n, ids.size());
  std::printf("TokenVocab::Build %.1f ms, ParseGbnf %.3f ms, CompiledGrammar::Create %.3f ms\n\n",
              vocab_ms, parse_ms, compile_ms);
  std::printf("%-34s %9s %9s %9s %9s\n", "FillMask per step (ms)", "mean", "median", "p90", "max");
  auto other = (*tok)->Encode(kOtherText, false);
  for (int batch : {1, 32}) {
    auto fresh = CompiledGrammar::Create(*g, vocab);  // empty caches
    std::string b = ", batch " + std::to_string(batch);
    Run(*fresh, ids, batch, n).Print(("cold (new grammar)" + b).c_str());
    Run(*fresh, ids, batch, n).Print(("warm (same text again)" + b).c_str());
    Run(*fresh, other, batch, n).Print(("new states (2nd text)" + b).c_str());
  }
  std::printf("\n%-34s %9s %9s %9s %9s\n", "ApplyMask + Accept per step (ms)", "mean", "median",
              "p90", "max");
  for (int batch : {1, 32}) {
    auto fresh = CompiledGrammar::Create(*g, vocab);
    RunEngineRows(*fresh, ids, batch, n);  // warms the caches
    RunEngineRows(*fresh, ids, batch, n).Print(("warm, batch " + std::to_string(batch)).c_str());
  }
  return Corpus(argc > 2 ? argv[2] : "tests/data/json_schemas", vocab);
}
