// A self-contained SVG picture of a serving-benchmark report (from BuildReport): on the left
// the cumulative distributions of TTFT, TPOT, ITL and end-to-end latency on a log time axis;
// on the right a timeline with one bar per request, from its send time to its first token
// (waiting + prefill) and on to its last token (decode). Failed requests are drawn in red.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace peng::benchclient {

std::string RenderSvg(const nlohmann::json& report);

}  // namespace peng::benchclient
