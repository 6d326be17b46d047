// Polls nvmlDeviceGetSamples (SM clock = 5, total power = 0) for GPU 0 every INTERVAL ms for
// SECONDS s and prints each new sample: "clk|pow <cpu-us> <value>". Also prints wall-clock us at
// each poll ("poll <gettimeofday-us> <n_clk> <n_pow>") to align the driver's timestamps.
#include <dlfcn.h>
#include <sys/time.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct Sample { unsigned long long ts; union { double d; unsigned u; unsigned long long ull; } v; };
typedef int (*InitF)();
typedef int (*ByIndexF)(unsigned, void**);
typedef int (*SamplesF)(void*, int, unsigned long long, int*, unsigned*, Sample*);
int main(int argc, char** argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10, interval = argc > 2 ? atof(argv[2]) : 500;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) { printf("no nvml\n"); return 1; }
    InitF init = (InitF)dlsym(lib, "nvmlInit_v2");
    ByIndexF by_index = (ByIndexF)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    SamplesF samples = (SamplesF)dlsym(lib, "nvmlDeviceGetSamples");
    void* dev = nullptr;
    if (init() != 0 || by_index(0, &dev) != 0) { printf("init failed\n"); return 1; }
    unsigned long long last[2] = {0, 0};
    const int types[2] = {5, 0};
    const char* names[2] = {"clk", "pow"};
    struct timeval t0; gettimeofday(&t0, nullptr);
    for (;;) {
        struct timeval t; gettimeofday(&t, nullptr);
        double el = (t.tv_sec - t0.tv_sec) + 1e-6 * (t.tv_usec - t0.tv_usec);
        if (el > seconds) break;
        unsigned got[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            int vt = 0; unsigned n = 0;
            int rc = samples(dev, types[k], last[k], &vt, &n, nullptr);
            if (rc != 0) { if (rc != 6) printf("%s rc %d\n", names[k], rc); continue; }
            std::vector<Sample> buf(n);
            rc = samples(dev, types[k], last[k], &vt, &n, buf.data());
            if (rc != 0) { printf("%s rc2 %d\n", names[k], rc); continue; }
            for (unsigned i = 0; i < n; i++) {
                double v = vt == 0 ? buf[i].v.d : vt == 1 ? buf[i].v.u : (double)buf[i].v.ull;
                if (buf[i].ts > last[k]) printf("%s %llu %.0f\n", names[k], buf[i].ts, v), got[k]++;
                if (buf[i].ts > last[k]) last[k] = buf[i].ts;
            }
        }
        printf("poll %lld %u %u\n", (long long)t.tv_sec * 1000000 + t.tv_usec, got[0], got[1]);
        fflush(stdout);
        usleep((useconds_t)(interval * 1000));
    }
    return 0;
}
