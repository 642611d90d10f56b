// Smart pinning (CUDAW_PIN) and the driver API's own copies: heap buffers the runtime's
// copies made hot (cudaw page-locks them), then copied through cuMemcpy* as a library
// calling the driver directly would, as the pageable memory they are to the program:
//   - synchronously and asynchronously, from the last page of one into its neighbour's
//     bytes (the copy starts inside cudaw's registration and runs past it, which the
//     driver refuses as such);
//   - synchronously, from a pageable neighbour's tail across two hot buffers into the
//     next pageable neighbour (four borders);
//   - asynchronously to the device, the source overwritten as soon as the call returns;
//   - asynchronously to the host, the bytes read as soon as the call returns;
//   - in 2D (cuMemcpy2D*, which cannot be cut), rows across the end of one.
// Every byte is checked. Standard output is the same natively and under cudaw; standard
// error has "pin_driver_copy: TYPE x N" and "... TYPE y N" (cudaPointerGetAttributes'
// type of the hot buffers: 1 once cudaw pinned them).
#include "common.h"
#include <cuda.h>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <initializer_list>
#include <malloc.h>

static const size_t N = 4u << 20;  // 16 MiB of int
static const size_t BYTES = N * sizeof(int);
static const size_t EDGE = 8192;  // the copy across the end of x

static int value(size_t i, int round) { return (int)(unsigned)(i * 2654435761u) ^ round; }

typedef int (*htod_t)(unsigned long long, const void*, size_t);
typedef int (*dtoh_t)(void*, unsigned long long, size_t);
typedef int (*htod_async_t)(unsigned long long, const void*, size_t, cudaStream_t);
typedef int (*dtoh_async_t)(void*, unsigned long long, size_t, cudaStream_t);
typedef int (*sync_t)(cudaStream_t);
typedef int (*alloc_t)(unsigned long long*, size_t);
typedef int (*free_t)(unsigned long long);
typedef int (*copy2d_t)(const CUDA_MEMCPY2D*);
typedef int (*copy2d_async_t)(const CUDA_MEMCPY2D*, cudaStream_t);

// A 2D copy of `rows` rows of 4096 bytes between host memory at `h` (rows 8192 apart) and
// device memory at `d` (rows 4096 apart), to the device or back.
static CUDA_MEMCPY2D rows_2d(char* h, unsigned long long d, int rows, bool to_device) {
  CUDA_MEMCPY2D c;
  std::memset(&c, 0, sizeof c);
  c.WidthInBytes = 4096;
  c.Height = rows;
  c.srcMemoryType = to_device ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  c.dstMemoryType = to_device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  c.srcPitch = to_device ? 8192 : 4096;
  c.dstPitch = to_device ? 4096 : 8192;
  if (to_device) {
    c.srcHost = h;
    c.dstDevice = d;
  } else {
    c.srcDevice = d;
    c.dstHost = h;
  }
  return c;
}

