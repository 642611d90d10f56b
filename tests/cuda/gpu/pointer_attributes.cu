// cudaPointerGetAttributes on device (base and interior), pinned host and plain host
// pointers; cudaMemGetInfo sanity; cudaMemset and device-to-device copies.
#include "../programs/common.h"
#include <vector>
int main() {
  char* d; CHECK(cudaMalloc(&d, 1 << 20));
  char* h; CHECK(cudaMallocHost(&h, 4096));
  cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, d));
  EXPECT(a.type == cudaMemoryTypeDevice); EXPECT(a.devicePointer == d);
  CHECK(cudaPointerGetAttributes(&a, d + 12345));
  EXPECT(a.type == cudaMemoryTypeDevice); EXPECT((char*)a.devicePointer == d + 12345);
  CHECK(cudaPointerGetAttributes(&a, h));
  EXPECT(a.type == cudaMemoryTypeHost);
  int local = 0;
  CHECK(cudaPointerGetAttributes(&a, &local));
  EXPECT(a.type == cudaMemoryTypeUnregistered);
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  EXPECT(free_b > 0 && free_b <= total_b);
  char* d2; CHECK(cudaMalloc(&d2, 1 << 20));
  CHECK(cudaMemset(d, 0x5a, 1 << 20));
  CHECK(cudaMemcpy(d2, d, 1 << 20, cudaMemcpyDeviceToDevice));
  std::vector<char> back(1 << 20);
  CHECK(cudaMemcpy(back.data(), d2, 1 << 20, cudaMemcpyDefault));
  for (char c : back) EXPECT(c == 0x5a);
  CHECK(cudaFree(d)); CHECK(cudaFree(d2)); CHECK(cudaFreeHost(h));
  std::printf("pointer_attributes ok total_mib=%s\n", total_b > (1ull << 30) ? ">1GiB" : "small");
  return 0;
}
