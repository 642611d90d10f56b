// __constant__ and __device__ variables through cudaMemcpyToSymbol / FromSymbol / GetSymbolAddress.
#include "../programs/common.h"
__constant__ float coeffs[16];
__device__ int counter;
__device__ float results[16];
__global__ void apply() {
  int i = threadIdx.x;
  results[i] = coeffs[i] * 3.0f;
  atomicAdd(&counter, 1);
}
int main() {
  float c[16], r[16];
  for (int i = 0; i < 16; i++) c[i] = (float)i + 0.5f;
  CHECK(cudaMemcpyToSymbol(coeffs, c, sizeof(c)));
  int zero = 0;
  CHECK(cudaMemcpyToSymbol(counter, &zero, sizeof(int)));
  apply<<<1, 16>>>(); CHECK_LAUNCH();
  CHECK(cudaMemcpyFromSymbol(r, results, sizeof(r)));
  int cnt = 0;
  CHECK(cudaMemcpyFromSymbol(&cnt, counter, sizeof(int)));
  void* addr = nullptr;
  CHECK(cudaGetSymbolAddress(&addr, results));
  float r2[16];
  CHECK(cudaMemcpy(r2, addr, sizeof(r2), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int i = 0; i < 16; i++) { EXPECT(r[i] == c[i] * 3.0f); EXPECT(r2[i] == r[i]); sum += r[i]; }
  EXPECT(cnt == 16);
  std::printf("symbols counter=%d sum=%.1f\n", cnt, sum);
  return 0;
}
