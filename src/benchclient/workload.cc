#include "benchclient/workload.h"

#include <cmath>
#include <random>

namespace peng::benchclient {
namespace {

constexpr const char* kWords[] = {
    "the",     "time",    "people",   "way",     "day",     "man",       "thing",    "woman",
    "life",    "child",   "world",    "school",  "state",   "family",    "student",  "group",
    "country", "problem", "hand",     "part",    "place",   "case",      "week",     "company",
    "system",  "program", "question", "work",    "night",   "point",     "home",     "water",
    "room",    "mother",  "area",     "money",   "story",   "fact",      "month",    "lot",
    "right",   "study",   "book",     "eye",     "job",     "word",      "issue",    "side",
    "kind",    "head",    "house",    "service", "friend",  "father",    "power",    "hour",
    "game",    "line",    "end",      "member",  "law",     "car",       "city",     "name",
    "team",    "minute",  "idea",     "kid",     "body",    "back",      "parent",   "face",
    "others",  "level",   "office",   "door",    "health",  "person",    "art",      "war",
    "history", "party",   "result",   "change",  "morning", "reason",    "research", "girl",
    "guy",     "moment",  "air",      "teacher", "force",   "education", "good",     "new",
    "first",   "last",    "long",     "great",   "little",  "own",       "other",    "old",
    "big",     "high",    "small",    "large",   "next",    "early",     "young",    "few",
    "public",  "bad",     "same",     "able",    "and",     "of",        "to",       "in",
    "for",     "on",      "with",     "at",      "by",      "from",
};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

// Uniform in [0, 1) from the top 53 bits: the same on every standard library.
double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

std::vector<std::string> MakePrompts(int num, int input_len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> prompts(num);
  for (std::string& p : prompts) {
    for (int w = 0; w < input_len; ++w) {
      if (w > 0) p += ' ';
      p += kWords[rng() % kNumWords];
    }
  }
  return prompts;
}

std::vector<double> ArrivalOffsets(int num, double rate, uint64_t seed) {
  std::vector<double> t(num, 0.0);
  if (!(rate > 0) || std::isinf(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  double now = 0;
  for (int i = 0; i < num; ++i) {
    if (i > 0) now += -std::log1p(-Uniform(rng)) / rate;
    t[i] = now;
  }
  return t;
}

}  // namespace peng::benchclient
