// One rank of a two-process job that shares device memory the way NCCL's P2P transport
// does: each rank cuMemCreate's a buffer with the POSIX file-descriptor handle type, maps
// it, exports it (cuMemExportToShareableHandle), passes the descriptor to the other rank
// over a Unix socket (SCM_RIGHTS), imports the peer's (cuMemImportFromShareableHandle),
// maps it at an address of its own and gives its own device access to it. Every driver
// function is fetched with cudaGetDriverEntryPointByVersion, as NCCL fetches them.
//
//   ipc_pair RANK SOCKET
//
// RANK is 0 or 1. SOCKET is "fd:N", a connected Unix stream socket the process inherited
// as descriptor N, or a path: rank 0 listens there (the path must not exist), rank 1
// connects (waiting up to 60 s for rank 0). Each rank uses device RANK % (devices it
// sees): device 0 under CUDA_VISIBLE_DEVICES=0 or =1, device RANK when it sees both.
//
// After the set-up it prints
//   memory own=BYTES import=BYTES   (how much cudaMemGetInfo's used memory grew when its
//                                    own buffer was created and mapped, and when the
//                                    peer's was imported and mapped: 0, the bytes count
//                                    against the peer's device)
//   ready rank=R device=D n=N       (N ints per buffer)
// then reads commands on standard input, one a line, so that a harness drives both ranks
// step by step and nothing depends on timing:
//   run K    K more steps; prints "ran S" (S: steps done so far). One step: a kernel
//            fills its own buffer with values of (rank, step); barrier over the socket; a
//            kernel mixes the peer's buffer into a local accumulator (cudaMalloc);
//            barrier. Both ranks must be given the same steps (a rank waits at a barrier
//            for the other).
//   digest   prints "digest rank=R steps=S got=HEX expected=HEX": FNV-1a 64 of the
//            accumulator read back from the device, and of the same computed by the CPU.
//   end      (or end of input) unmaps and releases both buffers, frees the accumulator,
//            prints "done rank=R" and exits 0.
// Any failure is said on standard error and exits non-zero; a peer that goes away makes a
// barrier fail ("peer closed the socket").
#include "common.h"
#include <cuda.h>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <vector>

__global__ void fill(int* v, int n, int base) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = base + i;
}
__global__ void mix(unsigned* x, const unsigned* y, int n, unsigned k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 1664525u + y[i] + k;
}

static int rank_ = -1;

static void die(const char* what) {
  std::fprintf(stderr, "ipc_pair rank %d: %s\n", rank_, what);
  std::exit(1);
}

#define CHECK_CU(call)                                                                      \
  do {                                                                                      \
    CUresult rc_ = (call);                                                                  \
    if (rc_ != CUDA_SUCCESS) {                                                              \
      std::fprintf(stderr, "ipc_pair rank %d: %s failed: %d\n", rank_, #call, (int)rc_); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

template <typename F>
static F driver(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || !p) {
    std::fprintf(stderr, "ipc_pair rank %d: no driver function %s\n", rank_, name);
    std::exit(2);
  }
  return reinterpret_cast<F>(p);
}

// The value rank r's buffer holds at index 0 after step s (index i holds base + i).
static int base_of(int r, int s) { return (int)((unsigned)(r + 1) * 1000003u + (unsigned)s * 7919u); }

static int connect_socket(const char* spec) {
  if (std::strncmp(spec, "fd:", 3) == 0) return std::atoi(spec + 3);
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (std::strlen(spec) >= sizeof addr.sun_path) die("socket path too long");
  std::strcpy(addr.sun_path, spec);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) die("socket() failed");
  if (rank_ == 0) {
    if (bind(s, (sockaddr*)&addr, sizeof addr) != 0) die(std::strerror(errno));
    if (listen(s, 1) != 0) die("listen() failed");
    int c = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) die("accept() failed");
    close(s);
    return c;
  }
  for (int tries = 0; tries < 6000; tries++) {
    if (connect(s, (sockaddr*)&addr, sizeof addr) == 0) return s;
    if (errno != ENOENT && errno != ECONNREFUSED) die(std::strerror(errno));
    timespec ten_ms = {0, 10 * 1000 * 1000};
    nanosleep(&ten_ms, nullptr);
  }
  die("rank 0 did not listen within 60 s");
  return -1;
}

static void send_all(int s, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = send(s, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("peer closed the socket");
    c += w;
    n -= (size_t)w;
  }
}

