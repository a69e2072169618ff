/* pmix_fence.c: PMIx fence latency as a berth step sees it (issue 21's benchmark).
 * Every rank: PMIx_Init, one warm-up fence, then ROUNDS fences without data collection and
 * ROUNDS with (each rank first puts a 64-byte value and commits). Rank 0 prints
 *   fence ranks=N nocollect_us=MEDIAN/P90 collect_us=MEDIAN/P90 init_us=T
 * Build: cc -O2 -o pmix_fence bench/pmix_fence.c $(pkg-config --cflags pmix) -lpmix
 * Usage: pmix_fence [ROUNDS] (default 50, at most 10000). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of the sorted n values. */
static double pct(double *v, int n, double p)
{
    int i = (int)(n * p + 0.999999) - 1;
    return v[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

static int fence(int collect)
{
    pmix_info_t info;
    bool flag = collect ? true : false;
    PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &flag, PMIX_BOOL);
    return PMIx_Fence(NULL, 0, &info, 1);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    if (rounds < 1 || rounds > 10000) {
        fprintf(stderr, "pmix_fence: ROUNDS must be 1..10000\n");
        return 2;
    }
    pmix_proc_t me;
    double t0 = now_us();
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_fence: PMIx_Init failed (not started by a PMIx server?)\n");
        return 1;
    }
    double init_us = now_us() - t0;
    pmix_proc_t wild;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *val = NULL;
    unsigned size = 0;
    if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &val) == PMIX_SUCCESS && val) {
        size = val->data.uint32;
        PMIX_VALUE_RELEASE(val);
    }
    if (fence(0) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_fence: warm-up fence failed\n");
        return 1;
    }
    double *plain = calloc(rounds, sizeof *plain), *coll = calloc(rounds, sizeof *coll);
    if (!plain || !coll)
        return 1;
    for (int i = 0; i < rounds; i++) {
        double s = now_us();
        if (fence(0) != PMIX_SUCCESS)
            return 1;
        plain[i] = now_us() - s;
    }
    char blob[64];
    memset(blob, 'x', sizeof blob - 1);
    blob[sizeof blob - 1] = 0;
    for (int i = 0; i < rounds; i++) {
        pmix_value_t v;
        PMIX_VALUE_LOAD(&v, blob, PMIX_STRING);
        char key[32];
        snprintf(key, sizeof key, "bench.%d", i);
        PMIx_Put(PMIX_GLOBAL, key, &v);
        PMIX_VALUE_DESTRUCT(&v);
        double s = now_us();
        if (PMIx_Commit() != PMIX_SUCCESS || fence(1) != PMIX_SUCCESS)
            return 1;
        coll[i] = now_us() - s;
    }
    if (me.rank == 0) {
        qsort(plain, rounds, sizeof *plain, cmp);
        qsort(coll, rounds, sizeof *coll, cmp);
        printf("fence ranks=%u rounds=%d nocollect_us=%.0f/%.0f collect_us=%.0f/%.0f init_us=%.0f\n", size,
               rounds, pct(plain, rounds, 0.5), pct(plain, rounds, 0.9), pct(coll, rounds, 0.5),
               pct(coll, rounds, 0.9), init_us);
        fflush(stdout);
    }
    PMIx_Finalize(NULL, 0);
    return 0;
}
