// Template fixtures for the fatbin crate's tests: several instantiations of templated
// kernels with type-dependent layouts. Compiled, never run.
template <typename T, int N>
struct Array { T v[N]; };

template <typename T>
__global__ void axpy(T a, const T *x, T *y, int n) { if (n) y[0] = a * x[0]; }

template <typename T, int N>
__global__ void by_array(Array<T, N> arr, T *out) { out[0] = arr.v[N - 1]; }

template <typename A, typename B>
__global__ void pair(A a, B b, A *out) { out[0] = a + (A)b; }

template __global__ void axpy<float>(float, const float *, float *, int);
template __global__ void axpy<double>(double, const double *, double *, int);
template __global__ void axpy<char>(char, const char *, char *, int);
template __global__ void by_array<char, 3>(Array<char, 3>, char *);
template __global__ void by_array<double, 7>(Array<double, 7>, double *);
template __global__ void by_array<short, 2500>(Array<short, 2500>, short *);
template __global__ void pair<char, double>(char, double, char *);
template __global__ void pair<long long, short>(long long, short, long long *);

int main() { return 0; }
