// cudaMallocPitch + cudaMemcpy2D, cudaMalloc3D + cudaMemcpy3D + cudaMemset3D.
#include "../programs/common.h"
#include <vector>
__global__ void touch2d(float* p, size_t pitch, int w, int h) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
  if (x < w && y < h) { float* row = (float*)((char*)p + y * pitch); row[x] = row[x] * 2 + y; }
}
int main() {
  const int w = 300, h = 200;
  std::vector<float> a(w * h), b(w * h);
  for (int i = 0; i < w * h; i++) a[i] = (float)(i % 97);
  float* d; size_t pitch;
  CHECK(cudaMallocPitch(&d, &pitch, w * 4, h));
  EXPECT(pitch >= w * 4);
  CHECK(cudaMemcpy2D(d, pitch, a.data(), w * 4, w * 4, h, cudaMemcpyHostToDevice));
  touch2d<<<dim3((w + 127) / 128, h), 128>>>(d, pitch, w, h); CHECK_LAUNCH();
  CHECK(cudaMemcpy2D(b.data(), w * 4, d, pitch, w * 4, h, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) { EXPECT(b[y * w + x] == a[y * w + x] * 2 + y); sum += b[y * w + x]; }
  cudaExtent ext = make_cudaExtent(64 * 4, 32, 16);
  cudaPitchedPtr pp;
  CHECK(cudaMalloc3D(&pp, ext));
  CHECK(cudaMemset3D(pp, 7, ext));
  std::vector<unsigned char> host(64 * 4 * 32 * 16, 0);
  cudaMemcpy3DParms cp = {};
  cp.srcPtr = pp; cp.dstPtr = make_cudaPitchedPtr(host.data(), 64 * 4, 64 * 4, 32); cp.extent = ext; cp.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&cp));
  for (auto v : host) EXPECT(v == 7);
  CHECK(cudaFree(d)); CHECK(cudaFree(pp.ptr));
  std::printf("pitch_3d pitch_ok=1 sum=%.1f bytes3d=%zu\n", sum, host.size());
  return 0;
}
