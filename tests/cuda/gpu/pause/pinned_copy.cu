// The ceiling for pause and resume: one cudaMemcpy of SIZE GiB device -> pinned host
// (cudaMallocHost) and back, best of REPS, plus the time cudaMallocHost took.
//   pinned_copy SIZE_GIB [REPS=3]
// Prints: pinned_alloc_s=A dtoh_s=D htod_s=H bytes=B verified=ok|BAD
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: pinned_copy SIZE_GIB [REPS=3]\n");
    return 2;
  }
  size_t bytes = (size_t)(atof(argv[1]) * (double)(1ull << 30));
  int reps = argc > 2 ? atoi(argv[2]) : 3;
  void* dev;
  CHECK(cudaMalloc(&dev, bytes));
  CHECK(cudaMemset(dev, 0x5A, bytes));
  CHECK(cudaDeviceSynchronize());
  double t = now();
  unsigned char* host;
  CHECK(cudaMallocHost(&host, bytes));
  double alloc_s = now() - t;
  double dtoh = 1e30, htod = 1e30;
  for (int r = 0; r < reps; r++) {
    t = now();
    CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
    double d = now() - t;
    if (d < dtoh) dtoh = d;
    t = now();
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    double h = now() - t;
    if (h < htod) htod = h;
  }
  bool ok = host[0] == 0x5A && host[bytes / 2] == 0x5A && host[bytes - 1] == 0x5A;
  printf("pinned_alloc_s=%.4f dtoh_s=%.4f htod_s=%.4f bytes=%zu verified=%s\n", alloc_s, dtoh, htod,
         bytes, ok ? "ok" : "BAD");
  CHECK(cudaFreeHost(host));
  CHECK(cudaFree(dev));
  return ok ? 0 : 1;
}
