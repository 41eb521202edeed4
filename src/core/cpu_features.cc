#include "core/cpu_features.h"

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace peng {
namespace {

// Physical cores = distinct (physical id, core id) pairs in /proc/cpuinfo.
int CountPhysicalCores(int logical) {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  std::string line;
  int phys = 0;
  while (std::getline(in, line)) {
    auto value = [&]() { return std::stoi(line.substr(line.find(':') + 1)); };
    if (line.rfind("physical id", 0) == 0) phys = value();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, value()});
  }
  if (cores.empty() || static_cast<int>(cores.size()) > logical) return logical;
  return static_cast<int>(cores.size());
}

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(_M_X64)
  unsigned a, b, c, d;
  __cpuid(1, a, b, c, d);
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool osxsave = (c >> 27) & 1;
  bool ymm_ok = false, zmm_ok = false;
  if (osxsave) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    ymm_ok = (lo & 0x6) == 0x6;
    zmm_ok = (lo & 0xe6) == 0xe6;
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm_ok && ((b >> 5) & 1);
    f.avx512f = zmm_ok && ((b >> 16) & 1);
    f.avx512dq = zmm_ok && ((b >> 17) & 1);
    f.avx512bw = zmm_ok && ((b >> 30) & 1);
    f.avx512vl = zmm_ok && ((b >> 31) & 1);
    f.avx512vnni = zmm_ok && ((c >> 11) & 1);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avxvnni = ymm_ok && ((a >> 4) & 1);
    f.avx512bf16 = zmm_ok && ((a >> 5) & 1);
  }
  f.fma = f.fma && ymm_ok;
  f.f16c = f.f16c && ymm_ok;
#endif
#if defined(__aarch64__)
  f.neon = true;
#if defined(__linux__)
  // The bit values are the kernel ABI (arch/arm64/include/uapi/asm/hwcap.h); spelled out in
  // case the build's kernel headers predate them.
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  constexpr unsigned long kFphp = 1ul << 9, kAsimdhp = 1ul << 10, kAsimddp = 1ul << 20,
                          kSve = 1ul << 22, kI8mm2 = 1ul << 13, kBf162 = 1ul << 14;
  f.neon = (hw & HWCAP_ASIMD) != 0;
  f.dotprod = (hw & kAsimddp) != 0;
  f.fp16 = (hw & kFphp) != 0 && (hw & kAsimdhp) != 0;
  f.sve = (hw & kSve) != 0;
  f.i8mm = (hw2 & kI8mm2) != 0;
  f.bf16 = (hw2 & kBf162) != 0;
#endif
#endif
  f.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  if (f.logical_cores <= 0) f.logical_cores = 1;
  f.physical_cores = CountPhysicalCores(f.logical_cores);
  return f;
}

}  // namespace

std::string CpuFeatures::ToString() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avxvnni, "avxvnni");
  add(neon, "neon");
  add(dotprod, "dotprod");
  add(fp16, "fp16");
  add(i8mm, "i8mm");
  add(bf16, "bf16");
  add(sve, "sve");
  return s.empty() ? "none" : s;
}

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

}  // namespace peng
