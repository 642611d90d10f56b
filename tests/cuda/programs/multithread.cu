// Eight host threads, each allocating, launching and copying on its own stream at once.
#include "common.h"
#include <thread>
#include <vector>
__global__ void iota_times(long long* v, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = (long long)i * k;
}
int main() {
  const int threads = 8, n = 1 << 16, iters = 10;
  std::vector<long long> sums(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      cudaStream_t s;
      CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      std::vector<long long> h(n);
      for (int it = 0; it < iters; it++) {
        long long* d;
        CHECK(cudaMalloc(&d, n * sizeof(long long)));
        iota_times<<<(n + 255) / 256, 256, 0, s>>>(d, n, t + it);
        CHECK_LAUNCH();
        CHECK(cudaMemcpyAsync(h.data(), d, n * sizeof(long long), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) { EXPECT(h[i] == (long long)i * (t + it)); sums[t] += h[i]; }
        CHECK(cudaFree(d));
      }
      CHECK(cudaStreamDestroy(s));
    });
  }
  for (auto& th : pool) th.join();
  long long total = 0;
  for (auto v : sums) total += v;
  std::printf("multithread threads=%d total=%lld\n", threads, total);
  return 0;
}
