// <immintrin.h> for the AVX-512 translation units (the *_avx512.cc files, compiled with AVX-512
// flags), included before anything else: GCC 12 warns inside its own AVX-512 headers about the
// deliberately undefined upper halves of the cast intrinsics (_mm512_undefined_*
// self-initialisation), so -W(maybe-)uninitialized is off for the rest of the unit.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>
