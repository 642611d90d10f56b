// Four streams, each: async copy in, scale kernel, async copy out, an event; the host waits
// on the events and checks every chunk.
#include "common.h"
#include <vector>
__global__ void scale(float* v, int n, float k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] *= k;
}
int main() {
  const int streams = 4, chunk = 1 << 18, n = streams * chunk;
  float* h;
  CHECK(cudaMallocHost(&h, n * sizeof(float)));
  for (int i = 0; i < n; i++) h[i] = (float)(i % 4096);
  float* d;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  cudaStream_t s[streams];
  cudaEvent_t done[streams], start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, 0));
  for (int k = 0; k < streams; k++) {
    CHECK(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&done[k]));
    float* hp = h + k * chunk; float* dp = d + k * chunk;
    CHECK(cudaMemcpyAsync(dp, hp, chunk * sizeof(float), cudaMemcpyHostToDevice, s[k]));
    scale<<<(chunk + 255) / 256, 256, 0, s[k]>>>(dp, chunk, (float)(k + 2));
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(hp, dp, chunk * sizeof(float), cudaMemcpyDeviceToHost, s[k]));
    CHECK(cudaEventRecord(done[k], s[k]));
  }
  for (int k = 0; k < streams; k++) CHECK(cudaEventSynchronize(done[k]));
  CHECK(cudaEventRecord(stop, 0));
  CHECK(cudaEventSynchronize(stop));
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms >= 0);
  double sum = 0;
  for (int i = 0; i < n; i++) {
    int k = i / chunk;
    EXPECT(h[i] == (float)(i % 4096) * (float)(k + 2));
    sum += h[i];
  }
  for (int k = 0; k < streams; k++) { CHECK(cudaStreamDestroy(s[k])); CHECK(cudaEventDestroy(done[k])); }
  CHECK(cudaEventDestroy(start)); CHECK(cudaEventDestroy(stop));
  CHECK(cudaFree(d)); CHECK(cudaFreeHost(h));
  std::printf("streams_events streams=%d n=%d sum=%.1f\n", streams, n, sum);
  return 0;
}
