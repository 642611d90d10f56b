// Host transfers (issue 29), on a GPU.
//
//   pin_bench seed malloc|pinned|registered [ROUNDS]   the seed's benchmark: per size (1, 8,
//       32, 128 MiB), 2 hot buffers copied ROUNDS (175) times each way and 25 cold buffers
//       once each way, allocated with malloc, cudaMallocHost, or malloc then cudaHostRegister
//       (before the clock starts); prints "seed SIZE_MIB SECONDS" per size and "seed total
//       SECONDS" (the copies only, each synchronous), every byte checked.
//   pin_bench oneshot MIB [REPS]            one copy each way of a fresh malloc buffer:
//       "oneshot h2d MIB SECONDS" and "oneshot d2h MIB SECONDS"; REPS - 1 more with fresh
//       buffers, printed as "again h2d|d2h MIB SECONDS".
//   pin_bench costs MIB                     cuMemHostRegister / Unregister of a touched malloc
//       buffer and pinned copies each way: "costs register|unregister|pinned_h2d|pinned_d2h
//       MIB SECONDS" (what crates/pin's Costs stand for).
#include "../../programs/common.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum Host { MALLOC, PINNED, REGISTERED };

static unsigned char* host_alloc(size_t n, Host how) {
  void* p = nullptr;
  if (how == PINNED) {
    CHECK(cudaMallocHost(&p, n));
  } else {
    p = std::malloc(n);
  }
  if (!p) std::exit(1);
  std::memset(p, 0x5a, n);
  if (how == REGISTERED) CHECK(cudaHostRegister(p, n, cudaHostRegisterDefault));
  return (unsigned char*)p;
}

static void host_free(void* p, Host how) {
  if (how == PINNED) {
    CHECK(cudaFreeHost(p));
  } else {
    if (how == REGISTERED) CHECK(cudaHostUnregister(p));
    std::free(p);
  }
}

// One H2D then one D2H of `h` through `d`; the bytes that come back are checked (a sample).
static double round_trip(unsigned char* h, unsigned char* d, size_t n, unsigned stamp) {
  for (size_t i = 0; i < n; i += 4096) h[i] = (unsigned char)(stamp + i / 4096);
  double t = now();
  CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
  for (size_t i = 0; i < n; i += 4096) h[i] = 0;
  CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
  t = now() - t;
  for (size_t i = 0; i < n; i += 4096) {
    if (h[i] != (unsigned char)(stamp + i / 4096)) {
      std::fprintf(stderr, "byte %zu came back wrong\n", i);
      std::exit(2);
    }
  }
  return t;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: pin_bench seed malloc|pinned|registered [ROUNDS] | oneshot MIB [REPS] | costs MIB\n");
    return 1;
  }
  CHECK(cudaFree(0));
  std::string what = argv[1];
  if (what == "seed") {
    std::string h = argv[2];
    Host how = h == "pinned" ? PINNED : h == "registered" ? REGISTERED : MALLOC;
    int rounds = argc > 3 ? std::atoi(argv[3]) : 175;
    double total = 0;
    for (size_t mib : {1, 8, 32, 128}) {
      size_t n = mib << 20;
      unsigned char* d = nullptr;
      CHECK(cudaMalloc(&d, n));
      std::vector<unsigned char*> hot, cold;
      for (int i = 0; i < 2; i++) hot.push_back(host_alloc(n, how));
      for (int i = 0; i < 25; i++) cold.push_back(host_alloc(n, how));
      double t = 0;
      unsigned stamp = 1;
      // Hot and cold interleaved, as a program's steps would: each step copies both hot
      // buffers, and one cold buffer once in every few steps.
      size_t next_cold = 0;
      for (int r = 0; r < rounds; r++) {
        for (auto h : hot) t += round_trip(h, d, n, stamp++);
        if (next_cold < cold.size() && r % (rounds / 25 > 0 ? rounds / 25 : 1) == 0) {
          t += round_trip(cold[next_cold++], d, n, stamp++);
        }
      }
      while (next_cold < cold.size()) t += round_trip(cold[next_cold++], d, n, stamp++);
      std::printf("seed %zu %.6f\n", mib, t);
      total += t;
      for (auto h : hot) host_free(h, how);
      for (auto h : cold) host_free(h, how);
      CHECK(cudaFree(d));
    }
    std::printf("seed total %.6f\n", total);
  } else if (what == "oneshot") {
    size_t n = (size_t)std::atoll(argv[2]) << 20;
    unsigned char* d = nullptr;
    CHECK(cudaMalloc(&d, n));
    int reps = argc > 3 ? std::atoi(argv[3]) : 1;
    for (int r = 0; r < reps; r++) {
      // A fresh buffer each time: nothing learnt from the last copy applies.
      unsigned char* h = host_alloc(n, MALLOC);
      double t = now();
      CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
      std::printf("%s h2d %zu %.6f\n", r == 0 ? "oneshot" : "again", n >> 20, now() - t);
      t = now();
      CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
      std::printf("%s d2h %zu %.6f\n", r == 0 ? "oneshot" : "again", n >> 20, now() - t);
      for (size_t i = 0; i < n; i += 4096) {
        if (h[i] != 0x5a) return 2;
      }
      host_free(h, MALLOC);
    }
    CHECK(cudaFree(d));
  } else if (what == "costs") {
    size_t n = (size_t)std::atoll(argv[2]) << 20;
    unsigned char* h = host_alloc(n, MALLOC);
    unsigned char* d = nullptr;
    CHECK(cudaMalloc(&d, n));
    double t = now();
    CHECK(cudaHostRegister(h, n, cudaHostRegisterPortable));
    std::printf("costs register %zu %.6f\n", n >> 20, now() - t);
    t = now();
    CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    std::printf("costs pinned_h2d %zu %.6f\n", n >> 20, now() - t);
    t = now();
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    std::printf("costs pinned_d2h %zu %.6f\n", n >> 20, now() - t);
    t = now();
    CHECK(cudaHostUnregister(h));
    std::printf("costs unregister %zu %.6f\n", n >> 20, now() - t);
    host_free(h, MALLOC);
    CHECK(cudaFree(d));
  } else {
    return 1;
  }
  return 0;
}
