// Every launch path: <<<>>>, cudaLaunchKernel, cudaLaunchKernelExC with attributes,
// cudaLaunchCooperativeKernel, and a large (8000-byte) by-value parameter.
#include "../programs/common.h"
#include <cooperative_groups.h>
#include <vector>
namespace cg = cooperative_groups;
struct Big { int vals[2000]; };
__global__ void add_k(int* v, int k) { v[threadIdx.x] += k; }
__global__ void big_param(Big b, int* out) { out[threadIdx.x] = b.vals[threadIdx.x * 10]; }
__global__ void coop(int* v, int n) {
  cg::grid_group g = cg::this_grid();
  int i = g.thread_rank();
  if (i < n) v[i] += 1;
  g.sync();
  if (i == 0) { int t = 0; for (int j = 0; j < n; j++) t += v[j]; v[n] = t; }
}
int main() {
  int* d;
  CHECK(cudaMalloc(&d, 1025 * 4));
  CHECK(cudaMemset(d, 0, 1025 * 4));
  add_k<<<1, 128>>>(d, 1); CHECK_LAUNCH();
  int k = 2; void* args[] = {&d, &k};
  CHECK(cudaLaunchKernel((void*)add_k, dim3(1), dim3(128), args, 0, 0));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1); cfg.blockDim = dim3(128);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributePriority; attr[0].val.priority = 0;
  cfg.attrs = attr; cfg.numAttrs = 1;
  int k3 = 3; void* args3[] = {&d, &k3};
  CHECK(cudaLaunchKernelExC(&cfg, (void*)add_k, args3));
  Big b; for (int i = 0; i < 2000; i++) b.vals[i] = i * 3;
  int* out; CHECK(cudaMalloc(&out, 128 * 4));
  big_param<<<1, 128>>>(b, out); CHECK_LAUNCH();
  int n = 1024; void* cargs[] = {&d, &n};
  int supported = 0; CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, 0));
  EXPECT(supported);
  CHECK(cudaMemset(d + 128, 0, (1024 - 128) * 4));
  CHECK(cudaLaunchCooperativeKernel((void*)coop, dim3(4), dim3(256), cargs, 0, 0));
  int h[1025], ho[128];
  CHECK(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ho, out, sizeof(ho), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 128; i++) { EXPECT(h[i] == 7); EXPECT(ho[i] == i * 30); }
  for (int i = 128; i < 1024; i++) EXPECT(h[i] == 1);
  EXPECT(h[1024] == 128 * 7 + 896);
  CHECK(cudaFree(d)); CHECK(cudaFree(out));
  std::printf("launch_variants total=%d big=%d\n", h[1024], ho[127]);
  return 0;
}
