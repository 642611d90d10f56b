// Allocates the way PyTorch's expandable segments do: reserves a large virtual range, then
// creates 2 MiB physical chunks with cuMemCreate and maps them into it one after another
// (cuMemMap + cuMemSetAccess), the driver functions fetched through
// cudaGetDriverEntryPoint (argv[1] "entry") or through libcuda.so.1's cuGetProcAddress
// (argv[1] "proc", as cuBLAS and Triton do). Kernels write a pattern into every chunk;
// then, for each line read on stdin, kernels check it and a line "check N ok" (or "bad")
// is printed; the line "grow" instead maps one more chunk (filled, then checked with the
// others) and prints "grown N"; at end of input it unmaps, releases and prints "done".
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const int CHUNKS = 8;
static const int MAX_CHUNKS = 16;
static const size_t CHUNK = 2u << 20;
static const size_t WORDS = CHUNK / sizeof(unsigned);

__global__ void fill(unsigned* p, unsigned seed, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = (unsigned)i * 2654435761u + seed;
}

__global__ void check(const unsigned* p, unsigned seed, size_t n, unsigned* bad) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (p[i] != (unsigned)i * 2654435761u + seed) atomicAdd(bad, 1u);
}

typedef CUresult (*GetProc)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static GetProc get_proc;

static void* fetch(const char* mode, const char* name, int version, bool optional = false) {
    void* p = nullptr;
    if (strcmp(mode, "entry") == 0) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q) != cudaSuccess) p = nullptr;
    } else {
        CUdriverProcAddressQueryResult q;
        if (get_proc(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS) p = nullptr;
    }
    if (!p && !optional) {
        fprintf(stderr, "expandable: no %s\n", name);
        exit(2);
    }
    return p;
}

#define CHECK(call)                                                            \
    do {                                                                       \
        int rc_ = (int)(call);                                                 \
        if (rc_ != 0) {                                                        \
            fprintf(stderr, "expandable: %s failed: %d\n", #call, rc_);        \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "entry";
    setvbuf(stdout, nullptr, _IOLBF, 0);
    CHECK(cudaFree(0));
    if (strcmp(mode, "proc") == 0) {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return 2;
        get_proc = (GetProc)dlsym(lib, "cuGetProcAddress_v2");
        if (!get_proc) return 2;
    }
    auto create = (PFN_cuMemCreate_v10020)fetch(mode, "cuMemCreate", 10020);
    auto release = (PFN_cuMemRelease_v10020)fetch(mode, "cuMemRelease", 10020);
    auto map = (PFN_cuMemMap_v10020)fetch(mode, "cuMemMap", 10020);
    auto unmap = (PFN_cuMemUnmap_v10020)fetch(mode, "cuMemUnmap", 10020);
    auto set_access = (PFN_cuMemSetAccess_v10020)fetch(mode, "cuMemSetAccess", 10020);
    auto reserve = (PFN_cuMemAddressReserve_v10020)fetch(mode, "cuMemAddressReserve", 10020);
    auto addr_free = (PFN_cuMemAddressFree_v10020)fetch(mode, "cuMemAddressFree", 10020);
    auto props = (PFN_cuMemGetAllocationPropertiesFromHandle_v10020)fetch(
        mode, "cuMemGetAllocationPropertiesFromHandle", 10020, true);
    auto retain = (PFN_cuMemRetainAllocationHandle_v11000)fetch(
        mode, "cuMemRetainAllocationHandle", 11000, true);

    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    CUdeviceptr base = 0;
    const size_t reserved = 64 * CHUNK;
    CHECK(reserve(&base, reserved, 0, 0, 0));
    CUmemGenericAllocationHandle handles[MAX_CHUNKS];
    int chunks = CHUNKS;
    for (int c = 0; c < CHUNKS; c++) {
        CHECK(create(&handles[c], CHUNK, &prop, 0));
        CHECK(map(base + c * CHUNK, CHUNK, 0, handles[c], 0));
        CHECK(set_access(base + c * CHUNK, CHUNK, &access, 1));
        fill<<<64, 256>>>((unsigned*)(base + c * CHUNK), 1000u + c, WORDS);
    }
    CHECK(cudaDeviceSynchronize());
    // (simgpu has neither query; a real driver has both.)
    if (props && retain) {
        CUmemAllocationProp got = {};
        CHECK(props(&got, handles[3]));
        CUmemGenericAllocationHandle again = 0;
        CHECK(retain(&again, (void*)(base + 3 * CHUNK + 4096)));
        if (again != handles[3] || got.location.id != 0) {
            fprintf(stderr, "expandable: handle queries disagree\n");
            return 1;
        }
        CHECK(release(again));
    }
    printf("ready: %d chunks of %zu bytes at %#llx\n", CHUNKS, CHUNK, (unsigned long long)base);

    unsigned* bad = nullptr;
    CHECK(cudaMalloc(&bad, sizeof(unsigned)));
    char line[64];
    int n = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "grow", 4) == 0 && chunks < MAX_CHUNKS) {
            int c = chunks++;
            CHECK(create(&handles[c], CHUNK, &prop, 0));
            CHECK(map(base + c * CHUNK, CHUNK, 0, handles[c], 0));
            CHECK(set_access(base + c * CHUNK, CHUNK, &access, 1));
            fill<<<64, 256>>>((unsigned*)(base + c * CHUNK), 1000u + c, WORDS);
            CHECK(cudaDeviceSynchronize());
            printf("grown %d\n", chunks);
            continue;
        }
        CHECK(cudaMemset(bad, 0, sizeof(unsigned)));
        for (int c = 0; c < chunks; c++)
            check<<<64, 256>>>((const unsigned*)(base + c * CHUNK), 1000u + c, WORDS, bad);
        unsigned h = 0;
        CHECK(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
        printf(h == 0 ? "check %d ok\n" : "check %d bad\n", n++);
    }
    for (int c = 0; c < chunks; c++) {
        CHECK(unmap(base + c * CHUNK, CHUNK));
        CHECK(release(handles[c]));
    }
    CHECK(addr_free(base, reserved));
    CHECK(cudaFree(bad));
    printf("done\n");
    return 0;
}
