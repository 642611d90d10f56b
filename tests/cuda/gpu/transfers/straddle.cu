// What the driver accepts for a copy whose host side is partly page-locked (issue 29):
// run natively on a GPU, `nvcc -cudart shared -o straddle straddle.cu && ./straddle`.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <sys/mman.h>
static void t(const char* what, cudaError_t e) { printf("%-60s %s\n", what, cudaGetErrorString(e)); cudaGetLastError(); }
int main() {
  size_t M = 1 << 20;
  char* d; cudaMalloc(&d, 64 * M);
  char* h = (char*)mmap(nullptr, 64 * M, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(h, 1, 64 * M);
  t("register [h+8M, h+16M)", cudaHostRegister(h + 8 * M, 8 * M, 0));
  t("h2d inside [h+8M, +8M)", cudaMemcpy(d, h + 8 * M, 8 * M, cudaMemcpyHostToDevice));
  t("h2d starts inside, runs past end [h+12M, +8M)", cudaMemcpy(d, h + 12 * M, 8 * M, cudaMemcpyHostToDevice));
  t("d2h starts inside, runs past end [h+12M, +8M)", cudaMemcpy(h + 12 * M, d, 8 * M, cudaMemcpyDeviceToHost));
  t("h2d starts before, ends inside [h+4M, +8M)", cudaMemcpy(d, h + 4 * M, 8 * M, cudaMemcpyHostToDevice));
  t("h2d covers it [h+4M, +16M)", cudaMemcpy(d, h + 4 * M, 16 * M, cudaMemcpyHostToDevice));
  t("async h2d starts inside, runs past [h+12M,+8M)", cudaMemcpyAsync(d, h + 12 * M, 8 * M, cudaMemcpyHostToDevice, 0));
  t("sync", cudaDeviceSynchronize());
  t("register [h+16M, h+24M) adjacent", cudaHostRegister(h + 16 * M, 8 * M, 0));
  t("h2d across two adjacent registrations [h+12M,+8M)", cudaMemcpy(d, h + 12 * M, 8 * M, cudaMemcpyHostToDevice));
  t("register [h+24M+16, +4096) unaligned", cudaHostRegister(h + 24 * M + 16, 4096, 0));
  t("register [h+32M+16, +8M) unaligned start", cudaHostRegister(h + 32 * M + 16, 8 * M, 0));
  t("h2d [h+32M+16, +8M) exact", cudaMemcpy(d, h + 32 * M + 16, 8 * M, cudaMemcpyHostToDevice));
  t("h2d [h+32M, +8M) from page start", cudaMemcpy(d, h + 32 * M, 8 * M, cudaMemcpyHostToDevice));
  t("h2d [h+32M+16, +8M+4000) to end of last page", cudaMemcpy(d, h + 32 * M + 16, 8 * M + 4000, cudaMemcpyHostToDevice));
  t("h2d [h+32M+16, +8M+5000) past last page", cudaMemcpy(d, h + 32 * M + 16, 8 * M + 5000, cudaMemcpyHostToDevice));
  return 0;
}
