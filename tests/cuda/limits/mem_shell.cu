// A memory shell for the limit tests: reads one command a line on stdin, answers one line
// on stdout. Every way of taking device memory a program has — cudaMalloc, cudaMallocPitch,
// cudaMalloc3D, cudaMallocAsync, cudaMallocManaged, and the driver's cuMemAlloc and
// cuMemCreate reached through cudaGetDriverEntryPointByVersion — and the memory reports
// (cudaMemGetInfo, cudaGetDeviceProperties, cuMemGetInfo, cuDeviceTotalMem).
//
//   pid | info | props | drvinfo | drvtotal | granularity
//   alloc KIND SIZE        KIND: malloc pitch 3d async managed drvalloc create createmap
//   fill KIND SIZE         allocate until refused: "fill KIND count=N err=CODE"
//   race THREADS KIND SIZE threads allocate at once until refused (KIND mix: half cudaMalloc,
//                          half cuMemCreate): "race count=N bad=M" (M: failures not OOM)
//   touch ID | free ID | freeall | quit
//   spin MS                a kernel that runs MS milliseconds, launched and not waited for
//   sync                   cudaDeviceSynchronize: "sync rc=CODE"
//   ipc ID                 cudaIpcGetMemHandle of the block: "ipc rc=CODE"
//   set ID BYTE            cudaMemset of the whole block: "set rc=CODE"
//   check ID BYTE          every byte of the block equals BYTE: "check ok|bad rc=CODE"
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "../programs/spin.h"

typedef CUresult (*CreateFn)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
typedef CUresult (*ReleaseFn)(CUmemGenericAllocationHandle);
typedef CUresult (*ReserveFn)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*AddressFreeFn)(CUdeviceptr, size_t);
typedef CUresult (*MapFn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*UnmapFn)(CUdeviceptr, size_t);
typedef CUresult (*SetAccessFn)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
typedef CUresult (*GranularityFn)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
typedef CUresult (*InfoFn)(size_t*, size_t*);
typedef CUresult (*TotalFn)(size_t*, CUdevice);
typedef CUresult (*AllocFn)(CUdeviceptr*, size_t);
typedef CUresult (*FreeFn)(CUdeviceptr);

template <class F>
static F entry(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || f == nullptr) {
    std::printf("no driver entry point %s (%d)\n", name, (int)e);
    std::exit(3);
  }
  return (F)f;
}

struct Driver {
  CreateFn create = entry<CreateFn>("cuMemCreate");
  ReleaseFn release = entry<ReleaseFn>("cuMemRelease");
  ReserveFn reserve = entry<ReserveFn>("cuMemAddressReserve");
  AddressFreeFn address_free = entry<AddressFreeFn>("cuMemAddressFree");
  MapFn map = entry<MapFn>("cuMemMap");
  UnmapFn unmap = entry<UnmapFn>("cuMemUnmap");
  SetAccessFn set_access = entry<SetAccessFn>("cuMemSetAccess");
  GranularityFn granularity = entry<GranularityFn>("cuMemGetAllocationGranularity");
  InfoFn info = entry<InfoFn>("cuMemGetInfo");
  TotalFn total = entry<TotalFn>("cuDeviceTotalMem");
  AllocFn alloc = entry<AllocFn>("cuMemAlloc");
  FreeFn free = entry<FreeFn>("cuMemFree");
};

enum Kind { MALLOC, ASYNC, MANAGED, DRVALLOC, HANDLE, MAPPED, NONE };
struct Block {
  Kind kind = NONE;
  void* ptr = nullptr;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;
};

static Driver* drv;
static std::mutex mu;
static std::vector<Block> blocks;

static CUmemAllocationProp device_prop() {
  CUmemAllocationProp p;
  std::memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  return p;
}

static int add(Block b) {
  std::lock_guard<std::mutex> g(mu);
  blocks.push_back(b);
  return (int)blocks.size() - 1;
}

