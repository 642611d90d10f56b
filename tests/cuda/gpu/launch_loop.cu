// Benchmark: an empty kernel launched N times in a stream; prints launches per second.
// Usage: launch_loop [N] (default 200000). Not a correctness test.
#include "../programs/common.h"
#include <chrono>
__global__ void empty() {}
int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  cudaStream_t s; CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 1000; i++) empty<<<1, 1, 0, s>>>();
  CHECK(cudaStreamSynchronize(s));
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; i++) empty<<<1, 1, 0, s>>>();
  CHECK(cudaStreamSynchronize(s));
  auto t1 = std::chrono::steady_clock::now();
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  CHECK_LAUNCH();
  std::printf("launch_loop n=%ld us_per_launch=%.4f\n", n, us);
  return 0;
}
