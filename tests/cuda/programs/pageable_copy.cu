// Copies between device memory and pageable host memory (malloc) of several sizes, below
// and above cudaw's staged-copy threshold (CUDAW_STAGED_COPY_MIN, default 1 MiB), at odd
// sizes and offsets, in both directions: asynchronous on a non-blocking stream with
// kernels before (a slow one first) and after on the same stream, synchronous on the
// legacy stream after a blocking stream's kernels, and with cudaMemcpyDefault; page-locked
// buffers too. Every byte is checked on the CPU as soon as CUDA promises it: a copy to
// pageable memory is complete when it returns (async too), and the source of a copy from
// pageable memory may be overwritten as soon as it returns (it is, at once).
//
// Argument 1: rounds (default 1; every round does the same and is checked). Prints
// "pageable_copy: ready" once its memory is allocated, then one checksum line (of the first
// round; every round must match it): the same natively, under cudaw with staged copies and
// without, whatever the rounds.
#include "common.h"
#include "spin.h"
#include <cstdint>
#include <cstring>
#include <vector>

__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}
__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}

static unsigned char pat(size_t i, unsigned seed) {
  return (unsigned char)(((uint64_t)i * 2654435761u + seed * 40503u + (i >> 9)) >> 7);
}
static void mix_cpu(std::vector<unsigned>& x, int base, unsigned k) {
  for (size_t i = 0; i < x.size(); i++) x[i] = x[i] * 1664525u + (unsigned)(base + (int)i) + k;
}

struct Hash {
  uint64_t h = 1469598103934665603ull;
  uint64_t bytes = 0;
  void add(const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    bytes += n;
  }
};

// `got` must equal the model's bytes [off, off + len).
static void expect_bytes(const unsigned char* got, const std::vector<unsigned>& model, size_t off,
                         size_t len, const char* what, size_t len_case) {
  const unsigned char* m = (const unsigned char*)model.data() + off;
  if (std::memcmp(got, m, len) != 0) {
    size_t i = 0;
    while (got[i] == m[i]) i++;
    std::fprintf(stderr, "%s (%zu bytes): byte %zu is %u, expected %u\n", what, len_case, i,
                 got[i], m[i]);
    std::exit(2);
  }
}

struct Case {
  size_t len, doff, hoff;
};

static const Case cases[] = {
    {1000, 0, 0},          {65536 + 3, 1, 5},       {(1 << 20) - 1, 3, 1},
    {1 << 20, 0, 0},       {(1 << 20) + 5, 2, 3},   {(3 << 20) + 1, 7, 6},
    {(9 << 20) + 7, 5, 2},
};
static const int ncases = sizeof(cases) / sizeof(cases[0]);

