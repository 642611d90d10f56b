// Smart pinning's checks (CUDAW_PIN, crates/engine/src/pinning.rs): pageable buffers
// copied round after round, both ways, with a kernel in between, each byte checked; then
// given back in every way a program gives memory back (free, realloc, munmap) and the
// address used again.
//
// Standard output is the same natively and under cudaw, pinned or not. Standard error
// carries one "pin_copy: TYPE ..." line per buffer with cudaPointerGetAttributes' type of
// its first byte (0 unregistered, 1 page-locked): after the rounds (page-locked only where
// cudaw pinned it) and for the memory that came back at the same address (never
// page-locked: it was unpinned before it was given back).
#include "common.h"
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <malloc.h>
#include <sys/mman.h>

static const size_t N = 4u << 20;  // 16 MiB of int
static const size_t BYTES = N * sizeof(int);
static const int FILLED = 4096;  // the kernel's elements (simgpu runs kernels on the CPU)

__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}

static int value(size_t i, int round) { return (int)(unsigned)(i * 2654435761u) ^ round; }
static int expected(size_t i, int round) {
  return i < (size_t)FILLED ? 1000 * round + (int)i : value(i, round);
}

static cudaStream_t stream;

// `rounds` rounds of: fill on the host, copy to the device, overwrite the first FILLED
// elements there, copy back, check every element. Odd rounds copy asynchronously on a
// non-blocking stream and hold pageable memory to its promises: the source is overwritten
// as soon as the copy to the device returns, and the copy back is read as soon as it
// returns (whether or not cudaw has page-locked the buffer meanwhile).
static void rounds(int* h, int* d, int count, const char* what, bool pageable = true) {
  for (int r = 0; r < count; r++) {
    for (size_t i = 0; i < N; i++) h[i] = value(i, r);
    if (r % 2 == 1) {
      CHECK(cudaMemcpyAsync(d, h, BYTES, cudaMemcpyHostToDevice, stream));
      // Page-locked memory the program registered itself promises nothing of the kind.
      if (pageable) std::memset(h, 0xee, BYTES);
      fill<<<FILLED / 256, 256, 0, stream>>>(d, FILLED, 1000 * r);
      CHECK_LAUNCH();
      CHECK(cudaMemcpyAsync(h, d, BYTES, cudaMemcpyDeviceToHost, stream));
      if (!pageable) CHECK(cudaStreamSynchronize(stream));
    } else {
      CHECK(cudaMemcpy(d, h, BYTES, cudaMemcpyHostToDevice));
      fill<<<FILLED / 256, 256>>>(d, FILLED, 1000 * r);
      CHECK_LAUNCH();
      CHECK(cudaMemcpy(h, d, BYTES, cudaMemcpyDeviceToHost));
    }
    for (size_t i = 0; i < N; i++) {
      if (h[i] != expected(i, r)) {
        std::printf("%s, round %d: element %zu is %d, expected %d\n", what, r, i, h[i],
                    expected(i, r));
        std::exit(2);
      }
    }
  }
  std::printf("%s: %d rounds checked\n", what, count);
}

