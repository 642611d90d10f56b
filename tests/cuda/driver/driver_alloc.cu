// Device memory taken through the driver the way cuBLAS, NCCL and Triton take it: every
// function fetched through libcuda.so.1's cuGetProcAddress, the runtime never called.
//
//   driver_alloc MODULE run    cuMemAlloc and cuMemAllocAsync buffers, filled and scaled by
//                              the `scale` kernel of MODULE (a fatbin loaded with
//                              cuModuleLoadData); prints the pointer queries' answers and,
//                              when cudaw's driver layer is loaded, the kernel's recorded
//                              parameter layout; then for each line read on stdin checks
//                              both buffers ("check N ok" or "bad"); at end of input frees
//                              them (cuMemFree, cuMemFreeAsync) and prints "done".
//   driver_alloc MODULE fill   cuMemAlloc of 3 MiB until refused: "fill count=N err=E",
//                              then frees all and allocates again: "again rc=R".
//   driver_alloc MODULE own    in a context of its own (cuCtxCreate), cuMemAlloc and
//                              cuMemFree, then whether that context is still current:
//                              "own context current after alloc: yes|no", "... after free".
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static const int N = 1 << 16;

typedef CUresult (*GetProc)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static GetProc get_proc;

template <typename F>
static F fetch(const char* name, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult status;
    if (get_proc(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "driver_alloc: cuGetProcAddress(%s) failed\n", name);
        exit(2);
    }
    return reinterpret_cast<F>(p);
}

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult rc_ = (call);                                                  \
        if (rc_ != CUDA_SUCCESS) {                                              \
            fprintf(stderr, "driver_alloc: %s failed: %d\n", #call, (int)rc_); \
            return 1;                                                           \
        }                                                                       \
    } while (0)

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: driver_alloc MODULE run|fill\n");
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
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
        fprintf(stderr, "driver_alloc: %s\n", dlerror());
        return 2;
    }
    get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
    auto init = fetch<PFN_cuInit_v2000>("cuInit", 2000);
    auto device_get = fetch<PFN_cuDeviceGet_v2000>("cuDeviceGet", 2000);
    auto retain = fetch<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain", 7000);
    auto set_current = fetch<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent", 4000);
    auto mem_alloc = fetch<PFN_cuMemAlloc_v3020>("cuMemAlloc", 3020);
    auto mem_free = fetch<PFN_cuMemFree_v3020>("cuMemFree", 3020);
    auto alloc_async = fetch<PFN_cuMemAllocAsync_v11020>("cuMemAllocAsync", 11020);
    auto free_async = fetch<PFN_cuMemFreeAsync_v11020>("cuMemFreeAsync", 11020);
    // simgpu has no pointer queries (cuGetProcAddress finds none): cudaw's libcuda.so.1
    // exports every driver function, and answers these for its own memory.
    auto range = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(
        dlsym(lib, "cuMemGetAddressRange_v2"));
    auto attribute = reinterpret_cast<PFN_cuPointerGetAttribute_v4000>(
        dlsym(lib, "cuPointerGetAttribute"));
    auto htod = fetch<PFN_cuMemcpyHtoD_v3020>("cuMemcpyHtoD", 3020);
    auto dtoh = fetch<PFN_cuMemcpyDtoH_v3020>("cuMemcpyDtoH", 3020);
    auto load = fetch<PFN_cuModuleLoadData_v2000>("cuModuleLoadData", 2000);
    auto get_function = fetch<PFN_cuModuleGetFunction_v2000>("cuModuleGetFunction", 2000);
    auto launch = fetch<PFN_cuLaunchKernel_v4000>("cuLaunchKernel", 4000);
    auto sync = fetch<PFN_cuCtxSynchronize_v2000>("cuCtxSynchronize", 2000);

    CHECK(init(0));
    CUdevice dev;
    CHECK(device_get(&dev, 0));
    CUcontext ctx;
    CHECK(retain(&ctx, dev));
    CHECK(set_current(ctx));

    if (strcmp(argv[2], "own") == 0) {
        auto create = fetch<PFN_cuCtxCreate_v3020>("cuCtxCreate", 3020);
        auto get_current = fetch<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", 4000);
        CUcontext own, now;
        CHECK(create(&own, 0, dev));
        printf("own context %s the primary one\n", own == ctx ? "is" : "is not");
        CUdeviceptr p;
        CHECK(mem_alloc(&p, 3u << 20));
        CHECK(get_current(&now));
        printf("own context current after alloc: %s\n", now == own ? "yes" : "no");
        CHECK(mem_free(p));
        CHECK(get_current(&now));
        printf("own context current after free: %s\n", now == own ? "yes" : "no");
        return 0;
    }

    if (strcmp(argv[2], "fill") == 0) {
        std::vector<CUdeviceptr> held;
        CUresult rc;
        for (;;) {
            CUdeviceptr p;
            rc = mem_alloc(&p, 3u << 20);
            if (rc != CUDA_SUCCESS || held.size() > 100000) break;
            held.push_back(p);
        }
        printf("fill count=%zu err=%d\n", held.size(), (int)rc);
        for (CUdeviceptr p : held) CHECK(mem_free(p));
        CUdeviceptr p;
        rc = mem_alloc(&p, 3u << 20);
        printf("again rc=%d\n", (int)rc);
        if (rc == CUDA_SUCCESS) CHECK(mem_free(p));
        return 0;
    }

    CUmodule module;
    CHECK(load(&module, image.data()));
    image.assign(image.size(), 0);  // the driver may not keep the caller's image
    CUfunction scale;
    CHECK(get_function(&scale, module, "_Z5scalePfif"));
    typedef size_t (*LayoutFn)(CUfunction, char*, size_t);
    LayoutFn layout = reinterpret_cast<LayoutFn>(dlsym(lib, "cudaw_driver_kernel_layout_v1"));
    if (layout) {
        char text[4096];
        size_t len = layout(scale, text, sizeof text);
        printf("layout: %s\n", len > 0 && len < sizeof text ? text : "none");
    }

    std::vector<float> host(N);
    for (int i = 0; i < N; i++) host[i] = (float)(i % 1000);
    CUdeviceptr a, b;
    CHECK(mem_alloc(&a, N * sizeof(float)));
    CHECK(alloc_async(&b, N * sizeof(float), nullptr));
    CHECK(htod(a, host.data(), N * sizeof(float)));
    CHECK(htod(b, host.data(), N * sizeof(float)));
    int n = N;
    float two = 2.0f, three = 3.0f;
    void* pa[] = {&a, &n, &two};
    void* pb[] = {&b, &n, &three};
    CHECK(launch(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, pa, nullptr));
    CHECK(launch(scale, (N + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, pb, nullptr));
    CHECK(sync());

    CUdeviceptr base = 0;
    size_t size = 0;
    if (!range || !attribute) {
        fprintf(stderr, "driver_alloc: no pointer queries in libcuda.so.1\n");
        return 2;
    }
    CUresult rc = range(&base, &size, a + 100);
    printf("range rc=%d base_ok=%d size=%zu\n", (int)rc, base == a, size);
    CUdeviceptr start = 0;
    size_t asize = 0;
    CUresult r1 = attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b + 4);
    CUresult r2 = attribute(&asize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, b + 4);
    printf("attribute rc=%d,%d start_ok=%d size=%zu\n", (int)r1, (int)r2, start == b, asize);
    printf("ready\n");

    std::vector<float> back(N);
    char line[256];
    for (int round = 0; fgets(line, sizeof line, stdin); round++) {
        bool ok = true;
        CHECK(dtoh(back.data(), a, N * sizeof(float)));
        for (int i = 0; i < N; i++) ok = ok && back[i] == host[i] * 2.0f;
        CHECK(dtoh(back.data(), b, N * sizeof(float)));
        for (int i = 0; i < N; i++) ok = ok && back[i] == host[i] * 3.0f;
        printf("check %d %s\n", round, ok ? "ok" : "bad");
    }
    CHECK(mem_free(a));
    CHECK(free_async(b, nullptr));
    CHECK(sync());
    printf("done\n");
    return 0;
}
