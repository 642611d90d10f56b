// A long loop of kernel launches and copies over a few buffers, mirrored on the CPU:
// the target the pause/resume test signals at random instants. Prints one line as soon as
// its memory is allocated (the shim is initialised then), and a checksum at the end.
//
// After the loop it waits, memory still allocated, until its standard input is closed (at
// once when it is /dev/null): a test that pauses it however many times, however slow the
// machine, closes it when it is done, never finding the program gone.
#include "common.h"
#include <cerrno>
#include <unistd.h>
#include <vector>
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
static void mix_cpu(std::vector<unsigned>& x, const std::vector<unsigned>& y, unsigned k) {
  for (size_t i = 0; i < x.size(); i++) x[i] = x[i] * 1664525u + y[i] + k;
}
int main() {
  const int n = 1 << 14, buffers = 4, iters = 600;
  std::vector<std::vector<unsigned>> hx(buffers, std::vector<unsigned>(n));
  std::vector<unsigned> hy(n), back(n);
  for (int i = 0; i < n; i++) hy[i] = (unsigned)i * 2654435761u;
  unsigned* dx[buffers];
  unsigned* dy;
  CHECK(cudaMalloc(&dy, n * sizeof(unsigned)));
  CHECK(cudaMemcpy(dy, hy.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  for (int b = 0; b < buffers; b++) {
    CHECK(cudaMalloc(&dx[b], n * sizeof(unsigned)));
    CHECK(cudaMemset(dx[b], b + 1, n * sizeof(unsigned)));
    for (int i = 0; i < n; i++) hx[b][i] = 0x01010101u * (unsigned)(b + 1);
  }
  std::printf("pause_target: %d buffers of %d bytes\n", buffers + 1, (int)(n * sizeof(unsigned)));
  std::fflush(stdout);
  unsigned long long checksum = 0;
  for (int it = 0; it < iters; it++) {
    for (int b = 0; b < buffers; b++) {
      unsigned k = (unsigned)(it * buffers + b);
      mix<<<(n + 255) / 256, 256>>>(dx[b], dy, n, k);
      CHECK_LAUNCH();
      mix_cpu(hx[b], hy, k);
    }
    // y becomes one of the buffers: every buffer feeds the next iteration.
    CHECK(cudaMemcpyAsync(dy, dx[it % buffers], n * sizeof(unsigned), cudaMemcpyDeviceToDevice, 0));
    hy = hx[it % buffers];
    if (it % 20 == 19) {
      int b = (it / 20) % buffers;
      CHECK(cudaMemcpy(back.data(), dx[b], n * sizeof(unsigned), cudaMemcpyDeviceToHost));
      for (int i = 0; i < n; i++) { EXPECT(back[i] == hx[b][i]); checksum = checksum * 31 + back[i]; }
    }
  }
  CHECK(cudaDeviceSynchronize());
  for (;;) {
    char buf[64];
    ssize_t got = read(0, buf, sizeof buf);
    if (got > 0 || (got < 0 && errno == EINTR)) continue;  // a pause's signal, or input
    break;                                                 // closed
  }
  for (int b = 0; b < buffers; b++) CHECK(cudaFree(dx[b]));
  CHECK(cudaFree(dy));
  std::printf("pause_target iters=%d checksum=%llu\n", iters, checksum);
  return 0;
}
