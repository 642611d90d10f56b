// NVIDIA's driver-level checkpoint of another process (CUDA 12.8+ driver API), timed step
// by step. Loads libcuda.so.1 at run time.
//   driver_checkpoint checkpoint PID [LOCK_MS]   lock (waiting up to LOCK_MS, default
//                                      30000), then checkpoint (device memory to host)
//   driver_checkpoint restore PID      restore, then unlock
// Prints: lock_s=.. checkpoint_s=..   or   restore_s=.. unlock_s=..
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <cuda.h>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
static F sym(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "driver_checkpoint: %s not found in libcuda.so.1 (driver too old?)\n", name);
    exit(1);
  }
  return (F)p;
}

static CUresult (*error_name)(CUresult, const char**);

static bool failed(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return false;
  const char* name = "?";
  if (error_name) error_name(r, &name);
  fprintf(stderr, "driver_checkpoint: %s failed: %s (%d)\n", what, name, (int)r);
  return true;
}

static void check(CUresult r, const char* what) {
  if (failed(r, what)) exit(1);
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (strcmp(argv[1], "checkpoint") && strcmp(argv[1], "restore"))) {
    fprintf(stderr, "usage: driver_checkpoint checkpoint PID [LOCK_MS] | restore PID\n");
    return 2;
  }
  int pid = atoi(argv[2]);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "driver_checkpoint: %s\n", dlerror());
    return 1;
  }
  error_name = (CUresult(*)(CUresult, const char**))dlsym(lib, "cuGetErrorName");
  auto init = sym<CUresult (*)(unsigned)>(lib, "cuInit");
  check(init(0), "cuInit");
  if (!strcmp(argv[1], "checkpoint")) {
    auto lock = sym<CUresult (*)(int, CUcheckpointLockArgs*)>(lib, "cuCheckpointProcessLock");
    auto ckpt = sym<CUresult (*)(int, CUcheckpointCheckpointArgs*)>(lib, "cuCheckpointProcessCheckpoint");
    auto unlock = sym<CUresult (*)(int, CUcheckpointUnlockArgs*)>(lib, "cuCheckpointProcessUnlock");
    CUcheckpointLockArgs la;
    memset(&la, 0, sizeof la);
    // A process that never reaches a lockable point fails, not hangs.
    la.timeoutMs = argc == 4 ? atoi(argv[3]) : 30000;
    CUcheckpointCheckpointArgs ca;
    memset(&ca, 0, sizeof ca);
    double t0 = now();
    check(lock(pid, &la), "cuCheckpointProcessLock");
    double t1 = now();
    if (failed(ckpt(pid, &ca), "cuCheckpointProcessCheckpoint")) {
      // Never leave the process locked: it would wait for ever in its next CUDA call.
      CUcheckpointUnlockArgs ua;
      memset(&ua, 0, sizeof ua);
      failed(unlock(pid, &ua), "cuCheckpointProcessUnlock (after the failed checkpoint)");
      return 1;
    }
    double t2 = now();
    printf("lock_s=%.4f checkpoint_s=%.4f\n", t1 - t0, t2 - t1);
  } else {
    auto restore = sym<CUresult (*)(int, CUcheckpointRestoreArgs*)>(lib, "cuCheckpointProcessRestore");
    auto unlock = sym<CUresult (*)(int, CUcheckpointUnlockArgs*)>(lib, "cuCheckpointProcessUnlock");
    CUcheckpointRestoreArgs ra;
    memset(&ra, 0, sizeof ra);
    CUcheckpointUnlockArgs ua;
    memset(&ua, 0, sizeof ua);
    double t0 = now();
    check(restore(pid, &ra), "cuCheckpointProcessRestore");
    double t1 = now();
    check(unlock(pid, &ua), "cuCheckpointProcessUnlock");
    double t2 = now();
    printf("restore_s=%.4f unlock_s=%.4f\n", t1 - t0, t2 - t1);
  }
  return 0;
}
