// The synthetic serving workload: random text prompts and Poisson arrival times, both fully
// determined by a seed so that two servers can be measured on the same requests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peng::benchclient {

// `num` prompts of `input_len` words drawn from a list of common short English words. Each
// word with its leading space is one token in the usual BPE vocabularies, so a prompt is about
// `input_len` tokens; the server's usage.prompt_tokens reports the exact count.
std::vector<std::string> MakePrompts(int num, int input_len, uint64_t seed);

// Send times in seconds after the start: cumulative exponential gaps with mean 1 / rate
// (a Poisson process). rate = +inf (or <= 0) sends everything at once: all zeros.
std::vector<double> ArrivalOffsets(int num, double rate, uint64_t seed);

}  // namespace peng::benchclient
