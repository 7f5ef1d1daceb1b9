/* memfill: holds MB megabytes of process memory (heap) with a known pattern, for the
 * bench and tests of shared-memory forks. Static, no dependencies.
 *
 *   memfill MB     fill, write /tmp/ready, then wait for signals:
 *     SIGUSR1      check every page against the current pattern; write /tmp/verified
 *                  ("ok GEN" or "bad PAGE GEN")
 *     SIGUSR2      rewrite every page with the next pattern; write /tmp/rewritten
 *                  ("GEN MS": the generation and how long the rewrite took)
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

static volatile sig_atomic_t want_verify, want_rewrite;
static uint64_t *mem;
static size_t pages;
static uint64_t generation;

static void on_usr1(int sig) { (void)sig; want_verify = 1; }
static void on_usr2(int sig) { (void)sig; want_rewrite = 1; }

/* Each 8-byte word differs between pages and generations, so that no page is zero and
 * no two pages are equal (nothing a host could merge or skip). */
static uint64_t word(size_t page, size_t i, uint64_t gen) {
    uint64_t x = (page * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull) ^ (gen + 1);
    x ^= x >> 31;
    return x * 0x94D049BB133111EBull;
}

static void fill(uint64_t gen) {
    for (size_t p = 0; p < pages; p++)
        for (size_t i = 0; i < PAGE / 8; i++)
            mem[p * (PAGE / 8) + i] = word(p, i, gen);
}

static void put(const char *path, const char *text) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    rename(tmp, path);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc != 2 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: memfill MB\n");
        return 2;
    }
    pages = (size_t)atol(argv[1]) * (1 << 20) / PAGE;
    mem = aligned_alloc(PAGE, pages * PAGE);
    if (!mem) {
        perror("memfill: aligned_alloc");
        return 1;
    }
    fill(generation);
    /* The signals stay blocked but while waiting, so that none is lost between a check of
     * the flags and the wait. */
    sigset_t mine, waiting;
    sigemptyset(&mine);
    sigaddset(&mine, SIGUSR1);
    sigaddset(&mine, SIGUSR2);
    sigprocmask(SIG_BLOCK, &mine, &waiting);
    signal(SIGUSR1, on_usr1);
    signal(SIGUSR2, on_usr2);
    put("/tmp/ready", "ready\n");
    char line[64];
    for (;;) {
        if (!want_verify && !want_rewrite)
            sigsuspend(&waiting);
        if (want_verify) {
            want_verify = 0;
            size_t bad = pages;
            for (size_t p = 0; p < pages && bad == pages; p++)
                for (size_t i = 0; i < PAGE / 8; i++)
                    if (mem[p * (PAGE / 8) + i] != word(p, i, generation)) {
                        bad = p;
                        break;
                    }
            if (bad == pages)
                snprintf(line, sizeof line, "ok %llu\n", (unsigned long long)generation);
            else
                snprintf(line, sizeof line, "bad %zu %llu\n", bad, (unsigned long long)generation);
            put("/tmp/verified", line);
        }
        if (want_rewrite) {
            want_rewrite = 0;
            double start = now_ms();
            fill(++generation);
            snprintf(line, sizeof line, "%llu %.0f\n", (unsigned long long)generation, now_ms() - start);
            put("/tmp/rewritten", line);
        }
    }
}
