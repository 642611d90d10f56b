// The target of the pause stress test (tests/pause_stress.rs): several host threads, each
// with two streams of its own, allocating, setting, launching, copying (device to device
// and device to host, asynchronously) and freeing in a loop, every result mirrored on the
// CPU. Prints one line once the shim is initialised and a checksum at the end, which
// depends only on the iteration count (argument 1, default 48).
//
// Standard input paces it, so that a test can keep it busy while it pauses it: every
// thread may start only as many iterations as "run K" lines have allowed in all; "end", or
// the end of input, allows the rest (so with no input it runs straight through).
//
// With PAUSE_STRESS_PROGRESS=FILE, each thread counts in FILE (one little-endian u64 per
// thread, mapped shared) the CUDA calls it has returned from: while the process is paused
// no count may grow by more than one (the call a thread had returned from just before the
// gate closed).
#include "common.h"
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
static void mix_cpu(unsigned* x, const unsigned* y, int n, unsigned k) {
  for (int i = 0; i < n; i++) x[i] = x[i] * 1664525u + y[i] + k;
}

static const int threads = 4, n = 1 << 12;
static std::mutex pace_lock;
static std::condition_variable paced;
static int allowed = 0;
static unsigned long long* progress = nullptr;

static void wait_allowed(int it) {
  std::unique_lock<std::mutex> g(pace_lock);
  paced.wait(g, [&] { return it < allowed; });
}

static void worker(int t, int iters, unsigned long long* sum) {
  unsigned long long calls = 0;
  auto tick = [&] {
    calls++;
    if (progress) __atomic_store_n(&progress[t], calls, __ATOMIC_RELAXED);
  };
  const int blocks = (n + 255) / 256;
  const size_t bytes = n * sizeof(unsigned);
  cudaStream_t s0, s1;
  CHECK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking)); tick();
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); tick();
  unsigned *acc, *snap, *out;
  CHECK(cudaMalloc(&acc, bytes)); tick();
  CHECK(cudaMalloc(&snap, bytes)); tick();
  CHECK(cudaMallocHost(&out, bytes)); tick();
  CHECK(cudaMemsetAsync(acc, t + 1, bytes, s0)); tick();
  std::vector<unsigned> hacc(n, 0x01010101u * (unsigned)(t + 1)), htmp(n);
  unsigned long long s = 0;
  for (int it = 0; it < iters; it++) {
    wait_allowed(it);
    unsigned k = (unsigned)(it * threads + t);
    size_t extra = (size_t)((it * 7 + t) % 5) * 4096;
    bool async = it % 3 == 2;
    unsigned* tmp;
    if (async) CHECK(cudaMallocAsync(&tmp, bytes + extra, s0));
    else CHECK(cudaMalloc(&tmp, bytes + extra));
    tick();
    int pattern = (t * 31 + it) & 0xff;
    CHECK(cudaMemsetAsync(tmp, pattern, bytes, s0)); tick();
    mix<<<blocks, 256, 0, s0>>>(tmp, acc, n, k); CHECK_LAUNCH(); tick();
    mix<<<blocks, 256, 0, s0>>>(acc, tmp, n, k ^ 0x9e3779b9u); CHECK_LAUNCH(); tick();
    if (async) { CHECK(cudaFreeAsync(tmp, s0)); tick(); }
    CHECK(cudaStreamSynchronize(s0)); tick();
    std::memset(htmp.data(), pattern, bytes);
    mix_cpu(htmp.data(), hacc.data(), n, k);
    mix_cpu(hacc.data(), htmp.data(), n, k ^ 0x9e3779b9u);
    CHECK(cudaMemcpyAsync(snap, acc, bytes, cudaMemcpyDeviceToDevice, s1)); tick();
    if (it % 4 == 3) {
      CHECK(cudaMemcpyAsync(out, snap, bytes, cudaMemcpyDeviceToHost, s1)); tick();
      CHECK(cudaStreamSynchronize(s1)); tick();
      for (int i = 0; i < n; i++) { EXPECT(out[i] == hacc[i]); s = s * 31 + out[i]; }
    }
    if (!async) { CHECK(cudaFree(tmp)); tick(); }
  }
  CHECK(cudaStreamSynchronize(s1)); tick();
  CHECK(cudaMemcpy(out, acc, bytes, cudaMemcpyDeviceToHost)); tick();
  for (int i = 0; i < n; i++) { EXPECT(out[i] == hacc[i]); s = s * 31 + out[i]; }
  CHECK(cudaFree(acc)); tick();
  CHECK(cudaFree(snap)); tick();
  CHECK(cudaFreeHost(out)); tick();
  CHECK(cudaStreamDestroy(s0)); tick();
  CHECK(cudaStreamDestroy(s1)); tick();
  *sum = s;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 48;
  if (iters <= 0) { std::fprintf(stderr, "pause_stress: bad iteration count\n"); return 3; }
  if (const char* path = std::getenv("PAUSE_STRESS_PROGRESS")) {
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    EXPECT(fd >= 0);
    EXPECT(ftruncate(fd, threads * sizeof(unsigned long long)) == 0);
    void* p = mmap(nullptr, threads * sizeof(unsigned long long), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT(p != MAP_FAILED);
    progress = static_cast<unsigned long long*>(p);
    close(fd);
  }
  // One allocation before the threads start: the shim (and its signal handlers and
  // control socket) is in place once this line is printed.
  int* marker;
  CHECK(cudaMalloc(&marker, 4096));
  CHECK(cudaMemset(marker, 0x5a, 4096));
  std::printf("pause_stress: %d threads, %d iterations each\n", threads, iters);
  std::fflush(stdout);
  std::vector<unsigned long long> sums(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) pool.emplace_back(worker, t, iters, &sums[t]);
  char line[128];
  while (std::fgets(line, sizeof line, stdin)) {
    int k = 0;
    if (std::sscanf(line, "run %d", &k) == 1) {
      std::lock_guard<std::mutex> g(pace_lock);
      allowed += k;
      paced.notify_all();
    } else if (std::strncmp(line, "end", 3) == 0) {
      break;
    } else {
      std::fprintf(stderr, "pause_stress: unknown command %s", line);
      return 3;
    }
  }
  {
    std::lock_guard<std::mutex> g(pace_lock);
    allowed = iters;
    paced.notify_all();
  }
  for (auto& th : pool) th.join();
  int back[1024];
  CHECK(cudaMemcpy(back, marker, 4096, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 1024; i++) EXPECT(back[i] == 0x5a5a5a5a);
  CHECK(cudaFree(marker));
  unsigned long long checksum = 0;
  for (int t = 0; t < threads; t++) checksum = checksum * 1000003ull + sums[t];
  std::printf("pause_stress threads=%d iters=%d checksum=%llu\n", threads, iters, checksum);
  return 0;
}
