// A kernel taking a struct of device pointers by value: y = alpha * x + y, with the
// pointers inside the struct (what translated addressing must rewrite).
#include "common.h"
#include <vector>
struct Saxpy {
  const float* x;
  float* y;
  int n;
  float alpha;
  double* total;  // one more pointer after the scalars
};
__global__ void saxpy_struct(Saxpy p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.y[i] = p.alpha * p.x[i] + p.y[i];
  if (i == 0) *p.total = (double)p.n;
}
int main() {
  const int n = 100000;
  std::vector<float> x(n), y(n), out(n);
  for (int i = 0; i < n; i++) { x[i] = (float)(i % 100); y[i] = 1.0f; }
  Saxpy p;
  float *dx, *dy; double* dt;
  CHECK(cudaMalloc(&dx, n * sizeof(float)));
  CHECK(cudaMalloc(&dy, n * sizeof(float)));
  CHECK(cudaMalloc(&dt, sizeof(double)));
  CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  p.x = dx; p.y = dy; p.n = n; p.alpha = 2.0f; p.total = dt;
  saxpy_struct<<<(n + 127) / 128, 128>>>(p);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  double total = 0;
  CHECK(cudaMemcpy(&total, dt, sizeof(double), cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int i = 0; i < n; i++) { EXPECT(out[i] == 2.0f * x[i] + 1.0f); sum += out[i]; }
  EXPECT(total == (double)n);
  CHECK(cudaFree(dx)); CHECK(cudaFree(dy)); CHECK(cudaFree(dt));
  std::printf("struct_of_pointers n=%d sum=%.1f total=%.0f\n", n, sum, total);
  return 0;
}