static void recv_all(int s, void* p, size_t n) {
  char* c = (char*)p;
  while (n > 0) {
    ssize_t r = recv(s, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("peer closed the socket");
    c += r;
    n -= (size_t)r;
  }
}

static void send_fd(int s, int fd) {
  char byte = 'F';
  iovec iov = {&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  if (sendmsg(s, &msg, MSG_NOSIGNAL) != 1) die("sendmsg() of the descriptor failed");
}

static int recv_fd(int s) {
  char byte = 0;
  iovec iov = {&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg;
  std::memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(s, &msg, MSG_CMSG_CLOEXEC) != 1) die("peer closed the socket");
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) die("no descriptor came");
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// Both ranks reach the same point: each sends its tag and checks the peer's.
static void barrier(int s, unsigned tag) {
  send_all(s, &tag, sizeof tag);
  unsigned peer = 0;
  recv_all(s, &peer, sizeof peer);
  if (peer != tag) {
    std::fprintf(stderr, "ipc_pair rank %d: barrier %u met the peer at %u\n", rank_, tag, peer);
    std::exit(1);
  }
}

static size_t used_bytes() {
  size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  return total_b - free_b;
}

static unsigned long long fnv(const std::vector<unsigned>& v) {
  unsigned long long h = 0xcbf29ce484222325ull;
  for (unsigned x : v)
    for (int b = 0; b < 4; b++) {
      h ^= (x >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  return h;
}

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "0") != 0 && std::strcmp(argv[1], "1") != 0)) {
    std::fprintf(stderr, "usage: ipc_pair 0|1 fd:N|SOCKET_PATH\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  rank_ = std::atoi(argv[1]);
  const int peer_rank = 1 - rank_;
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  const int dev = rank_ % devices;
  CHECK(cudaSetDevice(dev));
  CHECK(cudaFree(0));

  auto granularity = driver<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  auto create = driver<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = driver<decltype(&cuMemRelease)>("cuMemRelease");
  auto reserve = driver<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto address_free = driver<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto map = driver<decltype(&cuMemMap)>("cuMemMap");
  auto unmap = driver<decltype(&cuMemUnmap)>("cuMemUnmap");
  auto set_access = driver<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  auto export_handle = driver<decltype(&cuMemExportToShareableHandle)>("cuMemExportToShareableHandle");
  auto import_handle = driver<decltype(&cuMemImportFromShareableHandle)>("cuMemImportFromShareableHandle");
  auto properties = driver<decltype(&cuMemGetAllocationPropertiesFromHandle)>(
      "cuMemGetAllocationPropertiesFromHandle");

  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0;
  CHECK_CU(granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t bytes = ((size_t)(2u << 20) + gran - 1) / gran * gran;
  const int n = (int)(bytes / sizeof(int));
  CUmemAccessDesc access;
  std::memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  int sock = connect_socket(argv[2]);

  // Our buffer.
  size_t used_before = used_bytes();
  CUmemGenericAllocationHandle own;
  CUdeviceptr own_va = 0;
  CHECK_CU(create(&own, bytes, &prop, 0));
  CHECK_CU(reserve(&own_va, bytes, gran, 0, 0));
  CHECK_CU(map(own_va, bytes, 0, own, 0));
  CHECK_CU(set_access(own_va, bytes, &access, 1));
  size_t used_own = used_bytes();

  // Exchange descriptors; each side closes both once the peer's is imported.
  int own_fd = -1;
  CHECK_CU(export_handle(&own_fd, own, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  send_fd(sock, own_fd);
  int peer_fd = recv_fd(sock);
  CUmemGenericAllocationHandle peer;
  CHECK_CU(import_handle(&peer, (void*)(uintptr_t)peer_fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(peer_fd);
  close(own_fd);
  CUmemAllocationProp peer_prop;
  std::memset(&peer_prop, 0, sizeof peer_prop);
  CHECK_CU(properties(&peer_prop, peer));
  EXPECT(peer_prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT(peer_prop.type == CU_MEM_ALLOCATION_TYPE_PINNED);
  CUdeviceptr peer_va = 0;
  CHECK_CU(reserve(&peer_va, bytes, gran, 0, 0));
  CHECK_CU(map(peer_va, bytes, 0, peer, 0));
  CHECK_CU(set_access(peer_va, bytes, &access, 1));
  size_t used_import = used_bytes();
  std::printf("memory own=%zu import=%zu\n", used_own - used_before, used_import - used_own);

  unsigned* acc = nullptr;
  CHECK(cudaMalloc(&acc, bytes));
  CHECK(cudaMemset(acc, 0, bytes));
  CHECK(cudaDeviceSynchronize());
  barrier(sock, 0xffffffffu);
  std::printf("ready rank=%d device=%d n=%d\n", rank_, dev, n);

  std::vector<unsigned> cpu_acc(n, 0);
  int steps = 0;
  const int threads = 256, blocks = (n + threads - 1) / threads;
  auto step = [&](int s) {
    fill<<<blocks, threads>>>((int*)own_va, n, base_of(rank_, s));
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    barrier(sock, 2u * (unsigned)s);
    mix<<<blocks, threads>>>(acc, (const unsigned*)peer_va, n, (unsigned)s);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    barrier(sock, 2u * (unsigned)s + 1);
    const unsigned peer_base = (unsigned)base_of(peer_rank, s);
    for (int i = 0; i < n; i++) cpu_acc[i] = cpu_acc[i] * 1664525u + (peer_base + (unsigned)i) + (unsigned)s;
  };

  char line[128];
  while (std::fgets(line, sizeof line, stdin)) {
    int k = 0;
    if (std::sscanf(line, "run %d", &k) == 1 && k >= 0) {
      for (int i = 0; i < k; i++) step(steps++);
      std::printf("ran %d\n", steps);
    } else if (std::strncmp(line, "digest", 6) == 0) {
      std::vector<unsigned> back(n);
      CHECK(cudaMemcpy(back.data(), acc, bytes, cudaMemcpyDeviceToHost));
      std::printf("digest rank=%d steps=%d got=%016llx expected=%016llx\n", rank_, steps, fnv(back),
                  fnv(cpu_acc));
    } else if (std::strncmp(line, "end", 3) == 0) {
      break;
    } else {
      std::fprintf(stderr, "ipc_pair rank %d: unknown command %s", rank_, line);
      return 3;
    }
  }

  CHECK(cudaDeviceSynchronize());
  CHECK_CU(unmap(peer_va, bytes));
  CHECK_CU(release(peer));
  CHECK_CU(address_free(peer_va, bytes));
  CHECK_CU(unmap(own_va, bytes));
  CHECK_CU(release(own));
  CHECK_CU(address_free(own_va, bytes));
  CHECK(cudaFree(acc));
  close(sock);
  std::printf("done rank=%d\n", rank_);
  return 0;
}
