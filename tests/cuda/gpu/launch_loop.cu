// Benchmark: an empty kernel launched N times in a stream; prints microseconds per launch.
// Usage: launch_loop [N] [BLOCKS] (defaults 200000, 5). The N launches run in BLOCKS equal
// blocks, each timed from its first launch to the stream's completion; us_per_launch is the
// fastest block (a transient slow phase of the host or the GPU is left out), and every
// block's figure follows in blocks_us=. Not a correctness test.
#include "../programs/common.h"
#include <chrono>
#include <string>
__global__ void empty() {}
int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  int blocks = argc > 2 ? atoi(argv[2]) : 5;
  if (n < 1 || blocks < 1 || blocks > n) {
    std::fprintf(stderr, "usage: launch_loop [N >= 1] [1 <= BLOCKS <= N]\n");
    return 2;
  }
  long per = n / blocks;
  cudaStream_t s; CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < 1000; i++) empty<<<1, 1, 0, s>>>();
  CHECK(cudaStreamSynchronize(s));
  double best = 1e30;
  std::string all;
  for (int b = 0; b < blocks; b++) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < per; i++) empty<<<1, 1, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));
    auto t1 = std::chrono::steady_clock::now();
    double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / per;
    if (us < best) best = us;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4f", b ? "," : "", us);
    all += buf;
  }
  CHECK_LAUNCH();
  std::printf("launch_loop n=%ld blocks_us=%s us_per_launch=%.4f\n", per * blocks, all.c_str(), best);
  return 0;
}
