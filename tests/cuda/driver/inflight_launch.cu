// Launches in flight while the process is paused: host threads launch kernels in a tight
// loop, two through the runtime (`add_into<<<>>>`, cudaLaunchKernel) and one through the
// driver (cuLaunchKernel fetched with cuGetProcAddress, as cuBLAS and Triton do, on a
// module loaded from argv[1], a fatbin of scale_module.cu), each on a stream of its own,
// into memory allocated with cudaMalloc (so a pause evicts it). Under
// SIMGPU_LAUNCH_DELAY_US every launch stays inside the "driver" a while before it queues
// its kernel: a pause that did not wait for it would evict memory the kernel then uses.
// Every result is checked against the CPU; the printed checksums equal an uninterrupted
// run's. argv[2]: launches per thread.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <thread>
#include <vector>

static const int N = 4096;
static const int RUNTIME_THREADS = 2;

__global__ void add_into(const int* a, int* acc, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += a[i];
}

#define RT(call)                                                                    \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) {                                                    \
            fprintf(stderr, "inflight_launch: %s failed: %s\n", #call,              \
                    cudaGetErrorString(e_));                                        \
            exit(1);                                                                \
        }                                                                           \
    } while (0)
#define DRV(call)                                                                   \
    do {                                                                            \
        CUresult e_ = (call);                                                       \
        if (e_ != CUDA_SUCCESS) {                                                   \
            fprintf(stderr, "inflight_launch: %s failed: %d\n", #call, (int)e_);    \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

typedef CUresult (*GetProc)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static GetProc get_proc;

template <typename F>
static F fetch(const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status;
    if (get_proc(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "inflight_launch: cuGetProcAddress(%s) failed\n", name);
        exit(2);
    }
    return reinterpret_cast<F>(p);
}

static long long results[RUNTIME_THREADS + 1];

static void runtime_thread(int t, int launches) {
    RT(cudaSetDevice(0));
    cudaStream_t s;
    RT(cudaStreamCreate(&s));
    int *a, *acc;
    RT(cudaMalloc(&a, N * sizeof(int)));
    RT(cudaMalloc(&acc, N * sizeof(int)));
    std::vector<int> h(N);
    for (int i = 0; i < N; i++) h[i] = (i % 7) + t + 1;
    RT(cudaMemcpy(a, h.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    RT(cudaMemset(acc, 0, N * sizeof(int)));
    for (int k = 0; k < launches; k++) {
        add_into<<<(N + 255) / 256, 256, 0, s>>>(a, acc, N);
        RT(cudaGetLastError());
    }
    RT(cudaStreamSynchronize(s));
    std::vector<int> out(N);
    RT(cudaMemcpy(out.data(), acc, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        if (out[i] != launches * h[i]) {
            fprintf(stderr, "inflight_launch: runtime thread %d: acc[%d] = %d, expected %d\n", t, i,
                    out[i], launches * h[i]);
            exit(3);
        }
        sum += out[i];
    }
    results[t] = sum;
    RT(cudaFree(a));
    RT(cudaFree(acc));
    RT(cudaStreamDestroy(s));
}

static void driver_thread(const std::vector<char>* image, int launches) {
    auto init = fetch<PFN_cuInit_v2000>("cuInit", 2000);
    auto device_get = fetch<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000);
    auto retain = fetch<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain", 7000);
    auto set_current = fetch<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", 4000);
    auto load = fetch<PFN_cuModuleLoadData_v2000>("cuModuleLoadData", 2000);
    auto get_function = fetch<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction", 2000);
    auto launch = fetch<PFN_cuLaunchKernel_v4000>("cuLaunchKernel", 4000);
    DRV(init(0));
    CUdevice dev;
    DRV(device_get(&dev, 0));
    CUcontext ctx;
    DRV(retain(&ctx, dev));
    DRV(set_current(ctx));
    CUmodule mod;
    DRV(load(&mod, image->data()));
    CUfunction scale;
    DRV(get_function(&scale, mod, "_Z5scalePfif"));
    RT(cudaSetDevice(0));
    cudaStream_t s;
    RT(cudaStreamCreate(&s));
    float* v;
    RT(cudaMalloc(&v, N * sizeof(float)));
    std::vector<float> h(N), want(N);
    for (int i = 0; i < N; i++) h[i] = want[i] = 1.0f + (float)(i % 5);
    RT(cudaMemcpy(v, h.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    int n = N;
    float k = 1.001f;
    void* args[] = {&v, &n, &k};
    for (int j = 0; j < launches; j++) {
        DRV(launch(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, (CUstream)s, args, nullptr));
        for (int i = 0; i < N; i++) want[i] *= k;
    }
    RT(cudaStreamSynchronize(s));
    RT(cudaMemcpy(h.data(), v, N * sizeof(float), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        if (h[i] != want[i]) {
            fprintf(stderr, "inflight_launch: driver thread: v[%d] = %.9g, expected %.9g\n", i,
                    h[i], want[i]);
            exit(3);
        }
        sum += (long long)(h[i] * 1000.0f);
    }
    results[RUNTIME_THREADS] = sum;
    RT(cudaFree(v));
    RT(cudaStreamDestroy(s));
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: inflight_launch MODULE LAUNCHES\n");
        return 2;
    }
    int launches = atoi(argv[2]);
    FILE* f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    std::vector<char> image;
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) image.insert(image.end(), buf, buf + got);
    fclose(f);
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "inflight_launch: %s\n", dlerror());
        return 2;
    }
    get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
    if (!get_proc) {
        fprintf(stderr, "inflight_launch: no cuGetProcAddress_v2\n");
        return 2;
    }
    RT(cudaFree(0));
    printf("launching\n");
    fflush(stdout);
    std::vector<std::thread> threads;
    for (int t = 0; t < RUNTIME_THREADS; t++) threads.emplace_back(runtime_thread, t, launches);
    threads.emplace_back(driver_thread, &image, launches);
    for (auto& t : threads) t.join();
    for (int t = 0; t <= RUNTIME_THREADS; t++) printf("thread %d: checksum %lld\n", t, results[t]);
    printf("inflight_launch: %d launches on each of %d threads, results correct\n", launches,
           RUNTIME_THREADS + 1);
    return 0;
}
