/* How fast this machine makes fresh memory usable: writes 1 GiB of newly mapped memory twice
 * and prints both rates. The first write pays for the kernel (and, on a virtual machine, the
 * host) providing and clearing each page; the second is plain memory bandwidth.
 *
 *   cc -O2 scripts/first-touch.c -o /tmp/first-touch && /tmp/first-touch
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    size_t n = (size_t)1 << 30;
    char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 2;
    }
    for (int pass = 1; pass <= 2; pass++) {
        double t = now();
        memset(p, pass, n);
        printf("%s write: %.2f GB/s\n", pass == 1 ? "first " : "second", n / (now() - t) / 1e9);
    }
    return 0;
}
