// A cuBLAS SGEMM on cudaMalloc'd memory (cuBLAS reaches the driver itself).
#include "../programs/common.h"
#include <cublas_v2.h>
#include <vector>
int main() {
  const int n = 256;
  std::vector<float> A(n * n), B(n * n), C(n * n);
  for (int i = 0; i < n * n; i++) { A[i] = (float)(i % 5 - 2); B[i] = (float)(i % 3 - 1); }
  float *dA, *dB, *dC;
  CHECK(cudaMalloc(&dA, n * n * 4)); CHECK(cudaMalloc(&dB, n * n * 4)); CHECK(cudaMalloc(&dC, n * n * 4));
  CHECK(cudaMemcpy(dA, A.data(), n * n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dB, B.data(), n * n * 4, cudaMemcpyHostToDevice));
  cublasHandle_t h;
  EXPECT(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  EXPECT(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS);
  float one = 1, zero = 0;
  EXPECT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dA, n, dB, n, &zero, dC, n) == CUBLAS_STATUS_SUCCESS);
  CHECK(cudaMemcpy(C.data(), dC, n * n * 4, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int c = 0; c < n; c += 17)
    for (int r = 0; r < n; r += 13) {
      float e = 0;
      for (int k = 0; k < n; k++) e += A[k * n + r] * B[c * n + k];
      EXPECT(e == C[c * n + r]);
    }
  for (int i = 0; i < n * n; i++) sum += C[i];
  cublasDestroy(h);
  CHECK(cudaFree(dA)); CHECK(cudaFree(dB)); CHECK(cudaFree(dC));
  std::printf("cublas_gemm n=%d sum=%.1f\n", n, sum);
  return 0;
}
