// peng: LLM inference engine command-line tool.
#include <cstdio>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"peng: LLM inference and serving engine for DeepSeek-style MoE and dense models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "peng 0.1.0");
  int exit_code = 0;
  peng::tools::RegisterGenerate(app, &exit_code);
  peng::tools::RegisterTokenize(app, &exit_code);
  peng::tools::RegisterLogits(app, &exit_code);
  peng::tools::RegisterBench(app, &exit_code);
  peng::tools::RegisterInfo(app, &exit_code);
  peng::tools::RegisterServe(app, &exit_code);
  peng::tools::RegisterEval(app, &exit_code);
  peng::tools::RegisterQuantize(app, &exit_code);
  peng::tools::RegisterTop(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
