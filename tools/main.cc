// peng: LLM inference engine command-line tool.
#include <cstdio>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "parallel/communicator.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  // vLLM's short spellings of the parallel sizes (CLI11 short options are one letter).
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& arg : args) {
    if (arg == "-tp") arg = "--tensor-parallel-size";
    if (arg == "-dp") arg = "--data-parallel-size";
    if (arg == "-pp") arg = "--pipeline-parallel-size";
  }
  std::vector<char*> argv2;
  for (std::string& arg : args) argv2.push_back(arg.data());
  argc = static_cast<int>(argv2.size());
  argv = argv2.data();
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
  peng::EndParallelJob();  // rank 0 of an MPI job releases the other ranks
  peng::FinalizeWorld();   // after the last collective (no-op without MPI)
  return exit_code;
}
