// spin(ms): a kernel that runs `ms` milliseconds of the GPU's global timer (simgpu knows it
// by its mangled name, _Z4spinj, and sleeps as long).
#pragma once
__global__ void spin(unsigned ms) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < (unsigned long long)ms * 1000000ull);
}
