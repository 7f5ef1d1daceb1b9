/* memfill: holds MB megabytes of process memory (heap) with a known pattern, for the
 * bench and tests of shared-memory forks and incremental snapshots. Static, no dependencies.
 *
 *   memfill MB [CHANGE_MB [TOUCH_MB]]
 *                  allocate MB, fill the first TOUCH_MB (all of it by default; the rest is
 *                  never touched), write /tmp/ready, then wait for signals:
 *     SIGUSR1      check every filled page against its pattern; write /tmp/verified
 *                  ("ok GEN" or "bad PAGE GEN")
 *     SIGUSR2      rewrite the first CHANGE_MB (all filled pages by default) with the next
 *                  generation's pattern; write /tmp/rewritten ("GEN MS": the generation and
 *                  how long the rewrite took). Pages past it keep generation 0's.
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
static size_t pages, changed;
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

/* The generation page p holds now. */
static uint64_t gen_of(size_t p) { return p < changed ? generation : 0; }

static void fill(size_t upto, uint64_t gen) {
    for (size_t p = 0; p < upto; p++)
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
    if (argc < 2 || argc > 4 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: memfill MB [CHANGE_MB [TOUCH_MB]]\n");
        return 2;
    }
    size_t all = (size_t)atol(argv[1]) * (1 << 20) / PAGE;
    pages = argc > 3 ? (size_t)atol(argv[3]) * (1 << 20) / PAGE : all;
    changed = argc > 2 ? (size_t)atol(argv[2]) * (1 << 20) / PAGE : pages;
    if (pages > all) pages = all;
    if (changed > pages) changed = pages;
    mem = aligned_alloc(PAGE, all * PAGE);
    if (!mem) {
        perror("memfill: aligned_alloc");
        return 1;
    }
    fill(pages, generation);
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
                    if (mem[p * (PAGE / 8) + i] != word(p, i, gen_of(p))) {
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
            fill(changed, ++generation);
            snprintf(line, sizeof line, "%llu %.0f\n", (unsigned long long)generation, now_ms() - start);
            put("/tmp/rewritten", line);
        }
    }
}
