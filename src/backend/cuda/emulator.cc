// The CUDA emulator's runtime (emulator.h): memory, streams and graph capture, events, cuBLAS's
// GEMM, and the thread scheduler -- a block's threads as coroutines on stacks of their own,
// switched at barriers (x86-64: a six-register switch; elsewhere ucontext).
#include "backend/cuda/emulator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/weight_layout.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// Under AddressSanitizer (the emulator's sanitizer build, docs/devices.md) the switches tell it
// which stack runs, so that its checks of the kernels' device memory see no false stack reports.
#if defined(__SANITIZE_ADDRESS__)
#define PENG_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PENG_EMU_ASAN 1
#endif
#endif
#if defined(PENG_EMU_ASAN)
#include <pthread.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace peng::backend::cuda {
namespace emu {

thread_local ThreadState* current_thread = nullptr;
thread_local BlockState* current_block = nullptr;

struct Stream {
  bool capturing = false;
  bool invalidated = false;  // an unsupported call during capture
  std::vector<std::function<void()>> ops;
};
struct Graph {
  std::vector<std::function<void()>> ops;
};
struct Event {
  std::chrono::steady_clock::time_point at;
};

namespace {

// The sticky-until-read error of cudaGetLastError (launch failures, emulator findings).
std::mutex error_mu;
cudaError_t last_error = cudaSuccess;
std::string last_message;

void Fail(cudaError_t e, const std::string& what) {
  std::lock_guard<std::mutex> lock(error_mu);
  std::fprintf(stderr, "[cuda-emu] %s\n", what.c_str());
  if (last_error == cudaSuccess) {
    last_error = e;
    last_message = what;
  }
}

Stream default_stream;
Stream* Of(cudaStream_t s) { return s ? s : &default_stream; }

// A call that must not happen while s (or any stream: allocations) is captured.
bool Capturing(cudaStream_t s) { return Of(s)->capturing; }
int capturing_streams = 0;

std::mutex alloc_mu;
std::map<void*, size_t> allocations;
size_t allocated = 0;
// The device's memory: 16 GiB, or PENG_EMULATOR_DEVICE_MEMORY bytes (read at each call: tests
// shrink it to see what a model that does not fit does).
// PENG_EMULATOR_FAULT set: the device has lost its context, as after a kernel's illegal
// address -- every kernel fails without running, and so do copies and synchronizations
// (tests of what the engine does then).
bool Faulty() {
  const char* e = std::getenv("PENG_EMULATOR_FAULT");
  return e && *e;
}
size_t TotalMemory() {
  const char* e = std::getenv("PENG_EMULATOR_DEVICE_MEMORY");
  return e && *e ? std::strtoull(e, nullptr, 10) : size_t{16} << 30;
}

// ---------------------------------------------------------------------------------------------
// Coroutines

#if defined(__x86_64__)
extern "C" void peng_emu_switch(void** save_sp, void* load_sp);
// Saves the callee-saved registers on the current stack and its pointer in *save_sp, then
// continues on load_sp's stack (saved the same way, or prepared by NewContext).
asm(R"(
  .text
  .globl peng_emu_switch
  .type peng_emu_switch, @function
peng_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size peng_emu_switch, .-peng_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
struct Context {
  void* sp = nullptr;
  const void* bottom = nullptr;  // the stack's lowest address and size (for AddressSanitizer)
  size_t size = 0;
};
void Switch(Context* from, Context* to) { peng_emu_switch(&from->sp, to->sp); }
// The top of c's saved stack: the frames it returns through when switched to.
void Prefetch(const Context& c) {
  const char* sp = static_cast<const char*>(c.sp);
  for (int line = 0; line < 8; ++line) __builtin_prefetch(sp + 64 * line);
}
void NewContext(Context* c, char* stack, size_t size, void (*entry)()) {
  // entry's "return address" slot 16-byte aligned, so that rsp % 16 == 8 at its first
  // instruction, as after a call; six zeroed registers below it.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
  void** p = reinterpret_cast<void**>(top - 16);
  p[0] = reinterpret_cast<void*>(entry);
  p[1] = nullptr;
  for (int i = 1; i <= 6; ++i) p[-i] = nullptr;
  c->sp = p - 6;
  c->bottom = stack;
  c->size = size;
}
#else
struct Context {
  ucontext_t uc;
  const void* bottom = nullptr;
  size_t size = 0;
};
void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
void Prefetch(const Context&) {}
void NewContext(Context* c, char* stack, size_t size, void (*entry)()) {
  c->bottom = stack;
  c->size = size;
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

#if defined(PENG_EMU_ASAN)
// The OS thread's own stack (the scheduler's context), as AddressSanitizer is to know it.
void ThreadStack(Context* c) {
  pthread_attr_t a;
  void* bottom = nullptr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &a) == 0) {
    pthread_attr_getstack(&a, &bottom, &size);
    pthread_attr_destroy(&a);
  }
  c->bottom = bottom;
  c->size = size;
}
// Called on the new stack right after a switch to it (a coroutine's first instruction too).
void SwitchedIn(void* fake_stack) {
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
}
// A coroutine's stack once it is done (or abandoned): its last frames never returned, and their
// redzones would poison the next block's frames at the same addresses.
void Unwound(const Context& c) {
#if defined(__x86_64__)
  const char* lo = static_cast<const char*>(c.sp);  // (below it, every frame returned)
#else
  const char* lo = static_cast<const char*>(c.bottom);
#endif
  ASAN_UNPOISON_MEMORY_REGION(lo, static_cast<const char*>(c.bottom) + c.size - lo);
}
#else
void ThreadStack(Context*) {}
void SwitchedIn(void*) {}
void Unwound(const Context&) {}
#endif
// On to `to`'s stack; returns when `from` is switched to again (never, where `last`: the
// coroutine has ended).
void SwitchTo(Context* from, Context* to, bool last = false) {
  void* fake_stack = nullptr;
#if defined(PENG_EMU_ASAN)
  __sanitizer_start_switch_fiber(last ? nullptr : &fake_stack, to->bottom, to->size);
#else
  (void)last;
#endif
  Switch(from, to);
  SwitchedIn(fake_stack);
}

enum class State { kReady, kWaitWarp, kWaitBlock, kDone };

struct Thread {
  ThreadState s;
  Context ctx;
  State state = State::kReady;
  int warp = 0;
};
struct Warp {
  int size = 0, live = 0, arrived = 0, parity = 0;
  uint64_t slot[2][32] = {};
};

constexpr size_t kStackBytes = size_t{384} << 10;
// Each thread's stack starts (at its top) this many bytes times its index, modulo kStackSkewSpan,
// below its region's end. Regions of kStackBytes would otherwise put every thread's hot frames
// at the same address modulo 256 KiB: the same set of the L1 and L2 caches for all the block's
// threads, which then evict each other at every switch (measured: most of the emulator's time
// went to the first load from the new stack). 33 cache lines apart and spread over 128 KiB,
// they land in different sets.
constexpr size_t kStackSkew = 33 * 64;
constexpr size_t kStackSkewSpan = size_t{128} << 10;
constexpr int kMaxThreads = 1024;

// The order blocks and threads run in (emulator.h, SetReversedOrder); PENG_EMU_ORDER=reverse
// sets it for the process.
std::atomic<bool> reversed_order{[] {
  const char* v = std::getenv("PENG_EMU_ORDER");
  return v && std::string(v) == "reverse";
}()};
bool Reversed() { return reversed_order.load(std::memory_order_relaxed); }

// What runs the block: its threads, warps and barrier counts (one block at a time per OS
// thread).
struct Runner {
  Context scheduler;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int n_threads = 0;          // the block's
  int live = 0, arrived = 0;  // the block's barrier
  const std::function<void()>* body = nullptr;
  std::string error;  // the block's finding (kernel abandoned)
  char* stacks = nullptr;
  size_t page = 4096;