int main() {
  int* d = nullptr;
  CHECK(cudaMalloc(&d, BYTES));
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  int* a = (int*)std::malloc(BYTES);
  rounds(a, d, 20, "malloc");
  std::fprintf(stderr, "pin_copy: TYPE malloc-after-rounds %d\n", pointer_type(a));
  // A small asynchronous copy back (below the staged copies' 1 MiB) into the buffer
  // cudaw pinned: the runtime copies it, and pageable memory's promise holds (the result
  // is there when the call returns), page-locked or not.
  const size_t SMALL = 64u << 10;
  std::memset(a, 0, SMALL);
  CHECK(cudaMemcpyAsync(a, d, SMALL, cudaMemcpyDeviceToHost, stream));
  for (size_t i = 0; i < SMALL / sizeof(int); i++) EXPECT(a[i] == expected(i, 19));
  std::printf("malloc: a small asynchronous copy back is there on return\n");
  CHECK(cudaStreamSynchronize(stream));
  std::free(a);
  int* b = (int*)std::malloc(BYTES);
  std::fprintf(stderr, "pin_copy: TYPE malloc-again %d\n", pointer_type(b));
  rounds(b, d, 2, "malloc again");
  std::free(b);

  void* m = mmap(nullptr, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(m != MAP_FAILED);
  rounds((int*)m, d, 20, "mmap");
  std::fprintf(stderr, "pin_copy: TYPE mmap-after-rounds %d\n", pointer_type(m));
  EXPECT(munmap(m, BYTES) == 0);
  void* m2 = mmap(m, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(m2 != MAP_FAILED);
  std::fprintf(stderr, "pin_copy: TYPE mmap-again %d\n", pointer_type(m2));
  rounds((int*)m2, d, 2, "mmap again");
  EXPECT(munmap(m2, BYTES) == 0);

  int* r = (int*)std::malloc(BYTES);
  rounds(r, d, 20, "realloc before");
  std::fprintf(stderr, "pin_copy: TYPE realloc-before %d\n", pointer_type(r));
  int* r2 = (int*)std::realloc(r, 2 * BYTES);
  EXPECT(r2 != nullptr);
  std::fprintf(stderr, "pin_copy: TYPE realloc-after %d\n", pointer_type(r2));
  rounds(r2, d, 2, "realloc after");
  std::free(r2);

  // A buffer cudaw may have pinned, page-locked by the program itself: that must work as
  // natively (cudaw unpins first), and so must the copies and the unregistering after.
  int* g = (int*)std::malloc(BYTES);
  rounds(g, d, 20, "before cudaHostRegister");
  CHECK(cudaHostRegister(g, BYTES, cudaHostRegisterDefault));
  std::fprintf(stderr, "pin_copy: TYPE program-registered %d\n", pointer_type(g));
  rounds(g, d, 2, "registered by the program", false);
  CHECK(cudaHostUnregister(g));
  std::free(g);

  // The same through the driver API, as a library calling the driver directly would
  // (libcuda.so.1 is cudaw's driver layer under cudaw).
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  EXPECT(cu != nullptr);
  typedef int (*register_t)(void*, size_t, unsigned);
  typedef int (*unregister_t)(void*);
  register_t cu_register = (register_t)dlsym(cu, "cuMemHostRegister_v2");
  unregister_t cu_unregister = (unregister_t)dlsym(cu, "cuMemHostUnregister");
  EXPECT(cu_register != nullptr && cu_unregister != nullptr);
  int* q = (int*)std::malloc(BYTES);
  rounds(q, d, 20, "before cuMemHostRegister");
  EXPECT(cu_register(q, BYTES, 0) == 0);
  std::fprintf(stderr, "pin_copy: TYPE driver-registered %d\n", pointer_type(q));
  rounds(q, d, 2, "registered through the driver", false);
  EXPECT(cu_unregister(q) == 0);
  std::free(q);

  // Two heap buffers side by side, 16 bytes apart as glibc puts blocks below its mmap
  // threshold (the last page of one the first of the other), copied in turn as a step
  // copies two buffers: both are pinned, their shared page once. Carved from one block:
  // two mallocs land side by side only when nothing allocates between them, which
  // cudaw's own threads may do.
  EXPECT(mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1);
  char* both = (char*)std::malloc(2 * BYTES + 16);
  EXPECT(both != nullptr);
  int* x = (int*)both;
  int* y = (int*)(both + BYTES + 16);
  std::fprintf(stderr, "pin_copy: heap neighbours %ld bytes apart\n",
               (long)((char*)y - ((char*)x + BYTES)));
  for (int k = 0; k < 10; k++) {
    rounds(x, d, 2, "heap x");
    rounds(y, d, 2, "heap y");
  }
  std::fprintf(stderr, "pin_copy: TYPE heap-x %d\n", pointer_type(x));
  std::fprintf(stderr, "pin_copy: TYPE heap-y %d\n", pointer_type((char*)y + BYTES - 1));
  // A 2D copy of y, whose first page lies in x's registration: cudaw does not cut 2D
  // copies, so it unpins what the copy crosses first (the driver refuses a copy that
  // starts inside a registration and runs past it).
  const size_t W = 4096;
  for (size_t i = 0; i < N; i++) y[i] = value(i, 7);
  CHECK(cudaMemcpy2D(d, W, y, W, W, BYTES / W, cudaMemcpyHostToDevice));
  std::memset(y, 0, BYTES);
  CHECK(cudaMemcpy2D(y, W, d, W, W, BYTES / W, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < N; i++) EXPECT(y[i] == value(i, 7));
  std::printf("pin_copy: 2D copies of heap y exact\n");
  std::free(both);

  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(d));
  std::printf("pin_copy: done\n");
  return 0;
}
