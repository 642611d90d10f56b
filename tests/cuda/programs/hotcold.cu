// Known hot and cold buffers for the memory history: 2 hot buffers copied in and out 175
// times each (and given to add_into each round), 25 cold buffers copied in once (and given
// to fill once). With the argument `wait` it prints `ready`, then waits for a line on
// standard input before freeing everything (so a test can read its stats and timeline).
// Calls it makes: cudaMalloc 27, cudaMemcpy 25 + 4 * 175 = 725, launches 25 + 175 = 200
// (each checked with cudaGetLastError), cudaFree 27.
#include "common.h"
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
int main(int argc, char** argv) {
  const int hot_n = 4096, cold_n = 1024, cold_count = 25, rounds = 175;
  int *hot[2], *cold[cold_count];
  for (int h = 0; h < 2; h++) CHECK(cudaMalloc(&hot[h], hot_n * sizeof(int)));
  for (int c = 0; c < cold_count; c++) CHECK(cudaMalloc(&cold[c], cold_n * sizeof(int)));
  std::vector<int> host(cold_n, 7);
  for (int c = 0; c < cold_count; c++) {
    CHECK(cudaMemcpy(cold[c], host.data(), cold_n * sizeof(int), cudaMemcpyHostToDevice));
    fill<<<(cold_n + 255) / 256, 256>>>(cold[c], cold_n, c);
    CHECK_LAUNCH();
  }
  std::vector<int> a(hot_n), b(hot_n), back_a(hot_n), back_b(hot_n);
  long long sum = 0;
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < hot_n; i++) { a[i] = i + r; b[i] = 3 * i - r; }
    CHECK(cudaMemcpy(hot[0], a.data(), hot_n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(hot[1], b.data(), hot_n * sizeof(int), cudaMemcpyHostToDevice));
    add_into<<<(hot_n + 255) / 256, 256>>>(hot[0], hot[1], hot_n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(back_a.data(), hot[0], hot_n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(back_b.data(), hot[1], hot_n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < hot_n; i++) {
      EXPECT(back_a[i] == a[i]);
      EXPECT(back_b[i] == a[i] + b[i]);
      sum += back_b[i];
    }
  }
  if (argc > 1 && std::strcmp(argv[1], "wait") == 0) {
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    if (!std::fgets(line, sizeof line, stdin)) { /* end of input: go on */ }
  }
  for (int h = 0; h < 2; h++) CHECK(cudaFree(hot[h]));
  for (int c = 0; c < cold_count; c++) CHECK(cudaFree(cold[c]));
  std::printf("hotcold hot=2 cold=%d rounds=%d sum=%lld\n", cold_count, rounds, sum);
  return 0;
}