  Runner() {
    page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "[cuda-emu] cannot map the threads' stacks\n");
      std::abort();
    }
    stacks = static_cast<char*>(m);
    ThreadStack(&scheduler);
    for (int i = 0; i < kMaxThreads; ++i)  // a guard page under every stack
      mprotect(stacks + i * kStackBytes, page, PROT_NONE);
    threads.resize(kMaxThreads);
  }
  ~Runner() { munmap(stacks, kStackBytes * kMaxThreads); }

  Thread& Current() { return *reinterpret_cast<Thread*>(current_thread); }

  // On to the next ready thread of the block (the scheduler when there is none: the block is
  // done or stuck); returns when this thread runs again.
  void Yield() { Leave(&Current().ctx); }
  // The thread whose turn comes after thread i's: the one above (below, reversed), cyclically.
  int After(int i, bool down) const {
    if (down) return (i == 0 ? n_threads : i) - 1;
    return i + 1 == n_threads ? 0 : i + 1;
  }
  void Leave(Context* from, bool last = false) {
    const bool down = Reversed();
    int i = static_cast<int>(&Current() - threads.data());
    for (int k = 1; k < n_threads; ++k) {
      i = After(i, down);
      Thread& t = threads[i];
      if (t.state != State::kReady) continue;
      current_thread = &t.s;
      // The thread after t is the likely next: the frames it returns through, into the cache
      // while t runs (most of a switch is the wait for a stack last touched 255 threads ago).
      Prefetch(threads[After(i, down)].ctx);
      SwitchTo(from, &t.ctx, last);
      return;
    }
    SwitchTo(from, &scheduler, last);
  }

