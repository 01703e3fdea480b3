/* demo: a tiny workload for pdinject's first example. It spends ~0.15 s of CPU
 * in its own code and in libc (qsort), so samples hit demo, libc and the kernel.
 * See README.md in this directory for how demo.data was made. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long crunch(unsigned long n)
{
    unsigned long x = 1;
    for (unsigned long i = 0; i < n; i++)
        x = x * 2862933555777941757UL + 3037000493UL;
    return x;
}

static int cmp(const void *a, const void *b)
{
    unsigned a1 = *(const unsigned *)a, b1 = *(const unsigned *)b;
    return (a1 > b1) - (a1 < b1);
}

__attribute__((noinline)) static void sort_some(void)
{
    static unsigned v[4096];
    for (unsigned i = 0; i < 4096; i++)
        v[i] = (unsigned)(sink * 2654435761u + i * 40503u);
    qsort(v, 4096, sizeof v[0], cmp);
    sink += v[17];
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(void)
{
    double t0 = cpu_ms();
    while (cpu_ms() - t0 < 150) {
        sink += crunch(100000);
        sort_some();
    }
    return 0;
}
