// Switching tracing off and on while a program runs (tests/trace.rs). The program switches
// it itself through cudaw_trace_active_v1 (found with dlsym; absent natively), then stops
// three times ("ready N" on standard output, a line on standard input to go on) so that the
// test can switch it with `cudaw-ckpt tracing` and read the metrics between:
//   add_into 10 launches; switch off; fill 20 launches + 5 memsets; switch on; switch on
//   again; scale 30 launches; "ready 1 off=A on=B again=C" (A, B, C: what each switch
//   returned: whether tracing was on before, -1 where it cannot be switched, -2 natively);
//   add_into 7 launches; "ready 2"; add_into 4 launches; "ready 3"; then frees and exits.
// Every launch is checked with cudaGetLastError. (The kernels are ones simgpu knows.)
#include "common.h"
#include <dlfcn.h>
#include <vector>
__global__ void add_into(const int* a, int* acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += a[i];
}
__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}
__global__ void scale(float* v, int n, float k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= k;
}
typedef int (*Switch)(int);
static void stop(const char* what) {
  std::printf("%s\n", what);
  std::fflush(stdout);
  char line[64];
  if (!std::fgets(line, sizeof line, stdin)) { /* end of input: go on */ }
}
int main() {
  const int n = 256;
  Switch sw = (Switch)dlsym(RTLD_DEFAULT, "cudaw_trace_active_v1");
  int *ones, *acc, *tmp;
  float* f;
  CHECK(cudaMalloc(&ones, n * sizeof(int)));
  CHECK(cudaMalloc(&acc, n * sizeof(int)));
  CHECK(cudaMalloc(&tmp, n * sizeof(int)));
  CHECK(cudaMalloc(&f, n * sizeof(float)));
  std::vector<int> one(n, 1);
  std::vector<float> fone(n, 1.0f);
  CHECK(cudaMemcpy(ones, one.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(f, fone.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(acc, 0, n * sizeof(int)));
  for (int i = 0; i < 10; i++) { add_into<<<1, n>>>(ones, acc, n); CHECK_LAUNCH(); }
  int off = sw ? sw(0) : -2;
  for (int i = 0; i < 20; i++) { fill<<<1, n>>>(tmp, n, i); CHECK_LAUNCH(); }
  for (int i = 0; i < 5; i++) CHECK(cudaMemset(tmp, 0, n * sizeof(int)));
  int on = sw ? sw(1) : -2;
  int again = sw ? sw(1) : -2;
  for (int i = 0; i < 30; i++) { scale<<<1, n>>>(f, n, 2.0f); CHECK_LAUNCH(); }
  char first[96];
  std::snprintf(first, sizeof first, "ready 1 off=%d on=%d again=%d", off, on, again);
  stop(first);
  for (int i = 0; i < 7; i++) { add_into<<<1, n>>>(ones, acc, n); CHECK_LAUNCH(); }
  stop("ready 2");
  for (int i = 0; i < 4; i++) { add_into<<<1, n>>>(ones, acc, n); CHECK_LAUNCH(); }
  stop("ready 3");
  std::vector<int> h(n);
  std::vector<float> hf(n);
  CHECK(cudaMemcpy(h.data(), acc, n * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hf.data(), f, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(h[i] == 21 && hf[i] == 1073741824.0f);
  CHECK(cudaFree(ones));
  CHECK(cudaFree(acc));
  CHECK(cudaFree(tmp));
  CHECK(cudaFree(f));
  std::printf("trace_switch done acc=%d f=%.0f\n", h[0], hf[0]);
  return 0;
}