  // Every thread of the warp (warp >= 0) or of the block waiting at that barrier goes on.
  void Release(State waiting, int warp) {
    const int first = warp >= 0 ? 32 * warp : 0;
    const int end = warp >= 0 ? std::min(first + 32, n_threads) : n_threads;
    for (int i = first; i < end; ++i)
      if (threads[i].state == waiting) threads[i].state = State::kReady;
  }

  void WarpBarrier() {
    Thread& t = Current();
    Warp& w = warps[t.warp];
    if (++w.arrived == w.live) {
      w.arrived = 0;
      w.parity ^= 1;
      Release(State::kWaitWarp, t.warp);
      return;  // (the last to arrive goes on)
    }
    t.state = State::kWaitWarp;
    Yield();
  }
  void BlockBarrier() {
    Thread& t = Current();
    if (++arrived == live) {
      arrived = 0;
      Release(State::kWaitBlock, -1);
      return;
    }
    t.state = State::kWaitBlock;
    Yield();
  }

  void Finding(const std::string& what) {
    if (error.empty()) error = what;
  }

  static void Entry();

  // Runs one block to its end; false (error set) when the block could not finish.
  bool RunBlock(const BlockState& b, const std::function<void()>& f) {
    const int n = static_cast<int>(b.dim.x * b.dim.y * b.dim.z);
    const int n_warps = (n + 31) / 32;
    n_threads = n;
    warps.assign(n_warps, Warp{});
    live = n;
    arrived = 0;
    body = &f;
    for (int i = 0; i < n; ++i) {
      Thread& t = threads[i];
      t.s.idx = {i % b.dim.x, i / b.dim.x % b.dim.y, i / (b.dim.x * b.dim.y)};
      t.s.waited = false;
      t.state = State::kReady;
      t.warp = i / 32;
      t.s.lane = i % 32;
      ++warps[t.warp].size;
      ++warps[t.warp].live;
      NewContext(&t.ctx, stacks + i * kStackBytes + page,
                 kStackBytes - page - i * kStackSkew % kStackSkewSpan, &Runner::Entry);
    }
    const bool down = Reversed();
    int next = down ? n - 1 : 0;
    while (live > 0) {
      int pick = -1;
      for (int k = 0, i = next; k < n; ++k, i = After(i, down)) {
        if (threads[i].state == State::kReady) {
          pick = i;
          break;
        }
      }
      if (pick < 0) {
        Finding(
            "deadlock: the block's live threads all wait, some at __syncthreads and some at "
            "a warp's shuffle or __syncwarp");
        break;
      }
      next = After(pick, down);
      current_thread = &threads[pick].s;
      SwitchTo(&scheduler, &threads[pick].ctx);
      if (!error.empty()) break;
    }
    current_thread = nullptr;
    for (int i = 0; i < n; ++i) Unwound(threads[i].ctx);
    return error.empty();
  }

  void Exit() {
    Thread& t = Current();
    t.state = State::kDone;
    Warp& w = warps[t.warp];
    --w.live;
    --live;
    if (current_block->pdl && !t.s.waited) {
      Finding("thread " + std::to_string(&t - threads.data()) +
              " returned without GridWait from a kernel launched with programmatic dependent "
              "launch");
    }
    if (w.arrived > 0) {
      Finding("a lane returned while its warp waits at a shuffle or __syncwarp (lane " +
              std::to_string(t.s.lane) + " of warp " + std::to_string(t.warp) + ")");
    }
    if (arrived > 0 && arrived == live) {  // the others wait at __syncthreads for nobody else
      arrived = 0;
      Release(State::kWaitBlock, -1);
    }
    Leave(&t.ctx, /*last=*/true);  // never comes back
  }
};

