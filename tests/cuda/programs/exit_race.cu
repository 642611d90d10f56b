// Exits while a pause may arrive: device memory in use to the end, CUDA calls in a static
// destructor and in an atexit handler registered after the runtime started (as PyTorch's
// teardown and the runtime's own make them), the last line flushed just before main
// returns. Under cudaw, a pause at any instant of its teardown must let it exit.
#include "common.h"
#include <cstdlib>
#include <ctime>

__global__ void fill(int* p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v + i;
}

static const int N = 1 << 16;
static int* g_buf = nullptr;

// A global whose destructor reads, frees device memory and synchronises (during exit).
struct Holder {
  int* p = nullptr;
  ~Holder() {
    if (p) {
      int host[4] = {0, 0, 0, 0};
      // After the runtime's own teardown the call fails (cudaErrorCudartUnloading): fine.
      if (cudaMemcpy(host, p, sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess && host[3] != 7 + 3) {
        std::fprintf(stderr, "exit_race: the destructor read wrong bytes\n");
        std::_Exit(3);
      }
      cudaFree(p);
      cudaDeviceSynchronize();
    }
  }
};
static Holder g_holder;

static void at_exit() {
  int host[2] = {0, 0};
  if (cudaMemcpy(host, g_buf, sizeof(host), cudaMemcpyDeviceToHost) != cudaSuccess || host[1] != 1 + 1) {
    std::fprintf(stderr, "exit_race: the atexit handler read wrong bytes\n");
    std::_Exit(4);
  }
  cudaFree(g_buf);
}

int main() {
  CHECK(cudaMalloc(&g_buf, N * sizeof(int)));
  CHECK(cudaMalloc(&g_holder.p, N * sizeof(int)));
  std::atexit(at_exit);
  fill<<<(N + 255) / 256, 256>>>(g_buf, N, 1);
  fill<<<(N + 255) / 256, 256>>>(g_holder.p, N, 7);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  std::printf("exit_race: done\n");
  std::fflush(stdout);
  // A moment between the last line and exit (as an interpreter's shutdown takes), in
  // which a pause still finds the program running.
  const char* linger = std::getenv("EXIT_RACE_LINGER_US");
  long us = linger ? std::atol(linger) : 3000;
  timespec left = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&left, &left) != 0) {}  // a signal's handler interrupts the sleep

  return 0;
}
