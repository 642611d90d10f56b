// Stream-ordered allocation: allocate, fill, use and free on a stream, many rounds, with
// the pool's release threshold set as PyTorch's allocator does.
#include "common.h"
#include <vector>
__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}
__global__ void add_into(const int* a, int* acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += a[i];
}
int main() {
  const int n = 1 << 16, rounds = 20;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  cudaMemPool_t pool;
  CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  unsigned long long threshold = ~0ull;
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  int* acc;
  CHECK(cudaMallocAsync((void**)&acc, n * sizeof(int), s));
  CHECK(cudaMemsetAsync(acc, 0, n * sizeof(int), s));
  for (int r = 0; r < rounds; r++) {
    int* tmp;
    CHECK(cudaMallocAsync((void**)&tmp, n * sizeof(int), s));
    fill<<<(n + 255) / 256, 256, 0, s>>>(tmp, n, r);
    CHECK_LAUNCH();
    add_into<<<(n + 255) / 256, 256, 0, s>>>(tmp, acc, n);
    CHECK_LAUNCH();
    CHECK(cudaFreeAsync(tmp, s));
  }
  std::vector<int> h(n);
  CHECK(cudaMemcpyAsync(h.data(), acc, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  long long sum = 0;
  for (int i = 0; i < n; i++) {
    EXPECT(h[i] == rounds * i + rounds * (rounds - 1) / 2);
    sum += h[i];
  }
  CHECK(cudaFreeAsync(acc, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  std::printf("malloc_async n=%d rounds=%d sum=%lld\n", n, rounds, sum);
  return 0;
}