thread_local Runner* runner = nullptr;

[[gnu::noinline]] Runner& NewRunner() {
  runner = new Runner();  // (one per OS thread that launches; kept)
  return *runner;
}
inline Runner& TheRunner() { return runner ? *runner : NewRunner(); }

void Runner::Entry() {
  SwitchedIn(nullptr);
  Runner& r = *runner;
  (*r.body)();
  r.Exit();
}

std::atomic<uint64_t> kernels_run{0};

void RunGrid(dim3 grid, dim3 block, bool pdl, const std::function<void()>& body) {
  kernels_run.fetch_add(1, std::memory_order_relaxed);
  if (Faulty()) {
    Fail(cudaErrorIllegalAddress, "a kernel's illegal address (PENG_EMULATOR_FAULT)");
    return;
  }
  const uint64_t n = uint64_t{block.x} * block.y * block.z;
  if (n == 0 || n > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    Fail(cudaErrorInvalidConfiguration,
         "invalid launch: grid (" + std::to_string(grid.x) + ", " + std::to_string(grid.y) + ", " +
             std::to_string(grid.z) + "), block (" + std::to_string(block.x) + ", " +
             std::to_string(block.y) + ", " + std::to_string(block.z) + ")");
    return;
  }
  Runner& r = TheRunner();
  BlockState* outer = current_block;
  BlockState b{{0, 0, 0}, block, grid, pdl};
  current_block = &b;
  const uint64_t n_blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint64_t i = 0; i < n_blocks; ++i) {
    const uint64_t k = Reversed() ? n_blocks - 1 - i : i;
    const unsigned x = static_cast<unsigned>(k % grid.x);
    const unsigned y = static_cast<unsigned>(k / grid.x % grid.y);
    const unsigned z = static_cast<unsigned>(k / grid.x / grid.y);
    b.idx = {x, y, z};
    if (!r.RunBlock(b, body)) {
      Fail(cudaErrorLaunchFailure, r.error + " in block (" + std::to_string(x) + ", " +
                                       std::to_string(y) + ", " + std::to_string(z) +
                                       ") of grid (" + std::to_string(grid.x) + ", " +
                                       std::to_string(grid.y) + ", " + std::to_string(grid.z) +
                                       "), block size " + std::to_string(n));
      r.error.clear();
      current_block = outer;
      return;
    }
  }
  current_block = outer;
}

// (Out of Exchange, which runs at every shuffle: its frame stays small.)
[[gnu::noinline, gnu::cold]] void BadShuffle(Runner& r, unsigned mask, const Thread& t) {
  if (mask != 0xffffffffu) r.Finding("a shuffle with a partial mask (unsupported)");
  const Warp& w = r.warps[t.warp];
  if (w.live != 32) {
    r.Finding("a full-mask shuffle in warp " + std::to_string(t.warp) + " with " +
              std::to_string(w.live) + " lanes live (of " + std::to_string(w.size) + ")");
  }
}

// Deposits bits, has the last lane to arrive call all (where set) on the slots, waits for the
// warp's other lanes; the slots of all 32 lanes.
const uint64_t* Deposit(unsigned mask, uint64_t bits, void (*all)(uint64_t*) = nullptr) {
  Runner& r = *runner;  // (a kernel runs on the runner that launched it)
  Thread& t = r.Current();
  Warp& w = r.warps[t.warp];
  if (mask != 0xffffffffu || w.live != 32) [[unlikely]] BadShuffle(r, mask, t);
  const int parity = w.parity;
  w.slot[parity][t.s.lane] = bits;
  if (all && w.arrived + 1 == w.live) all(w.slot[parity]);
  r.WarpBarrier();
  return w.slot[parity];
}

}  // namespace

void SyncThreads() { TheRunner().BlockBarrier(); }

void SyncWarp(unsigned mask) {
  Runner& r = TheRunner();
  if (mask != 0xffffffffu) r.Finding("__syncwarp with a partial mask (unsupported)");
  r.WarpBarrier();
}

