// A program that reaches the CUDA driver the way cuBLAS, NCCL and Triton do: it never calls
// the runtime, and fetches every driver function through cuGetProcAddress, the one symbol
// it looks up in libcuda.so.1 itself. It loads a module (argv[1], a fatbin of
// scale_module.cu), launches `scale` LAUNCHES times, printing a line after each launch
// returns (argv[2]: milliseconds to sleep between launches), then checks the result. With
// argv[3] "wait" it then prints "driver_launch: waiting" and waits for a line on its standard
// input before it frees its buffer and exits (so that a test can read it live).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

static const int LAUNCHES = 12;
static const int N = 1024;

typedef CUresult (*GetProc)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static GetProc get_proc;
static int fetched = 0;

template <typename F>
static F fetch(const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status;
    CUresult rc = get_proc(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    if (rc != CUDA_SUCCESS || p == nullptr) {
        fprintf(stderr, "driver_launch: cuGetProcAddress(%s) failed: %d\n", name, (int)rc);
        exit(2);
    }
    fetched++;
    return reinterpret_cast<F>(p);
}

#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult rc_ = (call);                                                   \
        if (rc_ != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "driver_launch: %s failed: %d\n", #call, (int)rc_); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: driver_launch MODULE [SLEEP_MS [wait]]\n");
        return 2;
    }
    int sleep_ms = argc > 2 ? atoi(argv[2]) : 0;
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
        fprintf(stderr, "driver_launch: %s\n", dlerror());
        return 2;
    }
    get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
    if (!get_proc) {
        fprintf(stderr, "driver_launch: no cuGetProcAddress_v2\n");
        return 2;
    }
    auto init = fetch<PFN_cuInit_v2000>("cuInit", 2000);
    auto device_get = fetch<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000);
    auto retain = fetch<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain", 7000);
    auto set_current = fetch<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", 4000);
    auto mem_alloc = fetch<PFN_cuMemAlloc_v3020>("cuMemAlloc", 3020);
    auto mem_free = fetch<PFN_cuMemFree_v3020>("cuMemFree", 3020);
    auto htod = fetch<PFN_cuMemcpyHtoD_v3020>("cuMemcpyHtoD", 3020);
    auto dtoh = fetch<PFN_cuMemcpyDtoH_v3020>("cuMemcpyDtoH", 3020);
    auto load = fetch<PFN_cuModuleLoadData_v2000>("cuModuleLoadData", 2000);
    auto get_function = fetch<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction", 2000);
    auto launch = fetch<PFN_cuLaunchKernel_v4000>("cuLaunchKernel", 4000);
    auto sync = fetch<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize", 2000);
    printf("driver_launch: fetched %d functions through cuGetProcAddress\n", fetched);
    fflush(stdout);

    CHECK(init(0));
    CUdevice dev;
    CHECK(device_get(&dev, 0));
    CUcontext ctx;
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));
    CUmodule module;
    CHECK(load(&module, image.data()));
    CUfunction scale;
    CHECK(get_function(&scale, module, "_Z5scalePfif"));

    std::vector<float> host(N);
    for (int i = 0; i < N; i++) host[i] = (float)(i + 1);
    CUdeviceptr v;
    CHECK(mem_alloc(&v, N * sizeof(float)));
    CHECK(htod(v, host.data(), N * sizeof(float)));
    int n = N;
    float k = 2.0f;
    void* params[] = {&v, &n, &k};
    printf("driver_launch: ready\n");
    fflush(stdout);
    for (int i = 0; i < LAUNCHES; i++) {
        CHECK(launch(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
        printf("driver_launch: launched %d\n", i + 1);
        fflush(stdout);
        if (sleep_ms > 0) {
            struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
            nanosleep(&ts, nullptr);
        }
    }
    CHECK(sync());
    CHECK(dtoh(host.data(), v, N * sizeof(float)));
    if (argc > 3 && strcmp(argv[3], "wait") == 0) {
        printf("driver_launch: waiting\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
    }
    CHECK(mem_free(v));
    for (int i = 0; i < N; i++) {
        float want = (float)(i + 1) * (float)(1 << LAUNCHES);
        if (host[i] != want) {
            fprintf(stderr, "driver_launch: v[%d] = %g, want %g\n", i, host[i], want);
            return 1;
        }
    }
    printf("driver_launch: %d launches, results correct\n", LAUNCHES);
    return 0;
}
