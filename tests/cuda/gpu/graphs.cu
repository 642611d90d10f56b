// Stream capture into a graph, instantiated and replayed 100 times; plus a graph built by
// hand with a kernel node.
#include "../programs/common.h"
#include <vector>
__global__ void inc(int* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] += 1;
}
__global__ void twice(int* v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= 2;
}
int main() {
  const int n = 1 << 16;
  int* d;
  CHECK(cudaMalloc(&d, n * 4));
  CHECK(cudaMemset(d, 0, n * 4));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g; cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  inc<<<n / 256, 256, 0, s>>>(d, n);
  inc<<<n / 256, 256, 0, s>>>(d, n);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  for (int r = 0; r < 100; r++) CHECK(cudaGraphLaunch(ge, s));
  // A hand-built graph: one kernel node.
  cudaGraph_t g2; cudaGraphExec_t ge2; cudaGraphNode_t node;
  CHECK(cudaGraphCreate(&g2, 0));
  int nn = n; void* args[] = {&d, &nn};
  cudaKernelNodeParams p = {};
  p.func = (void*)twice; p.gridDim = dim3(n / 256); p.blockDim = dim3(256); p.kernelParams = args;
  CHECK(cudaGraphAddKernelNode(&node, g2, nullptr, 0, &p));
  CHECK(cudaGraphInstantiate(&ge2, g2, 0));
  CHECK(cudaGraphLaunch(ge2, s));
  CHECK(cudaStreamSynchronize(s));
  std::vector<int> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) EXPECT(h[i] == 400);
  CHECK(cudaGraphExecDestroy(ge)); CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphExecDestroy(ge2)); CHECK(cudaGraphDestroy(g2));
  CHECK(cudaStreamDestroy(s)); CHECK(cudaFree(d));
  std::printf("graphs n=%d value=%d\n", n, h[0]);
  return 0;
}