uint64_t Exchange(unsigned mask, uint64_t bits, int src) { return Deposit(mask, bits)[src & 31]; }

uint64_t ExchangeThen(uint64_t bits, void (*all)(uint64_t* slots)) {
  return Deposit(0xffffffffu, bits, all)[Lane()];
}

void Enqueue(cudaStream_t s, dim3 grid, dim3 block, bool pdl, std::function<void()> body) {
  Submit(s, [grid, block, pdl, body = std::move(body)] { RunGrid(grid, block, pdl, body); });
}

void GridWait() { TheRunner().Current().s.waited = true; }

void SetReversedOrder(bool reversed) { reversed_order.store(reversed); }

uint64_t KernelsRun() { return kernels_run.load(std::memory_order_relaxed); }

bool IsCapturing(cudaStream_t s) { return Of(s)->capturing; }

void Submit(cudaStream_t s, std::function<void()> op) {
  Stream* st = Of(s);
  if (st->capturing) {
    st->ops.push_back(std::move(op));
  } else {
    op();
  }
}

void ReportFailure(const std::string& what) { Fail(cudaErrorLaunchFailure, what); }

void Misaligned(const void* p, int bytes) {
  if (!runner || !current_thread) return;  // (host code reading the same layout)
  char where[32];
  std::snprintf(where, sizeof where, "%p", p);
  runner->Finding("a load of " + std::to_string(bytes) + " bytes at " + where +
                  ", not aligned to its size (a GPU faults: misaligned address), by thread " +
                  std::to_string(runner->Current().s.idx.x));
}
// The weight layout's loads (weight_layout.h) are checked the same way (set before any thread
// runs a kernel).
[[maybe_unused]] const bool layout_checked = (layout::misaligned_load_hook = &Misaligned, true);

}  // namespace emu

