// Benchmark: an empty kernel launched N times in a stream; prints microseconds per launch.
// Usage: launch_loop [N] [BLOCKS] (defaults 200000, 5). The N launches run in BLOCKS equal
// blocks, each timed from its first launch to the stream's completion; us_per_launch is the
// fastest block (a transient slow phase of the host or the GPU is left out), and every
// block's figure follows in blocks_us=. Then the host's own cost of a launch, apart from the
// GPU's pace: HOST_ROUNDS rounds of 32 launches into an idle stream, each round's enqueue
// timed alone (the stream is drained between rounds, so no launch waits for queue space);
// host_ns_per_launch is the fastest round's per-launch figure, host_median_ns the median
// round's. Not a correctness test.
#include "../programs/common.h"
#include <chrono>
#include <string>
#include <vector>
#include <algorithm>
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
  const int rounds = 400, batch = 32;
  std::vector<double> host;
  for (int r = 0; r < rounds; r++) {
    CHECK(cudaStreamSynchronize(s));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < batch; i++) empty<<<1, 1, 0, s>>>();
    auto t1 = std::chrono::steady_clock::now();
    host.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / batch);
  }
  CHECK(cudaStreamSynchronize(s));
  std::sort(host.begin(), host.end());
  CHECK_LAUNCH();
  std::printf("launch_loop n=%ld blocks_us=%s host_median_ns=%.1f host_ns_per_launch=%.1f us_per_launch=%.4f\n",
              per * blocks, all.c_str(), host[rounds / 2], host[0], best);
  return 0;
}