int main() {
  // libcuda.so.1 is cudaw's driver layer under cudaw, as for any library calling it.
  void* cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  EXPECT(cu != nullptr);
  htod_t htod = (htod_t)dlsym(cu, "cuMemcpyHtoD_v2");
  dtoh_t dtoh = (dtoh_t)dlsym(cu, "cuMemcpyDtoH_v2");
  htod_async_t htod_async = (htod_async_t)dlsym(cu, "cuMemcpyHtoDAsync_v2");
  dtoh_async_t dtoh_async = (dtoh_async_t)dlsym(cu, "cuMemcpyDtoHAsync_v2");
  sync_t stream_sync = (sync_t)dlsym(cu, "cuStreamSynchronize");
  alloc_t mem_alloc = (alloc_t)dlsym(cu, "cuMemAlloc_v2");
  free_t mem_free = (free_t)dlsym(cu, "cuMemFree_v2");
  copy2d_t copy2d = (copy2d_t)dlsym(cu, "cuMemcpy2D_v2");
  copy2d_async_t copy2d_async = (copy2d_async_t)dlsym(cu, "cuMemcpy2DAsync_v2");
  EXPECT(htod && dtoh && htod_async && dtoh_async && stream_sync && mem_alloc && mem_free);
  EXPECT(copy2d && copy2d_async);

  // Device memory from the driver, valid for its copies whatever cudaw's addressing (in
  // mapped addressing cudaw's, so that the runtime's copies of x count for pinning).
  int* scratch = nullptr;  // the runtime's own allocation, beside the driver's
  CHECK(cudaMalloc(&scratch, 4096));
  unsigned long long dp = 0;
  EXPECT(mem_alloc(&dp, 3 * BYTES) == 0);
  int* d = (int*)dp;
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Four heap neighbours carved from one block, 16 bytes apart as glibc puts them: x and
  // y are copied often (hot), w and z never.
  EXPECT(mallopt(M_MMAP_THRESHOLD, 256 << 20) == 1);
  char* block = (char*)std::malloc(4 * (BYTES + 16));
  EXPECT(block != nullptr);
  char* w = block;
  int* x = (int*)(w + BYTES + 16);
  int* y = (int*)((char*)x + BYTES + 16);
  char* z = (char*)y + BYTES + 16;
  for (int r = 0; r < 20; r++) {
    for (int* h : {x, y}) {
      for (size_t i = 0; i < N; i++) h[i] = value(i, r);
      CHECK(cudaMemcpy(d, h, BYTES, cudaMemcpyHostToDevice));
      std::memset(h, 0, BYTES);
      CHECK(cudaMemcpy(h, d, BYTES, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < N; i++) EXPECT(h[i] == value(i, r));
    }
  }
  std::printf("pin_driver_copy: x and y copied 20 times each way\n");
  std::fprintf(stderr, "pin_driver_copy: TYPE x %d\n", pointer_type(x));
  std::fprintf(stderr, "pin_driver_copy: TYPE y %d\n", pointer_type((char*)y + 4096));

  // Across the end of x, synchronously and asynchronously (the source overwritten, the
  // result read, as soon as each call returns), to the device and back.
  char* edge = (char*)x + BYTES - EDGE / 2;
  unsigned char* was = (unsigned char*)std::malloc(EDGE);
  for (int a = 0; a < 2; a++) {
    for (size_t i = 0; i < EDGE; i++) edge[i] = (char)(i * 7 + 3 + a);
    std::memcpy(was, edge, EDGE);
    EXPECT((a ? htod_async(dp, edge, EDGE, stream) : htod(dp, edge, EDGE)) == 0);
    std::memset(edge, 0xee, EDGE);
    if (a) EXPECT(stream_sync(stream) == 0);
    EXPECT((a ? dtoh_async(edge, dp, EDGE, stream) : dtoh(edge, dp, EDGE)) == 0);
    EXPECT(std::memcmp(edge, was, EDGE) == 0);
  }
  std::printf("pin_driver_copy: copies across the end of x exact, synchronous and not\n");

  // From w's last page through x and y into z's first page: four borders.
  char* from = w + BYTES - 4096;
  size_t span = (size_t)(z + 4096 - from);
  unsigned char* all = (unsigned char*)std::malloc(span);
  for (size_t i = 0; i < span; i++) from[i] = (char)(i * 13 + 5);
  std::memcpy(all, from, span);
  EXPECT(htod(dp, from, span) == 0);
  std::memset(from, 0, span);
  EXPECT(dtoh(from, dp, span) == 0);
  EXPECT(std::memcmp(from, all, span) == 0);
  std::free(all);
  std::printf("pin_driver_copy: a copy across two hot buffers and their neighbours exact\n");

  // Asynchronous to the device: the source may be overwritten once the call returns.
  for (int r = 0; r < 4; r++) {
    for (size_t i = 0; i < N; i++) x[i] = value(i, 100 + r);
    EXPECT(htod_async(dp, x, BYTES, stream) == 0);
    std::memset(x, 0xee, BYTES);
    EXPECT(stream_sync(stream) == 0);
    std::memset(x, 0, BYTES);
    CHECK(cudaMemcpy(x, d, BYTES, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < N; i++) EXPECT(x[i] == value(i, 100 + r));
  }
  std::printf("pin_driver_copy: asynchronous copies from x read it before returning\n");

  // Asynchronous to the host: the bytes are there once the call returns.
  for (int r = 0; r < 4; r++) {
    for (size_t i = 0; i < N; i++) x[i] = value(i, 200 + r);
    CHECK(cudaMemcpy(d, x, BYTES, cudaMemcpyHostToDevice));
    std::memset(x, 0, BYTES);
    EXPECT(dtoh_async(x, dp, BYTES, stream) == 0);
    for (size_t i = 0; i < N; i++) EXPECT(x[i] == value(i, 200 + r));
    EXPECT(stream_sync(stream) == 0);
  }
  std::printf("pin_driver_copy: asynchronous copies to x there on return\n");

  // 2D copies across the end of x (two rows 8192 apart, the second past x's end): they
  // cannot be cut; synchronously, then, x hot again, asynchronously (the source
  // overwritten as soon as the call returns).
  char* rows = (char*)x + BYTES - 8192;
  unsigned char* kept = (unsigned char*)std::malloc(2 * 8192);
  for (int a = 0; a < 2; a++) {
    if (a) {
      for (int r = 0; r < 10; r++) {
        CHECK(cudaMemcpy(d, x, BYTES, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(x, d, BYTES, cudaMemcpyDeviceToHost));
      }
      std::fprintf(stderr, "pin_driver_copy: TYPE x-again %d\n", pointer_type(x));
    }
    for (size_t i = 0; i < 2 * 8192; i++) rows[i] = (char)(i * 11 + 1 + a);
    std::memcpy(kept, rows, 2 * 8192);
    CUDA_MEMCPY2D up = rows_2d(rows, dp, 2, true);
    EXPECT((a ? copy2d_async(&up, stream) : copy2d(&up)) == 0);
    std::memset(rows, 0xee, 4096);
    std::memset(rows + 8192, 0xee, 4096);
    if (a) EXPECT(stream_sync(stream) == 0);
    CUDA_MEMCPY2D down = rows_2d(rows, dp, 2, false);
    EXPECT(copy2d(&down) == 0);
    EXPECT(std::memcmp(rows, kept, 4096) == 0);
    EXPECT(std::memcmp(rows + 8192, kept + 8192, 4096) == 0);
  }
  std::free(kept);
  std::printf("pin_driver_copy: 2D copies across the end of x exact, synchronous and not\n");

  std::free(was);
  std::free(block);
  CHECK(cudaStreamDestroy(stream));
  EXPECT(mem_free(dp) == 0);
  CHECK(cudaFree(scratch));
  std::printf("pin_driver_copy: done\n");
  return 0;
}
