// The process pausebench pauses: holds SIZE GiB of device memory in N cudaMallocs of
// uneven sizes, filled with a pattern by a kernel; prints "ready pid=P bytes=B" and then
// answers commands on stdin, one a line:
//   verify   checks every word on the device; prints "verified ok" or "verified BAD n"
//   quit     frees everything and exits 0
//
//   pause_target SIZE_GIB [ALLOCATIONS=16]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

__device__ __forceinline__ uint32_t word(uint32_t alloc, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)alloc << 40);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (uint32_t)x;
}

__global__ void fill(uint32_t* p, uint64_t n, uint32_t alloc) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = word(alloc, i);
}

__global__ void check(const uint32_t* p, uint64_t n, uint32_t alloc, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    mine += p[i] != word(alloc, i);
  if (mine) atomicAdd(bad, mine);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: pause_target SIZE_GIB [ALLOCATIONS=16]\n");
    return 2;
  }
  double gib = atof(argv[1]);
  int n = argc > 2 ? atoi(argv[2]) : 16;
  if (gib <= 0 || n < 1) {
    fprintf(stderr, "pause_target: SIZE_GIB must be positive and ALLOCATIONS at least 1\n");
    return 2;
  }
  uint64_t total = (uint64_t)(gib * (double)(1ull << 30));
  // Uneven sizes (multiples of 4 bytes) that add up to the total.
  std::vector<uint64_t> sizes(n);
  uint64_t base = total / n / 4 * 4, sum = 0;
  for (int i = 0; i < n; i++) {
    uint64_t shrink = (uint64_t)i * 4 * 2477;
    sizes[i] = base > 2 * shrink ? base - shrink : base;
    sum += sizes[i];
  }
  sizes[n - 1] += (total - sum) / 4 * 4;
  std::vector<uint32_t*> ptrs(n);
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    CHECK(cudaMalloc(&ptrs[i], sizes[i]));
    fill<<<1024, 256>>>(ptrs[i], sizes[i] / 4, i);
    bytes += sizes[i];
  }
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  unsigned long long* bad;
  CHECK(cudaMalloc(&bad, sizeof *bad));
  printf("ready pid=%d bytes=%llu allocations=%d\n", (int)getpid(), (unsigned long long)bytes, n + 1);
  fflush(stdout);
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    if (!strncmp(line, "verify", 6)) {
      CHECK(cudaMemset(bad, 0, sizeof *bad));
      for (int i = 0; i < n; i++) check<<<1024, 256>>>(ptrs[i], sizes[i] / 4, i, bad);
      unsigned long long host = 0;
      CHECK(cudaMemcpy(&host, bad, sizeof host, cudaMemcpyDeviceToHost));
      if (host == 0)
        printf("verified ok\n");
      else
        printf("verified BAD %llu\n", host);
      fflush(stdout);
    } else if (!strncmp(line, "quit", 4)) {
      break;
    }
  }
  for (int i = 0; i < n; i++) CHECK(cudaFree(ptrs[i]));
  CHECK(cudaFree(bad));
  return 0;
}
