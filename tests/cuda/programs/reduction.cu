// Sum of 4M integers: per-block partial sums in shared memory, then a second pass.
#include "common.h"
#include <vector>
__global__ void block_sum(const int* in, long long* partial, int n) {
  __shared__ long long s[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? in[i] : 0;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}
__global__ void final_sum(const long long* partial, long long* out, int n) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    long long t = 0;
    for (int i = 0; i < n; i++) t += partial[i];
    *out = t;
  }
}
int main() {
  const int n = 4 << 20, threads = 256, blocks = (n + threads - 1) / threads;
  std::vector<int> h(n);
  long long expect = 0;
  for (int i = 0; i < n; i++) { h[i] = (i * 7919) % 2001 - 1000; expect += h[i]; }
  int* din; long long *dpart, *dout;
  CHECK(cudaMalloc(&din, n * sizeof(int)));
  CHECK(cudaMalloc(&dpart, blocks * sizeof(long long)));
  CHECK(cudaMalloc(&dout, sizeof(long long)));
  CHECK(cudaMemcpy(din, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  block_sum<<<blocks, threads>>>(din, dpart, n);
  CHECK_LAUNCH();
  final_sum<<<1, 1>>>(dpart, dout, blocks);
  CHECK_LAUNCH();
  long long got = 0;
  CHECK(cudaMemcpy(&got, dout, sizeof(got), cudaMemcpyDeviceToHost));
  EXPECT(got == expect);
  CHECK(cudaFree(din)); CHECK(cudaFree(dpart)); CHECK(cudaFree(dout));
  std::printf("reduction n=%d sum=%lld\n", n, got);
  return 0;
}
