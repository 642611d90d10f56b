// Benchmark: what each of cudaw's two layers adds to the host's cost of launching an empty
// kernel, measured in one process. Run under `cudaw run`: the program's cudaLaunchKernel is
// cudaw's runtime and cuLaunchKernel (global scope) cudaw's driver layer; the real runtime
// and driver are found among the loaded objects (dl_iterate_phdr: an object other than
// cudaw's that exports the function) and called through their own pointers. Four paths:
// RT_CUDAW, RT_REAL (cudaLaunchKernel), DRV_CUDAW, DRV_REAL (cuLaunchKernel on the kernel's
// CUfunction). Each of ROUNDS rounds (argv[1], default 400) times BATCH=32 launches into an
// idle stream on every path, in an order that rotates each round, each batch after
// LAUNCH_AB_WARM (default 8) untimed launches of its own path; the medians over rounds
// of the per-round differences are what the layers add. An A/A control, RT_REAL_AGAIN (the
// real runtime's launch from a second call site, right after RT_REAL in the rotation),
// gives null_added_ns: what the method reads where nothing differs. (In the rotation each
// path always follows the same other one; without the warm-up launches, the runtime
// layer, by then one gate test and one jump, read +40 to +160 ns on the H100 host.) Separate processes differ by ~5%
// on a shared GPU host; alternating rounds inside one process cancel that drift. A launch
// through the real runtime still passes cudaw's driver layer (the real libcudart calls the
// driver through the libcuda.so.1 cudaw preloads), so rt_added_ns is the runtime layer
// alone, and the driver layer is measured by itself on the driver path (drv_added_ns).
// The same for one plain forwarded call (cudaPeekAtLastError, 10000 calls a round): what
// cudaw's trampoline adds to every call (call_added_ns). And, to tell apart what the driver
// layer's launch wrapper costs: cuMemsetD8Async (an enqueue like a launch, through the
// in-flight trampoline alone: memset_added_ns) and cuStreamQuery (a plain trampoline:
// query_added_ns), cudaw's against the real driver's, in the same rounds.
// Under CUDAW_TRACE (metrics or timeline) it also times cudaw's launches and calls with
// tracing switched on and off in alternating rounds (cudaw_trace_active_v1), each batch
// after LAUNCH_AB_WARM untimed launches of its path: what tracing adds, on its own line
// before the last ("launch_ab traced ... trace_rt_added_ns=..").
// Natively there is no second runtime to compare with: prints "launch_ab skipped: ..".
#include "../programs/common.h"
#include "../programs/spin.h"
#include <algorithm>
#include <chrono>
#include <cstring>
#include <dlfcn.h>
#include <link.h>
#include <vector>
typedef int CUresult;
typedef CUresult (*CuLaunch)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, cudaStream_t, void**, void**);
typedef cudaError_t (*RtLaunch)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
typedef cudaError_t (*RtPeek)();
typedef CUresult (*CuMemset)(unsigned long long, unsigned char, size_t, cudaStream_t);
typedef CUresult (*CuQuery)(cudaStream_t);
__global__ void empty() {}
// LAUNCH_AB_BUSY=1: each timed batch is queued behind spin(1) (1 ms on the global timer),
// so every launch finds the stream busy: the host's cost alone, whatever the GPU's pace.
struct Find { const char* sym; void* skip_base; void* found; };
// The first loaded object, other than the one at skip_base, whose handle yields `sym`
// defined outside cudaw's object.
static int find_cb(dl_phdr_info* info, size_t, void* arg) {
  Find* f = (Find*)arg;
  if (!info->dlpi_name || !*info->dlpi_name) return 0;
  void* h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  void* p = dlsym(h, f->sym);
  Dl_info di;
  if (p && dladdr(p, &di) && di.dli_fbase != f->skip_base) f->found = p;
  dlclose(h);
  return f->found != nullptr;
}
static void* real_of(const char* sym, void* ours, const char** ours_path) {
  Dl_info di;
  if (!ours || !dladdr(ours, &di)) return nullptr;
  *ours_path = di.dli_fname;
  Find f = {sym, di.dli_fbase, nullptr};
  dl_iterate_phdr(find_cb, &f);
  return f.found;
}
static void skip(const char* why) { std::printf("launch_ab skipped: %s\n", why); std::exit(0); }
static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 400;
  if (rounds < 1) { std::fprintf(stderr, "usage: launch_ab [ROUNDS >= 1]\n"); return 2; }
  const int batch = 32;
  // LAUNCH_AB_WARM: untimed launches before each timed batch (default 8; 0 as before).
  const char* warm_env = getenv("LAUNCH_AB_WARM");
  const int warm = warm_env ? atoi(warm_env) : 8;
  const char* busy_env = getenv("LAUNCH_AB_BUSY");
  const bool busy = busy_env && atoi(busy_env) > 0;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "launch_ab: no device: %s\n", cudaGetErrorString(e));
    skip("no CUDA device");
  }
  RtLaunch rt_cudaw = (RtLaunch)dlsym(RTLD_DEFAULT, "cudaLaunchKernel");
  CuLaunch drv_cudaw = (CuLaunch)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
  const char *rt_path = "?", *drv_path = "?";
  RtLaunch rt_real = (RtLaunch)real_of("cudaLaunchKernel", (void*)rt_cudaw, &rt_path);
  // The same function through a pointer of its own (the A/A control's call site).
  volatile RtLaunch rt_real_again_v = rt_real;
  RtLaunch rt_real_again = rt_real_again_v;
  CuLaunch drv_real = (CuLaunch)real_of("cuLaunchKernel", (void*)drv_cudaw, &drv_path);
  if (!rt_real) skip("no second runtime exporting cudaLaunchKernel (not run under cudaw?)");
  if (!drv_real) skip("no second driver exporting cuLaunchKernel (no cudaw driver layer?)");
  RtPeek peek_cudaw = (RtPeek)dlsym(RTLD_DEFAULT, "cudaPeekAtLastError");
  RtPeek peek_real = (RtPeek)real_of("cudaPeekAtLastError", (void*)peek_cudaw, &rt_path);
  if (!peek_real) skip("no second runtime exporting cudaPeekAtLastError");
  Dl_info a, b;
  dladdr((void*)rt_real, &a);
  dladdr((void*)drv_real, &b);
  std::fprintf(stderr, "launch_ab: runtime %s over %s; driver %s over %s\n", rt_path,
               a.dli_fname, drv_path, b.dli_fname);
  cudaStream_t s; CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaFunction_t fn = nullptr;
  e = cudaGetFuncBySymbol(&fn, (const void*)empty);
  bool drv = e == cudaSuccess;
  if (!drv) {
    std::fprintf(stderr, "launch_ab: cudaGetFuncBySymbol failed (%s): no driver pair\n",
                 cudaGetErrorString(e));
    cudaGetLastError();
  }
  // The attribution pairs (driver path only).
  CuMemset set_cudaw = (CuMemset)dlsym(RTLD_DEFAULT, "cuMemsetD8Async");
  CuQuery query_cudaw = (CuQuery)dlsym(RTLD_DEFAULT, "cuStreamQuery");
  const char* ignored;
  CuMemset set_real = (CuMemset)real_of("cuMemsetD8Async", (void*)set_cudaw, &ignored);
  CuQuery query_real = (CuQuery)real_of("cuStreamQuery", (void*)query_cudaw, &ignored);
  bool extra = set_real && query_real;
  unsigned* buf = nullptr;
  if (extra) CHECK(cudaMalloc(&buf, 4096));
  void* noargs[1] = {nullptr};  // no parameters; non-null as nvcc passes it (simgpu wants it)
  // Path p, one launch; exits on a failure.
  auto launch = [&](int p) {
    dim3 one(1);
    int r;
    switch (p) {
      case 0: r = rt_cudaw((const void*)empty, one, one, noargs, 0, s); break;
      case 1: r = rt_real((const void*)empty, one, one, noargs, 0, s); break;
      case 2: r = drv_cudaw(fn, 1, 1, 1, 1, 1, 1, 0, s, noargs, nullptr); break;
      case 3: r = drv_real(fn, 1, 1, 1, 1, 1, 1, 0, s, noargs, nullptr); break;
      case 4: r = set_cudaw((unsigned long long)buf, 7, 1024, s); break;
      case 5: r = set_real((unsigned long long)buf, 7, 1024, s); break;
      // Not ready (600) is an answer, not a failure.
      case 6: r = query_cudaw(s); if (r == 600) r = 0; break;
      case 7: r = query_real(s); if (r == 600) r = 0; break;
      // The A/A control: the real runtime's launch again, from another call site.
      default: r = rt_real_again((const void*)empty, one, one, noargs, 0, s); break;
    }
    if (r) {
      static const char* names[] = {"RT_CUDAW", "RT_REAL",    "DRV_CUDAW",  "DRV_REAL",
                                    "SET_CUDAW", "SET_REAL",   "QUERY_CUDAW", "QUERY_REAL",
                                    "RT_REAL_AGAIN"};
      std::fprintf(stderr, "launch_ab: %s launch failed: %d%s%s\n", names[p], r,
                   p < 2 ? " " : "", p < 2 ? cudaGetErrorString((cudaError_t)r) : "");
      std::exit(1);
    }
  };
  // RT_REAL_AGAIN right after RT_REAL: what the method reads between two identical paths.
  std::vector<int> active = {0, 1, 8};
  if (drv) active.insert(active.end(), {2, 3});
  if (extra) active.insert(active.end(), {4, 5, 6, 7});
  int paths = (int)active.size();
  for (int i = 0; i < 1000; i++) launch(active[i % paths]);
  CHECK(cudaStreamSynchronize(s));
  std::vector<double> t[9];
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < paths; k++) {
      int p = active[(r + k) % paths];
      // Untimed launches of the same path first: in the rotation each path always follows
      // the same other one (cudaw's launch after the real cuStreamQuery, the real launch
      // after cudaw's), so without them the first launches of a batch pay for warming
      // the caches and predictors to this path, and always on the same side of a pair.
      for (int i = 0; i < warm; i++) launch(p);
      CHECK(cudaStreamSynchronize(s));
      if (busy) spin<<<1, 1, 0, s>>>(1);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < batch; i++) launch(p);
      auto t1 = std::chrono::steady_clock::now();
      t[p].push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / batch);
    }
  }
  CHECK(cudaStreamSynchronize(s));
  CHECK_LAUNCH();
  std::vector<double> rt_d, drv_d, set_d, query_d, null_d;
  for (int r = 0; r < rounds; r++) {
    rt_d.push_back(t[0][r] - t[1][r]);
    null_d.push_back(t[8][r] - t[1][r]);
    if (drv) drv_d.push_back(t[2][r] - t[3][r]);
    if (extra) set_d.push_back(t[4][r] - t[5][r]), query_d.push_back(t[6][r] - t[7][r]);
  }
  // One forwarded call: 10000 calls a round on each side, alternating.
  std::vector<double> call_d, call_real;
  int acc = 0;
  for (int r = 0; r < rounds; r++) {
    double c[2];
    for (int k = 0; k < 2; k++) {
      int p = (r + k) % 2;
      RtPeek f = p ? peek_real : peek_cudaw;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 10000; i++) acc += (int)f();
      auto t1 = std::chrono::steady_clock::now();
      c[p] = std::chrono::duration<double, std::nano>(t1 - t0).count() / 10000;
    }
    call_d.push_back(c[0] - c[1]);
    call_real.push_back(c[1]);
  }
  // Tracing's own cost, when the process started with CUDAW_TRACE: the same launches and
  // calls through cudaw with tracing switched on and off (cudaw_trace_active_v1) in
  // alternating rounds: trace_rt_added_ns (a runtime launch), trace_drv_added_ns (a driver
  // launch), trace_call_added_ns (one forwarded call).
  typedef int (*Switch)(int);
  Switch sw = (Switch)dlsym(RTLD_DEFAULT, "cudaw_trace_active_v1");
  bool traced = sw && sw(1) >= 0;
  std::vector<double> tr_rt, tr_drv, tr_call;
  for (int r = 0; traced && r < rounds; r++) {
    double rt_t[2], drv_t[2] = {0, 0}, call_t[2];
    for (int k = 0; k < 2; k++) {
      int on = (r + k) % 2;
      sw(on);
      // The runtime's and the driver's batch, each after untimed launches of its path (as
      // in the rounds above: the switch runs other code, and differs on and off, whose
      // traces in the caches and predictors the first launches after it would otherwise
      // pay for, on one side only); which goes first after the switch turns every two
      // rounds, so that each state has each order as often.
      for (int j = 0; j < 2; j++) {
        int p = ((r >> 1) + j) % 2 ? 2 : 0;
        if (p == 2 && !drv) continue;
        for (int i = 0; i < warm; i++) launch(p);
        CHECK(cudaStreamSynchronize(s));
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; i++) launch(p);
        auto t1 = std::chrono::steady_clock::now();
        (p ? drv_t : rt_t)[on] = std::chrono::duration<double, std::nano>(t1 - t0).count() / batch;
      }
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 1000; i++) acc += (int)peek_cudaw();
      auto t1 = std::chrono::steady_clock::now();
      call_t[on] = std::chrono::duration<double, std::nano>(t1 - t0).count() / 1000;
    }
    tr_rt.push_back(rt_t[1] - rt_t[0]);
    if (drv) tr_drv.push_back(drv_t[1] - drv_t[0]);
    tr_call.push_back(call_t[1] - call_t[0]);
  }
  if (traced) {
    sw(1);
    CHECK(cudaStreamSynchronize(s));
    std::printf("launch_ab traced rounds=%d trace_rt_added_ns=%.1f trace_drv_added_ns=%.1f "
                "trace_call_added_ns=%.2f\n",
                rounds, median(tr_rt), drv ? median(tr_drv) : NAN, median(tr_call));
  }
  double x = median(rt_d), y = drv ? median(drv_d) : NAN, z = drv ? median(t[3]) : NAN;
  std::printf("launch_ab rounds=%d rt_added_ns=%.1f drv_added_ns=%.1f both_added_ns=%.1f "
              "drv_real_ns=%.1f rt_real_ns=%.1f call_added_ns=%.2f call_real_ns=%.2f "
              "memset_added_ns=%.1f query_added_ns=%.1f null_added_ns=%.1f warm=%d busy=%d "
              "(acc %d)\n",
              rounds, x, y, x + y, z, median(t[1]), median(call_d), median(call_real),
              extra ? median(set_d) : NAN, extra ? median(query_d) : NAN, median(null_d), warm,
              busy ? 1 : 0, acc & 1);
  return 0;
}
