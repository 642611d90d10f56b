// The target the dump/restore tests checkpoint: a loop of kernel launches and copies over
// a few buffers, mirrored on the CPU, that runs as its standard input tells it. Each line
// "run K" runs the next K iterations (of 240 in all) and prints "ran DONE"; "end", or the
// end of input, runs the rest, checks every buffer against the CPU and prints a checksum.
// So the output is the same whatever the schedule, once the "ran" lines are left out; with
// no input it runs straight through.
//
// Its memory: three 64 KiB buffers, a 9 MiB + 20 byte buffer (two 8 MiB image chunks,
// the second short; each iteration changes 64 KiB of it somewhere else) and a 100 byte
// counter the host writes each iteration.
#include "common.h"
#include <cstring>
#include <string>
#include <vector>
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
static void mix_cpu(unsigned* x, const unsigned* y, int n, unsigned k) {
  for (int i = 0; i < n; i++) x[i] = x[i] * 1664525u + y[i] + k;
}
int main() {
  const int n = 1 << 14, buffers = 3, iters = 240;
  const size_t big_bytes = (9u << 20) + 20, big_n = big_bytes / sizeof(unsigned);
  std::vector<std::vector<unsigned>> hx(buffers, std::vector<unsigned>(n));
  std::vector<unsigned> hy(n), back(n), hbig(big_n);
  for (int i = 0; i < n; i++) hy[i] = (unsigned)i * 2654435761u;
  for (size_t i = 0; i < big_n; i++) hbig[i] = (unsigned)(i * 40503u) ^ 0x9e3779b9u;
  unsigned* dx[buffers];
  unsigned *dy, *big, *counter;
  CHECK(cudaMalloc(&dy, n * sizeof(unsigned)));
  CHECK(cudaMemcpy(dy, hy.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  for (int b = 0; b < buffers; b++) {
    CHECK(cudaMalloc(&dx[b], n * sizeof(unsigned)));
    CHECK(cudaMemset(dx[b], b + 1, n * sizeof(unsigned)));
    for (int i = 0; i < n; i++) hx[b][i] = 0x01010101u * (unsigned)(b + 1);
  }
  CHECK(cudaMalloc(&big, big_bytes));
  CHECK(cudaMemcpy(big, hbig.data(), big_bytes, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&counter, 100));
  CHECK(cudaMemset(counter, 0, 100));
  std::printf("ckpt_target: %d allocations\n", buffers + 3);
  std::fflush(stdout);

  int done = 0;
  auto step = [&](int it) {
    for (int b = 0; b < buffers; b++) {
      unsigned k = (unsigned)(it * buffers + b);
      mix<<<(n + 255) / 256, 256>>>(dx[b], dy, n, k);
      CHECK_LAUNCH();
      mix_cpu(hx[b].data(), hy.data(), n, k);
    }
    // Somewhere else in the big buffer each time, across both of its image chunks.
    size_t at = ((size_t)it * 7919u * 256u) % (big_n - n);
    mix<<<(n + 255) / 256, 256>>>(big + at, dy, n, (unsigned)it);
    CHECK_LAUNCH();
    mix_cpu(hbig.data() + at, hy.data(), n, (unsigned)it);
    CHECK(cudaMemcpyAsync(dy, dx[it % buffers], n * sizeof(unsigned), cudaMemcpyDeviceToDevice, 0));
    hy = hx[it % buffers];
    int count = it + 1;
    CHECK(cudaMemcpy(counter, &count, sizeof count, cudaMemcpyHostToDevice));
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
      std::fprintf(stderr, "ckpt_target: unknown command %s", line);
      return 3;
    }
  }
  while (done < iters) step(done++);
  CHECK(cudaDeviceSynchronize());

  unsigned long long checksum = 0;
  for (int b = 0; b < buffers; b++) {
    CHECK(cudaMemcpy(back.data(), dx[b], n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) { EXPECT(back[i] == hx[b][i]); checksum = checksum * 31 + back[i]; }
  }
  std::vector<unsigned> bigback(big_n);
  CHECK(cudaMemcpy(bigback.data(), big, big_bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < big_n; i++) { EXPECT(bigback[i] == hbig[i]); checksum = checksum * 31 + bigback[i]; }
  int count = 0;
  CHECK(cudaMemcpy(&count, counter, sizeof count, cudaMemcpyDeviceToHost));
  EXPECT(count == iters);
  for (int b = 0; b < buffers; b++) CHECK(cudaFree(dx[b]));
  CHECK(cudaFree(dy));
  CHECK(cudaFree(big));
  CHECK(cudaFree(counter));
  std::printf("ckpt_target iters=%d checksum=%llu\n", iters, checksum);
  return 0;
}