// Allocates one block of KIND; returns 0 and the block, or the error code.
static int alloc_one(const std::string& kind, size_t size, Block* out) {
  Block b;
  b.size = size;
  int rc = 0;
  if (kind == "malloc") {
    b.kind = MALLOC;
    rc = cudaMalloc(&b.ptr, size);
  } else if (kind == "pitch") {
    b.kind = MALLOC;
    size_t pitch = 0;
    rc = cudaMallocPitch(&b.ptr, &pitch, size, 1);
  } else if (kind == "3d") {
    b.kind = MALLOC;
    cudaPitchedPtr pp;
    rc = cudaMalloc3D(&pp, make_cudaExtent(size, 1, 1));
    b.ptr = pp.ptr;
  } else if (kind == "async") {
    b.kind = ASYNC;
    rc = cudaMallocAsync(&b.ptr, size, 0);
    if (rc == 0) rc = cudaStreamSynchronize(0);
  } else if (kind == "managed") {
    b.kind = MANAGED;
    rc = cudaMallocManaged(&b.ptr, size, cudaMemAttachGlobal);
  } else if (kind == "drvalloc") {
    b.kind = DRVALLOC;
    CUdeviceptr p = 0;
    rc = drv->alloc(&p, size);
    b.ptr = (void*)p;
  } else if (kind == "create") {
    b.kind = HANDLE;
    CUmemAllocationProp p = device_prop();
    rc = drv->create(&b.handle, size, &p, 0);
  } else if (kind == "createmap") {
    // Create, map, give access, release the handle: the mapping keeps the memory.
    b.kind = MAPPED;
    CUmemAllocationProp p = device_prop();
    rc = drv->create(&b.handle, size, &p, 0);
    if (rc == 0) {
      CUdeviceptr va = 0;
      rc = drv->reserve(&va, size, 0, 0, 0);
      if (rc == 0) rc = drv->map(va, size, 0, b.handle, 0);
      CUmemAccessDesc a;
      a.location = p.location;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if (rc == 0) rc = drv->set_access(va, size, &a, 1);
      if (rc == 0) rc = drv->release(b.handle);
      b.ptr = (void*)va;
    }
  } else {
    std::printf("unknown kind %s\n", kind.c_str());
    std::exit(3);
  }
  if (out) *out = b;
  return rc;
}

static int free_one(Block& b) {
  int rc = 0;
  switch (b.kind) {
    case MALLOC:
    case MANAGED: rc = cudaFree(b.ptr); break;
    case ASYNC:
      rc = cudaFreeAsync(b.ptr, 0);
      if (rc == 0) rc = cudaStreamSynchronize(0);
      break;
    case DRVALLOC: rc = drv->free((CUdeviceptr)b.ptr); break;
    case HANDLE: rc = drv->release(b.handle); break;
    case MAPPED:
      rc = drv->unmap((CUdeviceptr)b.ptr, b.size);
      if (rc == 0) rc = drv->address_free((CUdeviceptr)b.ptr, b.size);
      break;
    case NONE: return 1;
  }
  b.kind = NONE;
  return rc;
}

static size_t parse_size(const std::string& s) { return (size_t)std::stoull(s); }


