// Inclusive prefix sum of 1M ints: per-block scan, block sums scanned on the host side of
// a second kernel, then added back.
#include "../programs/common.h"
#include <vector>
__global__ void block_scan(int* v, int* sums, int n) {
  __shared__ int s[1024];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? v[i] : 0;
  __syncthreads();
  for (int off = 1; off < blockDim.x; off <<= 1) {
    int t = threadIdx.x >= off ? s[threadIdx.x - off] : 0;
    __syncthreads();
    s[threadIdx.x] += t;
    __syncthreads();
  }
  if (i < n) v[i] = s[threadIdx.x];
  if (threadIdx.x == blockDim.x - 1) sums[blockIdx.x] = s[threadIdx.x];
}
__global__ void scan_sums(int* sums, int m) {
  if (threadIdx.x == 0) for (int i = 1; i < m; i++) sums[i] += sums[i - 1];
}
__global__ void add_offsets(int* v, const int* sums, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (blockIdx.x > 0 && i < n) v[i] += sums[blockIdx.x - 1];
}
int main() {
  const int n = 1 << 20, b = 1024, m = n / b;
  std::vector<int> h(n), out(n);
  for (int i = 0; i < n; i++) h[i] = i % 3 - 1;
  int *d, *sums;
  CHECK(cudaMalloc(&d, n * 4)); CHECK(cudaMalloc(&sums, m * 4));
  CHECK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  block_scan<<<m, b>>>(d, sums, n); CHECK_LAUNCH();
  scan_sums<<<1, 1>>>(sums, m); CHECK_LAUNCH();
  add_offsets<<<m, b>>>(d, sums, n); CHECK_LAUNCH();
  CHECK(cudaMemcpy(out.data(), d, n * 4, cudaMemcpyDeviceToHost));
  long long acc = 0, check = 0;
  for (int i = 0; i < n; i++) { acc += h[i]; EXPECT(out[i] == acc); check += out[i]; }
  CHECK(cudaFree(d)); CHECK(cudaFree(sums));
  std::printf("scan n=%d last=%d check=%lld\n", n, out[n - 1], check);
  return 0;
}
