// Tiled single-precision matrix multiply, 512x512, checked against the CPU (integers: exact).
#include "../programs/common.h"
#include <vector>
#define T 16
__global__ void matmul(const float* A, const float* B, float* C, int n) {
  __shared__ float As[T][T], Bs[T][T];
  int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
  float acc = 0;
  for (int k0 = 0; k0 < n; k0 += T) {
    As[threadIdx.y][threadIdx.x] = A[r * n + k0 + threadIdx.x];
    Bs[threadIdx.y][threadIdx.x] = B[(k0 + threadIdx.y) * n + c];
    __syncthreads();
    for (int k = 0; k < T; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  C[r * n + c] = acc;
}
int main() {
  const int n = 512;
  std::vector<float> A(n * n), B(n * n), C(n * n);
  for (int i = 0; i < n * n; i++) { A[i] = (float)(i % 7 - 3); B[i] = (float)(i % 5 - 2); }
  float *dA, *dB, *dC;
  CHECK(cudaMalloc(&dA, n * n * 4)); CHECK(cudaMalloc(&dB, n * n * 4)); CHECK(cudaMalloc(&dC, n * n * 4));
  CHECK(cudaMemcpy(dA, A.data(), n * n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dB, B.data(), n * n * 4, cudaMemcpyHostToDevice));
  matmul<<<dim3(n / T, n / T), dim3(T, T)>>>(dA, dB, dC, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(C.data(), dC, n * n * 4, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int r = 0; r < n; r += 37)
    for (int c = 0; c < n; c += 41) {
      float e = 0;
      for (int k = 0; k < n; k++) e += A[r * n + k] * B[k * n + c];
      EXPECT(e == C[r * n + c]);
    }
  for (int i = 0; i < n * n; i++) sum += C[i];
  CHECK(cudaFree(dA)); CHECK(cudaFree(dB)); CHECK(cudaFree(dC));
  std::printf("matmul n=%d sum=%.1f\n", n, sum);
  return 0;
}
