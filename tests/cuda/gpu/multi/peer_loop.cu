// One process driving two GPUs with peer access (issue #26): a buffer on GPU 0 that GPU 1's
// kernel reads directly (cudaDeviceEnablePeerAccess), and cudaMemcpyPeer between them, in a
// loop a script pauses, dumps and restores at random instants; also HOLD MiB on each GPU
// with a known pattern. Prints "peer_loop: ready" once its memory is allocated and, at the
// end, a digest that must equal the uninterrupted run's.
//   peer_loop ITERS SLEEP_US HOLD_MIB
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <vector>
#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__global__ void step0(unsigned* a, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = a[i] * 1664525u + k + (unsigned)i;
}
// Runs on GPU 1: reads GPU 0's `a` through peer access.
__global__ void step1(const unsigned* a_peer, const unsigned* b, unsigned* c, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = (c[i] ^ a_peer[(i * 7) % n]) * 22695477u + b[i] + k;
}
__global__ void fill(unsigned long long* h, size_t n, unsigned long long salt) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x) h[i] = (i + salt) * 2654435761ull;
}
__global__ void check(const unsigned long long* h, size_t n, unsigned long long salt, int* bad) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  for (; i < n; i += (size_t)gridDim.x * blockDim.x)
    if (h[i] != (i + salt) * 2654435761ull) atomicAdd(bad, 1);
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  int sleep_us = argc > 2 ? std::atoi(argv[2]) : 0;
  size_t hold_mib = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64;
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::printf("peer_loop: needs 2 GPUs, %d visible\n", count);
    return 2;
  }
  int can01 = 0, can10 = 0;
  CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  if (!can10 || !can01) {
    std::printf("peer_loop: GPUs 0 and 1 cannot access each other\n");
    return 2;
  }
  const int n = 1 << 20;
  unsigned *a, *b, *c;
  unsigned long long* hold[2];
  size_t hn = (hold_mib << 20) / sizeof(unsigned long long);
  CHECK(cudaSetDevice(0));
  CHECK(cudaDeviceEnablePeerAccess(1, 0));
  CHECK(cudaMalloc(&a, n * sizeof(unsigned)));
  CHECK(cudaMemset(a, 1, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&hold[0], hn * sizeof(unsigned long long)));
  fill<<<1024, 256>>>(hold[0], hn, 0);
  CHECK(cudaGetLastError());
  CHECK(cudaSetDevice(1));
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  CHECK(cudaMalloc(&b, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&c, n * sizeof(unsigned)));
  CHECK(cudaMemset(b, 2, n * sizeof(unsigned)));
  CHECK(cudaMemset(c, 3, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&hold[1], hn * sizeof(unsigned long long)));
  fill<<<1024, 256>>>(hold[1], hn, 1);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::printf("peer_loop: ready (2 GPUs, %zu MiB held on each)\n", hold_mib);
  std::fflush(stdout);
  for (int it = 0; it < iters; it++) {
    CHECK(cudaSetDevice(0));
    step0<<<n / 256, 256>>>(a, n, (unsigned)it);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(1));
    step1<<<n / 256, 256>>>(a, b, c, n, (unsigned)it);
    CHECK(cudaGetLastError());
    // b (GPU 1) <- a (GPU 0), every fourth iteration.
    if (it % 4 == 0) CHECK(cudaMemcpyPeer(b, 1, a, 0, n * sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
    if (sleep_us) usleep(sleep_us);
  }
  std::vector<unsigned> hc(n), hb(n);
  CHECK(cudaMemcpy(hc.data(), c, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hb.data(), b, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  unsigned long long d = 1469598103934665603ull;
  for (int i = 0; i < n; i++) d = (d ^ hc[i] ^ ((unsigned long long)hb[i] << 32)) * 1099511628211ull;
  int bad_total = 0;
  for (int g = 0; g < 2; g++) {
    CHECK(cudaSetDevice(g));
    int* bad;
    CHECK(cudaMalloc(&bad, sizeof(int)));
    CHECK(cudaMemset(bad, 0, sizeof(int)));
    check<<<1024, 256>>>(hold[g], hn, (unsigned long long)g, bad);
    int hbad = 0;
    CHECK(cudaMemcpy(&hbad, bad, sizeof(int), cudaMemcpyDeviceToHost));
    bad_total += hbad;
  }
  std::printf("peer_loop iters=%d digest=%016llx held_bad=%d\n", iters, d, bad_total);
  return bad_total == 0 ? 0 : 1;
}
