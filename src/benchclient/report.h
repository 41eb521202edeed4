// Turns a BenchRun into the benchmark's results: a JSON document (configuration, summary and
// per-request measurements; all latencies in milliseconds) and a printed table.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>

#include "benchclient/runner.h"

namespace peng::benchclient {

// Summary keys: completed, failed, duration_s, total_input_tokens, total_output_tokens,
// request_throughput (req/s), output_throughput and total_token_throughput (tokens/s), and
// ttft_ms / tpot_ms / itl_ms / e2e_ms objects with mean, median, p90, p99, min, max, count.
// Input tokens are the server's usage.prompt_tokens when reported, else --input-len.
nlohmann::json BuildReport(const BenchConfig& config, const BenchRun& run);

void PrintReport(const nlohmann::json& report, std::FILE* out);

}  // namespace peng::benchclient
