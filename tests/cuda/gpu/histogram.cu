// 256-bin histogram of 16M bytes with shared-memory atomics.
#include "../programs/common.h"
#include <vector>
__global__ void histo(const unsigned char* in, unsigned int* bins, int n) {
  __shared__ unsigned int local[256];
  local[threadIdx.x] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[in[i]], 1u);
  __syncthreads();
  atomicAdd(&bins[threadIdx.x], local[threadIdx.x]);
}
int main() {
  const int n = 16 << 20;
  std::vector<unsigned char> h(n);
  std::vector<unsigned int> expect(256, 0), got(256);
  for (int i = 0; i < n; i++) { h[i] = (unsigned char)((i * 2654435761u) >> 24); expect[h[i]]++; }
  unsigned char* d; unsigned int* bins;
  CHECK(cudaMalloc(&d, n)); CHECK(cudaMalloc(&bins, 256 * 4));
  CHECK(cudaMemcpy(d, h.data(), n, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(bins, 0, 256 * 4));
  histo<<<264, 256>>>(d, bins, n); CHECK_LAUNCH();
  CHECK(cudaMemcpy(got.data(), bins, 256 * 4, cudaMemcpyDeviceToHost));
  unsigned long long weighted = 0;
  for (int i = 0; i < 256; i++) { EXPECT(got[i] == expect[i]); weighted += (unsigned long long)got[i] * i; }
  CHECK(cudaFree(d)); CHECK(cudaFree(bins));
  std::printf("histogram n=%d weighted=%llu\n", n, weighted);
  return 0;
}
