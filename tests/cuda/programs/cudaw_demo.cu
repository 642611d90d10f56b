// The example program `cudaw demo` runs (natively, then under cudaw while it pauses,
// resumes, dumps and restores it). Usage: cudaw_demo [MIB [ITERATIONS]] (default 16 MiB,
// 120 iterations).
//
// It fills a MIB MiB buffer and a small one, then each iteration mixes a 64K-element
// window of the big buffer (somewhere else each time) with the small one and copies the
// window back into the small one. Standard input paces it: "run K" runs the next K
// iterations and prints "ran DONE"; "end", or the end of input, runs the rest. At the end
// it copies all of its device memory back and prints a checksum, which depends only on
// MIB and ITERATIONS — the same natively and under cudaw, however often it was paused.
#include "common.h"
#include <cstring>
#include <vector>
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
int main(int argc, char** argv) {
  const long mib = argc > 1 ? std::atol(argv[1]) : 16;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 120;
  if (mib < 1 || iters < 1) {
    std::fprintf(stderr, "usage: cudaw_demo [MIB [ITERATIONS]]\n");
    return 3;
  }
  const int n = 1 << 16;
  const size_t big_n = (size_t)mib << 18;  // MiB / 4 bytes
  unsigned *big, *small;
  CHECK(cudaMalloc(&big, big_n * sizeof(unsigned)));
  CHECK(cudaMalloc(&small, n * sizeof(unsigned)));
  CHECK(cudaMemset(big, 0x5a, big_n * sizeof(unsigned)));
  std::vector<unsigned> h(n);
  for (int i = 0; i < n; i++) h[i] = (unsigned)i * 2654435761u;
  CHECK(cudaMemcpy(small, h.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("cudaw_demo: %ld MiB, %d iterations\n", mib, iters);
  std::fflush(stdout);
  int done = 0;
  auto step = [&](int it) {
    size_t at = ((size_t)it * 104729u * 4096u) % (big_n > (size_t)n ? big_n - n : 1);
    mix<<<(n + 255) / 256, 256, 0, s>>>(big + at, small, n, (unsigned)it);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(small, big + at, n * sizeof(unsigned), cudaMemcpyDeviceToDevice, s));
  };
  char line[128];
  while (done < iters && std::fgets(line, sizeof line, stdin)) {
    int k = 0;
    if (std::sscanf(line, "run %d", &k) == 1) {
      for (int i = 0; i < k && done < iters; i++) step(done++);
      CHECK(cudaStreamSynchronize(s));
      std::printf("ran %d\n", done);
      std::fflush(stdout);
    } else if (std::strncmp(line, "end", 3) == 0) {
      break;
    } else {
      std::fprintf(stderr, "cudaw_demo: unknown command %s", line);
      return 3;
    }
  }
  while (done < iters) step(done++);
  CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned> back(big_n);
  CHECK(cudaMemcpy(back.data(), big, big_n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(h.data(), small, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  unsigned long long sum = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < big_n; i++) sum = (sum ^ back[i]) * 0x100000001b3ull;
  for (int i = 0; i < n; i++) sum = (sum ^ h[i]) * 0x100000001b3ull;
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(big));
  CHECK(cudaFree(small));
  std::printf("cudaw_demo mib=%ld iters=%d checksum=%016llx\n", mib, iters, sum);
  return 0;
}
