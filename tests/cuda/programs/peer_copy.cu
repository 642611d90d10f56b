// One process driving two devices with peer access (issue 26): a buffer on device 0 and
// one on device 1 (cudaMalloc), peer access enabled both ways, a kernel on device 1 that
// reads device 0's buffer and adds it into its own, cudaMemcpyPeer of the result back to
// device 0, checked on the CPU; prints a digest of the result.
//
// On a machine with one device both buffers live on device 0 and the copy back is a plain
// device-to-device copy, so the digest is the same on one device or two.
//
// Arguments: `--list` prints each device's name, UUID and memory instead; `--no-peer`
// launches the kernel without enabling peer access and prints the error the
// synchronisation reports (a GPU faults with cudaErrorIllegalAddress).
#include "common.h"
#include <cstdint>
#include <cstring>
#include <vector>
__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}
__global__ void add_into(const int* a, int* acc, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += a[i];
}
static void list_devices() {
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  std::printf("devices: %d\n", count);
  for (int d = 0; d < count; d++) {
    cudaDeviceProp p;
    std::memset(&p, 0, sizeof p);
    CHECK(cudaGetDeviceProperties(&p, d));
    const unsigned char* u = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
    std::printf("device %d: %s uuid=GPU-", d, p.name);
    for (int i = 0; i < 16; i++) {
      std::printf("%02x%s", u[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
    }
    std::printf(" mem=%zu\n", p.totalGlobalMem);
  }
}
int main(int argc, char** argv) {
  const bool list = argc > 1 && std::strcmp(argv[1], "--list") == 0;
  const bool no_peer = argc > 1 && std::strcmp(argv[1], "--no-peer") == 0;
  if (list) {
    list_devices();
    return 0;
  }
  int count = 0;
  CHECK(cudaGetDeviceCount(&count));
  const int d0 = 0, d1 = count > 1 ? 1 : 0;
  std::printf("devices: %d (buffers on %d and %d)\n", count, d0, d1);
  const int n = 1 << 16;
  const size_t bytes = n * sizeof(int);
  const int blocks = (n + 255) / 256;
  int *a0, *b0, *a1;
  CHECK(cudaSetDevice(d0));
  CHECK(cudaMalloc(&a0, bytes));
  CHECK(cudaMalloc(&b0, bytes));
  fill<<<blocks, 256>>>(a0, n, 1000);
  CHECK_LAUNCH();
  // Device 1's kernel below reads a0: nothing orders it after device 0's stream.
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaSetDevice(d1));
  CHECK(cudaMalloc(&a1, bytes));
  fill<<<blocks, 256>>>(a1, n, 7);
  CHECK_LAUNCH();
  if (d1 != d0) {
    int can01 = -1, can10 = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, d0, d1));
    CHECK(cudaDeviceCanAccessPeer(&can10, d1, d0));
    std::printf("can access peer: 0->1 %d, 1->0 %d\n", can01, can10);
    EXPECT(can01 == 1 && can10 == 1);
    if (!no_peer) {
      CHECK(cudaSetDevice(d0));
      CHECK(cudaDeviceEnablePeerAccess(d1, 0));
      CHECK(cudaSetDevice(d1));
      CHECK(cudaDeviceEnablePeerAccess(d0, 0));
      std::printf("peer access enabled both ways\n");
    }
  }
  // The kernel runs on device d1 and reads device d0's buffer.
  CHECK(cudaSetDevice(d1));
  add_into<<<blocks, 256>>>(a0, a1, n);
  CHECK_LAUNCH();
  cudaError_t sync = cudaDeviceSynchronize();
  if (no_peer) {
    std::printf("kernel on device %d reading device %d's memory without peer access: %d %s\n",
                d1, d0, (int)sync, cudaGetErrorName(sync));
    return 0;
  }
  CHECK(sync);
  if (d1 != d0) {
    CHECK(cudaMemcpyPeer(b0, d0, a1, d1, bytes));
  } else {
    CHECK(cudaMemcpy(b0, a1, bytes, cudaMemcpyDeviceToDevice));
  }
  CHECK(cudaSetDevice(d0));
  std::vector<int> h(n);
  CHECK(cudaMemcpy(h.data(), b0, bytes, cudaMemcpyDeviceToHost));
  uint64_t digest = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) {
    EXPECT(h[i] == 1000 + i + 7 + i);
    digest = (digest ^ (uint32_t)h[i]) * 0x100000001b3ull;
  }
  std::printf("peer_copy n=%d digest=%016llx\n", n, (unsigned long long)digest);
  CHECK(cudaFree(a0));
  CHECK(cudaFree(b0));
  CHECK(cudaSetDevice(d1));
  CHECK(cudaFree(a1));
  return 0;
}
