// Parameter-layout fixtures for the fatbin crate's tests (crates/fatbin/tests/nvcc.rs): every kind
// of kernel parameter nvcc can produce. Compiled, never run; `main` exists only so that the
// file links into an executable.
// (__half is left out: cuda_fp16.h needs the CCCL headers the pip wheels do not ship;
// `half_bits` stands in for its 2-byte, 2-aligned layout.)
struct __align__(2) half_bits { unsigned short x; };

struct WithPointers { float *a; int n; double *b; };
struct __align__(16) Aligned16 { int x; float y; };
struct Big8000 { char bytes[8000]; };
struct Big5000 { double values[625]; };
struct Mixed { char c; short s; long long ll; };

extern "C" __global__ void no_params() {}

extern "C" __global__ void scalars(char c, unsigned char uc, short s, int i, long long ll,
                                   float f, double d, half_bits h, unsigned u, bool b) {
  if (c == 0 && uc == 0 && s == 0 && i == 0 && ll == 0 && f == 0 && d == 0 && u == 0 && b)
    asm volatile("trap;");
  (void)h;
}

__global__ void pointers(const float *in, float *out, int *counter, size_t n) {
  if (n) out[0] = in[0] + counter[0];
}

__global__ void structs(WithPointers wp, Aligned16 al, Mixed m, char tail) {
  wp.a[0] = al.x + m.c + tail;
}

__global__ void big_by_value(Big8000 big, int *out) { out[0] = big.bytes[7999]; }
__global__ void over_4k(int first, Big5000 big, char last) { (void)first; (void)big; (void)last; }

__global__ void grid_constant(const __grid_constant__ Big5000 big, const __grid_constant__ WithPointers wp) {
  wp.a[0] = big.values[3];
}

namespace outer { namespace inner {
__global__ void namespaced(float *x, int n) { if (n) x[0] = 1.0f; }
} }

__global__ void __launch_bounds__(128) bounded(int *x) { x[threadIdx.x] = 0; }

#define P8(t, b) t b##0, t b##1, t b##2, t b##3, t b##4, t b##5, t b##6, t b##7
__global__ void many_params(P8(int, i), P8(char, c), P8(double, d), P8(float *, p), P8(short, s)) {
  if (i0) p0[0] = (float)(c1 + d2 + s3);
}

int main() { return 0; }
