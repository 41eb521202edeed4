// Subcommands of the `peng` tool. Each Register*() adds its CLI11 subcommand and the callback
// that runs it; callbacks return the process exit code through `*exit_code` (0 ok, 1 runtime
// error, 2 usage error) and print errors to stderr.
#pragma once

#include <CLI/CLI.hpp>

namespace peng::tools {

void RegisterGenerate(CLI::App& app, int* exit_code);
void RegisterTokenize(CLI::App& app, int* exit_code);
void RegisterLogits(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
// `peng bench serve`, a subcommand of `bench` (tools/cmd_bench_serve.cc).
CLI::App* RegisterBenchServe(CLI::App& bench, int* exit_code);
void RegisterInfo(CLI::App& app, int* exit_code);
void RegisterServe(CLI::App& app, int* exit_code);
void RegisterEval(CLI::App& app, int* exit_code);  // tools/cmd_eval.cc
void RegisterQuantize(CLI::App& app, int* exit_code);  // tools/cmd_quantize.cc
void RegisterTop(CLI::App& app, int* exit_code);       // tools/cmd_top.cc

// Prints "peng: error: <status>" to stderr and returns 1.
int Fail(const std::string& what);

}  // namespace peng::tools
