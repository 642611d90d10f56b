// One process driving two GPUs with peer access, for tests/multidev.rs: buffers on both
// devices, a kernel on GPU 1 reading GPU 0's cudaMalloc memory (one buffer allocated
// before peer access was enabled, one after), cudaMemcpyPeer both ways, mirrored on the
// CPU. Each line "run K" on standard input runs the next K iterations (of 48 in all) and
// prints "ran DONE"; "end", or the end of input, runs the rest. Every iteration prints a
// digest of GPU 1's buffer; the end checks every buffer against the CPU. So the output,
// less the "ran" lines, is the same whatever the schedule.
//
// Its memory: device 0 `a` and `b` (64 KiB each; `late`, 64 KiB, allocated after peer
// access was enabled), device 1 `c` (64 KiB) and `wide` (3 MiB + 12 bytes).
#include "common.h"
#include <cstring>
#include <vector>
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
static void mix_cpu(unsigned* x, const unsigned* y, int n, unsigned k) {
  for (int i = 0; i < n; i++) x[i] = x[i] * 1664525u + y[i] + k;
}
static unsigned long long digest(const std::vector<unsigned>& v) {
  unsigned long long h = 1469598103934665603ull;
  for (unsigned x : v) h = (h ^ x) * 1099511628211ull;
  return h;
}
int main() {
  const int n = 1 << 14, iters = 48;
  const size_t bytes = n * sizeof(unsigned), wide_bytes = (3u << 20) + 12;
  const int wide_n = (int)(wide_bytes / sizeof(unsigned));
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  if (count < 2) {
    std::fprintf(stderr, "multidev_peer: %d device(s), 2 needed\n", count);
    return 2;
  }
  int can = 0;
  CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
  EXPECT(can == 1);
  std::vector<unsigned> ha(n), hb(n), hc(n), hlate(n), hwide(wide_n), back(n);
  for (int i = 0; i < n; i++) {
    ha[i] = (unsigned)i * 2654435761u;
    hb[i] = (unsigned)i ^ 0x5bd1e995u;
    hc[i] = 7u * (unsigned)i;
    hlate[i] = (unsigned)i * 40503u + 1u;
  }
  for (int i = 0; i < wide_n; i++) hwide[i] = (unsigned)i;
  unsigned *a, *b, *late, *c, *wide;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemcpy(a, ha.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, hb.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaSetDevice(1));
  CHECK(cudaMalloc(&c, bytes));
  CHECK(cudaMalloc(&wide, wide_bytes));
  CHECK(cudaMemcpy(c, hc.data(), bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(wide, hwide.data(), wide_bytes, cudaMemcpyHostToDevice));
  // GPU 1 may read GPU 0's memory: `a` and `b` exist already, `late` comes after.
  CHECK(cudaDeviceEnablePeerAccess(0, 0));
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&late, bytes));
  CHECK(cudaMemcpy(late, hlate.data(), bytes, cudaMemcpyHostToDevice));
  std::printf("multidev_peer: 5 allocations on 2 devices\n");
  std::fflush(stdout);

  int done = 0;
  auto step = [&](int it) {
    unsigned k = (unsigned)it;
    // GPU 0 on its own memory.
    CHECK(cudaSetDevice(0));
    mix<<<(n + 255) / 256, 256>>>(a, b, n, k);
    CHECK_LAUNCH();
    mix_cpu(ha.data(), hb.data(), n, k);
    // Devices' streams are not ordered with each other: GPU 1 reads `a` once it is done.
    CHECK(cudaDeviceSynchronize());
    // GPU 1 reads GPU 0's memory: `a` (from before peer access) and `late` (after).
    CHECK(cudaSetDevice(1));
    mix<<<(n + 255) / 256, 256>>>(c, (it % 2) ? a : late, n, k);
    CHECK_LAUNCH();
    mix_cpu(hc.data(), (it % 2) ? ha.data() : hlate.data(), n, k);
    int at = (int)(((long long)it * 7919 * 64) % (wide_n - n));
    mix<<<(n + 255) / 256, 256>>>(wide + at, c, n, k);
    CHECK_LAUNCH();
    mix_cpu(hwide.data() + at, hc.data(), n, k);
    CHECK(cudaDeviceSynchronize());
    // Peer copies: GPU 1's `c` into GPU 0's `b`, GPU 0's `a` into `late`.
    CHECK(cudaMemcpyPeer(b, 0, c, 1, bytes));
    hb = hc;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpyPeerAsync(late, 0, a, 0, bytes, 0));
    CHECK(cudaDeviceSynchronize());
    hlate = ha;
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(back.data(), c, bytes, cudaMemcpyDeviceToHost));
    EXPECT(std::memcmp(back.data(), hc.data(), bytes) == 0);
    std::printf("iteration %d: %016llx\n", it, digest(back));
  };
  char line[128];
  while (done < iters && std::fgets(line, sizeof line, stdin)) {
    int k = 0;
    if (std::sscanf(line, "run %d", &k) == 1) {
      for (int i = 0; i < k && done < iters; i++) step(done++);
      std::printf("ran %d\n", done);
      std::fflush(stdout);
    } else if (std::strncmp(line, "end", 3) == 0) {
      break;
    } else {
      std::fprintf(stderr, "multidev_peer: unknown command %s", line);
      return 3;
    }
  }
  while (done < iters) step(done++);
  std::vector<unsigned> all(wide_n);
  CHECK(cudaSetDevice(0));
  CHECK(cudaMemcpy(back.data(), a, bytes, cudaMemcpyDeviceToHost));
  EXPECT(back == ha);
  CHECK(cudaMemcpy(back.data(), b, bytes, cudaMemcpyDeviceToHost));
  EXPECT(back == hb);
  CHECK(cudaMemcpy(back.data(), late, bytes, cudaMemcpyDeviceToHost));
  EXPECT(back == hlate);
  CHECK(cudaSetDevice(1));
  CHECK(cudaMemcpy(all.data(), wide, wide_bytes, cudaMemcpyDeviceToHost));
  EXPECT(all == hwide);
  std::printf("multidev_peer: every buffer matches the CPU; wide %016llx\n", digest(all));
  CHECK(cudaDeviceDisablePeerAccess(0));
  CHECK(cudaFree(c));
  CHECK(cudaFree(wide));
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(late));
  return 0;
}
