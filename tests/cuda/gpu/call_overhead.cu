// Benchmark: the cost of one forwarded runtime call (cudaPeekAtLastError, which does almost
// nothing), in ns. Run natively and under cudaw: the difference is what cudaw's trampoline
// adds to every call. Usage: call_overhead [N] (default 20000000). Needs no GPU work.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
int main(int argc, char** argv) {
  long n = argc > 1 ? atol(argv[1]) : 20000000;
  int acc = 0;
  for (long i = 0; i < 100000; i++) acc += (int)cudaPeekAtLastError();
  double best = 1e9;
  for (int rep = 0; rep < 5; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; i++) acc += (int)cudaPeekAtLastError();
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
    if (ns < best) best = ns;
  }
  std::printf("call_overhead n=%ld ns_per_call=%.3f (acc %d)\n", n, best, acc & 1);
  return 0;
}