using emu::Fail;

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (emulator finding)";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:  // (the other faults that lose the context: the emulator raises none)
      break;
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(emu::error_mu);
  const cudaError_t e = emu::last_error;
  emu::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int i) { return i == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

// Shaped as an H200 (132 multiprocessors), so that launches are configured as there.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int i) {
  if (i != 0) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "CUDA emulator on the CPU, shaped as an H200");
  p->totalGlobalMem = emu::TotalMemory();
  p->multiProcessorCount = 132;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> lock(emu::alloc_mu);
  *total = emu::TotalMemory();
  *free = *total - std::min(emu::allocated, *total);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (emu::capturing_streams > 0) {  // (cudaStreamCaptureModeThreadLocal: not from this thread)
    Fail(cudaErrorStreamCaptureUnsupported, "cudaMalloc while a stream is being captured");
    return cudaErrorStreamCaptureUnsupported;
  }
  std::unique_lock<std::mutex> lock(emu::alloc_mu);
  const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  *p = emu::allocated + n > emu::TotalMemory() ? nullptr : std::aligned_alloc(256, n);
  if (!*p) {  // (as CUDA: the error is also the next cudaGetLastError's)
    lock.unlock();
    std::lock_guard<std::mutex> error_lock(emu::error_mu);
    if (emu::last_error == cudaSuccess) emu::last_error = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  std::memset(*p, 0xff, n);  // (device memory is not zeroed: NaNs expose reads before writes)
  emu::allocations[*p] = n;
  emu::allocated += n;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (emu::capturing_streams > 0) {
    Fail(cudaErrorStreamCaptureUnsupported, "cudaFree while a stream is being captured");
    return cudaErrorStreamCaptureUnsupported;
  }
  std::lock_guard<std::mutex> lock(emu::alloc_mu);
  const auto it = emu::allocations.find(p);
  if (it == emu::allocations.end()) return cudaErrorInvalidValue;
  emu::allocated -= it->second;
  emu::allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

// Page-locked host memory: plain memory here (never captured: a host allocation).
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (emu::capturing_streams > 0) {
    Fail(cudaErrorStreamCaptureUnsupported, "cudaMallocHost while a stream is being captured");
    return cudaErrorStreamCaptureUnsupported;
  }
  *p = std::malloc(std::max<size_t>(bytes, 1));
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (kind == cudaMemcpyDeviceToHost && emu::Capturing(s)) {
    Fail(cudaErrorStreamCaptureUnsupported, "a copy to the host inside a captured graph");
    emu::Of(s)->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (emu::Faulty()) return cudaErrorIllegalAddress;
  if (bytes > 0) emu::Submit(s, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (bytes > 0) emu::Submit(s, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new emu::Stream();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (emu::Capturing(s)) {
    Fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize on a stream being captured");
    emu::Of(s)->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return emu::Faulty() ? cudaErrorIllegalAddress : cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  emu::Stream* st = emu::Of(s);
  if (st->capturing) return cudaErrorStreamCaptureUnsupported;
  st->capturing = true;
  st->invalidated = false;
  st->ops.clear();
  ++emu::capturing_streams;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  emu::Stream* st = emu::Of(s);
  if (!st->capturing) return cudaErrorInvalidValue;
  st->capturing = false;
  --emu::capturing_streams;
  if (st->invalidated) {
    st->ops.clear();
    *g = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *g = new emu::Graph{std::move(st->ops)};
  st->ops.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!g) return cudaErrorInvalidValue;
  *exec = new emu::Graph(*g);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
  delete g;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) {
  if (!g) return cudaErrorInvalidValue;
  emu::Submit(s, [g] {
    for (const auto& op : g->ops) op();
  });
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new emu::Event();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  emu::Submit(s, [e] { e->at = std::chrono::steady_clock::now(); });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new emu::Stream*(nullptr);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
  *h = s;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
// Element (i, j) of op(M) for a column-major M with leading dimension ld.
float At(const void* m, cudaDataType t, cublasOperation_t op, int ld, int i, int j) {
  const int64_t idx = op == CUBLAS_OP_N ? i + int64_t{j} * ld : j + int64_t{i} * ld;
  return t == CUDA_R_16F    ? F16ToF32(static_cast<const uint16_t*>(m)[idx])
         : t == CUDA_R_16BF ? Bf16ToF32(static_cast<const uint16_t*>(m)[idx])
                            : static_cast<const float*>(m)[idx];
}

// The element `stride` elements of type t past m.
const void* Offset(const void* m, cudaDataType t, long long stride) {
  return static_cast<const char*>(m) + stride * (t == CUDA_R_32F ? 4 : 2);
}
}  // namespace

// C = alpha op(A) op(B) + beta C for each matrix of the batch, FP32 sums (C not read when beta
// is 0).
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
    const void* alpha, const void* a, cudaDataType type_a, int lda, long long stride_a,
    const void* b, cudaDataType type_b, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType type_c, int ldc, long long stride_c, int batch, cublasComputeType_t,
    cublasGemmAlgo_t) {
  if (type_c != CUDA_R_32F || type_a != type_b || m < 0 || n < 0 || k < 0 || batch < 0)
    return CUBLAS_STATUS_NOT_SUPPORTED;  // (cuBLAS multiplies no FP16 by BF16 either)
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  emu::Submit(*h, [=] {
    // op(A) rows and op(B) columns as contiguous FP32 rows of k values, then the dots.
    std::vector<float> ar(static_cast<size_t>(m) * k), bc(static_cast<size_t>(n) * k);
    for (int g = 0; g < batch; ++g) {
      const void* ag = Offset(a, type_a, g * stride_a);
      const void* bg = Offset(b, type_b, g * stride_b);
      float* cm = static_cast<float*>(c) + g * stride_c;
      for (int i = 0; i < m; ++i)
        for (int l = 0; l < k; ++l) ar[size_t(i) * k + l] = At(ag, type_a, op_a, lda, i, l);
      for (int j = 0; j < n; ++j)
        for (int l = 0; l < k; ++l) bc[size_t(j) * k + l] = At(bg, type_b, op_b, ldb, l, j);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          const float* x = &ar[size_t(i) * k];
          const float* y = &bc[size_t(j) * k];
          float s = 0.f;
          for (int l = 0; l < k; ++l) s += x[l] * y[l];
          float& out = cm[i + int64_t{j} * ldc];
          out = al * s + (be != 0.f ? be * out : 0.f);
        }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType type_a,
                            int lda, const void* b, cudaDataType type_b, int ldb, const void* beta,
                            void* c, cudaDataType type_c, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  return cublasGemmStridedBatchedEx(h, op_a, op_b, m, n, k, alpha, a, type_a, lda, 0, b, type_b,
                                    ldb, 0, beta, c, type_c, ldc, 0, 1, compute, algo);
}

}  // namespace peng::backend::cuda
