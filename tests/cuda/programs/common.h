// Shared by the test programs: check every CUDA call, print results deterministically.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t err_ = (call);                                                        \
    if (err_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #call,  \
                   cudaGetErrorString(err_), (int)err_);                              \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)
#define CHECK_LAUNCH() CHECK(cudaGetLastError())
#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

// cudaPointerGetAttributes' type of `p` (0 unregistered host memory, 1 page-locked, 2
// device, 3 managed), or -1 when the call fails (its error cleared).
static inline int pointer_type(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return (int)a.type;
}