int main() {
  Driver d;
  drv = &d;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd.empty()) continue;
    if (cmd == "quit") break;
    if (cmd == "pid") {
      std::printf("pid %d\n", (int)getpid());
    } else if (cmd == "info") {
      size_t f = 0, t = 0;
      int rc = cudaMemGetInfo(&f, &t);
      std::printf("info free=%zu total=%zu rc=%d\n", f, t, rc);
    } else if (cmd == "props") {
      cudaDeviceProp p;
      int rc = cudaGetDeviceProperties(&p, 0);
      std::printf("props total=%zu rc=%d\n", p.totalGlobalMem, rc);
    } else if (cmd == "drvinfo") {
      size_t f = 0, t = 0;
      int rc = d.info(&f, &t);
      std::printf("drvinfo free=%zu total=%zu rc=%d\n", f, t, rc);
    } else if (cmd == "drvtotal") {
      size_t t = 0;
      int rc = d.total(&t, 0);
      std::printf("drvtotal total=%zu rc=%d\n", t, rc);
    } else if (cmd == "granularity") {
      size_t g = 0;
      CUmemAllocationProp p = device_prop();
      int rc = d.granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      std::printf("granularity %zu rc=%d\n", g, rc);
    } else if (cmd == "alloc") {
      std::string kind, size;
      in >> kind >> size;
      Block b;
      int rc = alloc_one(kind, parse_size(size), &b);
      if (rc == 0) std::printf("alloc ok %d\n", add(b));
      else std::printf("alloc err %d\n", rc);
    } else if (cmd == "fill") {
      std::string kind, size;
      in >> kind >> size;
      int count = 0, rc = 0;
      for (;;) {
        Block b;
        rc = alloc_one(kind, parse_size(size), &b);
        if (rc != 0) break;
        add(b);
        count++;
      }
      std::printf("fill %s count=%d err=%d\n", kind.c_str(), count, rc);
    } else if (cmd == "race") {
      int threads = 0;
      std::string kind, size;
      in >> threads >> kind >> size;
      std::atomic<int> ready(0), count(0), bad(0);
      std::atomic<bool> go(false);
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
          std::string k = kind == "mix" ? (t % 2 ? "create" : "malloc") : kind;
          cudaSetDevice(0);
          ready++;
          while (!go.load()) {
          }
          for (;;) {
            Block b;
            int rc = alloc_one(k, parse_size(size), &b);
            if (rc != 0) {
              if (rc != 2) bad++;  // cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2
              break;
            }
            add(b);
            count++;
          }
        });
      }
      while (ready.load() < threads) {
      }
      go = true;
      for (auto& th : pool) th.join();
      std::printf("race count=%d bad=%d\n", count.load(), bad.load());
    } else if (cmd == "spin") {
      unsigned ms = 0;
      in >> ms;
      spin<<<1, 1>>>(ms);
      std::printf("spin rc=%d\n", (int)cudaGetLastError());
    } else if (cmd == "ipc") {
      int id;
      in >> id;
      cudaIpcMemHandle_t h;
      std::printf("ipc rc=%d\n", (int)cudaIpcGetMemHandle(&h, blocks.at(id).ptr));
    } else if (cmd == "set") {
      int id, byte;
      in >> id >> byte;
      Block b = blocks.at(id);
      int rc = cudaMemset(b.ptr, byte, b.size);
      if (rc == 0) rc = cudaDeviceSynchronize();
      std::printf("set rc=%d\n", rc);
    } else if (cmd == "check") {
      int id, byte;
      in >> id >> byte;
      Block b = blocks.at(id);
      std::vector<unsigned char> h(b.size, (unsigned char)~byte);
      int rc = cudaMemcpy(h.data(), b.ptr, b.size, cudaMemcpyDeviceToHost);
      bool same = rc == 0;
      for (size_t i = 0; same && i < b.size; i++) same = h[i] == (unsigned char)byte;
      std::printf("check %s rc=%d\n", same ? "ok" : "bad", rc);
    } else if (cmd == "sync") {
      std::printf("sync rc=%d\n", (int)cudaDeviceSynchronize());
    } else if (cmd == "touch") {
      int id;
      in >> id;
      Block b = blocks.at(id);
      std::vector<unsigned char> h(b.size, 0);
      int rc = cudaMemset(b.ptr, 0x5a, b.size);
      if (rc == 0) rc = cudaMemcpy(h.data(), b.ptr, b.size, cudaMemcpyDeviceToHost);
      bool same = rc == 0 && h[0] == 0x5a && h[b.size - 1] == 0x5a;
      std::printf("touch %s rc=%d\n", same ? "ok" : "bad", rc);
    } else if (cmd == "free") {
      int id;
      in >> id;
      int rc = free_one(blocks.at(id));
      std::printf("free %s %d\n", rc == 0 ? "ok" : "err", rc);
    } else if (cmd == "freeall") {
      int n = 0, bad = 0;
      for (auto& b : blocks) {
        if (b.kind == NONE) continue;
        if (free_one(b) == 0) n++;
        else bad++;
      }
      std::printf("freeall %d bad=%d\n", n, bad);
    } else {
      std::printf("unknown command %s\n", cmd.c_str());
      return 3;
    }
    std::fflush(stdout);
  }
  return 0;
}
