// Benchmark: what tracing costs the program's *own* work around its CUDA calls, not only the
// calls. A traced launch touches a few dozen cache lines of cudaw's (records, layouts, the
// memory history, the timeline), which may evict the program's; `CUDAW_TRACE_SELF` and
// launch_ab time cudaw's own instructions only. Each iteration here does some work of its
// own (a dependent walk of VICTIM_TOUCHES steps through a working set of VICTIM_WS_KIB KiB,
// like an interpreter's pointer-chasing), then VICTIM_LAUNCHES launches of a kernel with
// three pointer arguments into three of 300 allocations (so that the memory history is
// consulted), one cudaGetLastError, then VICTIM_CALLS calls of cudaGetDevice (PyTorch makes
// about ten a launch).
// Under `cudaw run` with CUDAW_TRACE set, blocks of VICTIM_BLOCK iterations alternate with
// tracing on and off (cudaw_trace_active_v1), the order turning each round; the medians over
// the rounds of the per-round differences (on - off) are printed per iteration:
//   work_added_ns  what tracing costs the walk (the program's own code);
//   api_added_ns   what it costs the launches and calls themselves;
//   added_ns       the whole iteration; and the iteration's untraced times.
// Without cudaw's tracing switch it prints "trace_victim skipped: ..".
#include "../programs/common.h"
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <dlfcn.h>
#include <vector>

// The name and body simgpu runs on the host too (crates/simgpu/src/kernels.rs).
__global__ void vector_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

static long env_or(const char* name, long dflt) {
  const char* v = getenv(name);
  return v && *v ? atol(v) : dflt;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 200;
  const long ws_kib = env_or("VICTIM_WS_KIB", 1536);
  const long touches = env_or("VICTIM_TOUCHES", 4000);
  const int launches = (int)env_or("VICTIM_LAUNCHES", 8);
  const int calls = (int)env_or("VICTIM_CALLS", 80);
  const int block = (int)env_or("VICTIM_BLOCK", 20);
  typedef int (*Switch)(int);
  Switch sw = (Switch)dlsym(RTLD_DEFAULT, "cudaw_trace_active_v1");
  if (!sw || sw(1) < 0) {
    printf("trace_victim skipped: not under cudaw with CUDAW_TRACE (no tracing switch)\n");
    return 0;
  }
  const int NBUF = 300;
  std::vector<float*> bufs(NBUF);
  for (auto& b : bufs) CHECK(cudaMalloc(&b, 1 << 20));
  // The walk: a random cycle through the working set, one 8-byte word per cache line.
  size_t lines = (size_t)ws_kib * 1024 / 64;
  std::vector<uint64_t> ws(lines * 8);
  std::vector<size_t> order(lines);
  for (size_t i = 0; i < lines; i++) order[i] = i;
  srand(7);
  for (size_t i = lines - 1; i > 0; i--) std::swap(order[i], order[(size_t)rand() % (i + 1)]);
  for (size_t i = 0; i < lines; i++) ws[order[i] * 8] = order[(i + 1) % lines] * 8;
  uint64_t p = order[0] * 8;
  int dev = 0;
  long it = 0;
  auto iteration = [&](double& work_ns, double& api_ns) {
    auto t0 = std::chrono::steady_clock::now();
    for (long s = 0; s < touches; s++) p = ws[p];
    auto t1 = std::chrono::steady_clock::now();
    for (int l = 0; l < launches; l++) {
      long k = it * launches + l;
      vector_add<<<1, 32>>>(bufs[k % NBUF], bufs[(k * 7 + 1) % NBUF], bufs[(k * 13 + 2) % NBUF], 32);
    }
    CHECK(cudaGetLastError());
    for (int c = 0; c < calls; c++) CHECK(cudaGetDevice(&dev));
    auto t2 = std::chrono::steady_clock::now();
    work_ns += std::chrono::duration<double, std::nano>(t1 - t0).count();
    api_ns += std::chrono::duration<double, std::nano>(t2 - t1).count();
    it++;
  };
  // Warm up both ways.
  for (int on = 0; on < 2; on++) {
    sw(on);
    double w = 0, a = 0;
    for (int i = 0; i < 200; i++) iteration(w, a);
  }
  std::vector<double> dwork, dapi, dall, off_work, off_api;
  for (int r = 0; r < rounds; r++) {
    double w[2] = {0, 0}, a[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
      int on = (r + k) % 2;
      sw(on);
      for (int i = 0; i < block; i++) iteration(w[on], a[on]);
      CHECK(cudaDeviceSynchronize());
    }
    dwork.push_back((w[1] - w[0]) / block);
    dapi.push_back((a[1] - a[0]) / block);
    dall.push_back((w[1] + a[1] - w[0] - a[0]) / block);
    off_work.push_back(w[0] / block);
    off_api.push_back(a[0] / block);
  }
  sw(1);
  CHECK(cudaDeviceSynchronize());
  for (auto b : bufs) CHECK(cudaFree(b));
  printf("trace_victim work_added_ns=%.0f api_added_ns=%.0f added_ns=%.0f work_ns=%.0f api_ns=%.0f "
         "launches=%d calls=%d ws_kib=%ld touches=%ld rounds=%d (walk end %llu)\n",
         median(dwork), median(dapi), median(dall), median(off_work), median(off_api), launches,
         calls, ws_kib, touches, rounds, (unsigned long long)p);
  return 0;
}