// One case: returns nothing, adds what it checked to `hash`.
static void run_case(int c, unsigned* x, unsigned* y, cudaStream_t st, cudaStream_t sb,
                     Hash& hash) {
  const Case& k = cases[c];
  const int words = (int)((k.doff + k.len + 3) / 4 + 1);
  const size_t wbytes = (size_t)words * 4;
  const int blocks = (words + 255) / 256;
  unsigned char* src = (unsigned char*)std::malloc(k.len + k.hoff);
  unsigned char* dst = (unsigned char*)std::malloc(wbytes + k.hoff);
  EXPECT(src && dst);
  for (size_t i = 0; i < k.len; i++) src[k.hoff + i] = pat(i, c + 1);
  std::vector<unsigned> model(words, 0);

  // 1. Asynchronous, on a non-blocking stream: slow kernel, fill y, copy in, mix, copy out.
  CHECK(cudaMemsetAsync(x, 0, wbytes, st));
  spin<<<1, 1, 0, st>>>(2);
  fill<<<blocks, 256, 0, st>>>((int*)y, words, 100 + c);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync((char*)x + k.doff, src + k.hoff, k.len, cudaMemcpyHostToDevice, st));
  std::memset(src, 0x5A, k.len + k.hoff);  // the source may be reused at once
  for (size_t i = 0; i < k.len; i++) ((unsigned char*)model.data())[k.doff + i] = pat(i, c + 1);
  mix<<<blocks, 256, 0, st>>>(x, y, words, 7u);
  CHECK_LAUNCH();
  mix_cpu(model, 100 + c, 7u);
  CHECK(cudaMemcpyAsync(dst + k.hoff, (char*)x + k.doff, k.len, cudaMemcpyDeviceToHost, st));
  expect_bytes(dst + k.hoff, model, k.doff, k.len, "async copy out", k.len);
  hash.add(dst + k.hoff, k.len);

  // 2. Synchronous on the legacy stream, after a blocking stream's kernels.
  spin<<<1, 1, 0, sb>>>(2);
  fill<<<blocks, 256, 0, sb>>>((int*)x, words, 5000 + c);
  CHECK_LAUNCH();
  for (int i = 0; i < words; i++) model[i] = (unsigned)(5000 + c + i);
  CHECK(cudaMemcpy(dst + k.hoff, (char*)x + k.doff, k.len, cudaMemcpyDeviceToHost));
  expect_bytes(dst + k.hoff, model, k.doff, k.len, "sync copy out", k.len);
  hash.add(dst + k.hoff, k.len);
  for (size_t i = 0; i < k.len; i++) src[k.hoff + i] = pat(i, c + 50);
  CHECK(cudaMemcpy((char*)x + k.doff, src + k.hoff, k.len, cudaMemcpyHostToDevice));
  std::memset(src, 0xA5, k.len + k.hoff);
  for (size_t i = 0; i < k.len; i++) ((unsigned char*)model.data())[k.doff + i] = pat(i, c + 50);
  mix<<<blocks, 256>>>(x, y, words, 9u);
  CHECK_LAUNCH();
  mix_cpu(model, 100 + c, 9u);
  CHECK(cudaMemcpy(dst + k.hoff, x, wbytes, cudaMemcpyDeviceToHost));
  expect_bytes(dst + k.hoff, model, 0, wbytes, "sync copy of the whole buffer", k.len);
  hash.add(dst + k.hoff, wbytes);

  // 3. cudaMemcpyDefault both ways (the runtime tells host from device).
  for (size_t i = 0; i < k.len; i++) src[k.hoff + i] = pat(i, c + 90);
  CHECK(cudaMemcpy((char*)y + k.doff, src + k.hoff, k.len, cudaMemcpyDefault));
  // On a blocking stream: ordered after the legacy stream's copy.
  CHECK(cudaMemcpyAsync(dst, (char*)y + k.doff, k.len, cudaMemcpyDefault, sb));
  for (size_t i = 0; i < k.len; i++) {
    if (dst[i] != pat(i, c + 90)) {
      std::fprintf(stderr, "default copies (%zu bytes): byte %zu differs\n", k.len, i);
      std::exit(2);
    }
  }
  hash.add(dst, k.len);
  std::free(src);
  std::free(dst);
}

// Page-locked buffers (cudaMallocHost, cudaHostRegister): the driver's own path.
static void run_pinned(unsigned* x, cudaStream_t st, Hash& hash) {
  const size_t len = (4 << 20) + 3;
  unsigned char *a, *b;
  CHECK(cudaMallocHost(&a, len));
  b = (unsigned char*)std::malloc(len);
  EXPECT(b);
  CHECK(cudaHostRegister(b, len, cudaHostRegisterDefault));
  for (size_t i = 0; i < len; i++) a[i] = pat(i, 77);
  CHECK(cudaMemcpyAsync(x, a, len, cudaMemcpyHostToDevice, st));
  CHECK(cudaMemcpyAsync(b, x, len, cudaMemcpyDeviceToHost, st));
  CHECK(cudaStreamSynchronize(st));
  EXPECT(std::memcmp(a, b, len) == 0);
  hash.add(b, len);
  CHECK(cudaHostUnregister(b));
  std::free(b);
  CHECK(cudaFreeHost(a));
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 1;
  size_t most = 0;
  for (int c = 0; c < ncases; c++) {
    size_t w = ((cases[c].doff + cases[c].len + 3) / 4 + 1) * 4;
    if (w > most) most = w;
  }
  unsigned *x, *y;
  CHECK(cudaMalloc(&x, most));
  CHECK(cudaMalloc(&y, most));
  cudaStream_t st, sb;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CHECK(cudaStreamCreate(&sb));
  std::printf("pageable_copy: ready\n");
  std::fflush(stdout);
  Hash first;
  for (int r = 0; r < rounds; r++) {
    Hash h;
    for (int c = 0; c < ncases; c++) run_case(c, x, y, st, sb, h);
    run_pinned(x, st, h);
    if (r == 0) first = h;
    EXPECT(h.h == first.h && h.bytes == first.bytes);
  }
  CHECK(cudaStreamDestroy(st));
  CHECK(cudaStreamDestroy(sb));
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  std::printf("pageable_copy cases=%d bytes=%llu hash=%016llx\n", ncases,
              (unsigned long long)first.bytes, (unsigned long long)first.h);
  return 0;
}
