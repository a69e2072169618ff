/* pmixdmodex.c: a PMIx client that puts a value, commits it and, without any fence, reads
 * every other rank's (remote ones come by the servers' direct modex), then asks for a rank the
 * namespace does not have. Prints "dmodex rank=R read=N of M" and, from rank 0,
 * "unknown rank: STATUS after MS ms"; exits 1 when a value is missing or wrong. */
#include <pmix.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int main(void)
{
    pmix_proc_t me, peer, wild;
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 2;
    }
    pmix_value_t *v = NULL;
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v) != PMIX_SUCCESS || v == NULL) {
        fprintf(stderr, "no job size\n");
        return 2;
    }
    uint32_t size = v->data.uint32;
    PMIX_VALUE_RELEASE(v);
    char mine[64];
    snprintf(mine, sizeof mine, "value of rank %u", me.rank);
    pmix_value_t put;
    PMIX_VALUE_LOAD(&put, mine, PMIX_STRING);
    if (PMIx_Put(PMIX_GLOBAL, "berth.dmodex", &put) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS) {
        fprintf(stderr, "put/commit failed\n");
        return 2;
    }
    PMIX_VALUE_DESTRUCT(&put);
    uint32_t read = 0;
    int bad = 0;
    for (uint32_t r = 0; r < size; r++) {
        if (r == me.rank) {
            continue;
        }
        PMIX_LOAD_PROCID(&peer, me.nspace, r);
        v = NULL;
        pmix_status_t rc = PMIx_Get(&peer, "berth.dmodex", NULL, 0, &v);
        char want[64];
        snprintf(want, sizeof want, "value of rank %u", r);
        if (rc != PMIX_SUCCESS || v == NULL || v->type != PMIX_STRING || strcmp(v->data.string, want) != 0) {
            fprintf(stderr, "rank %u: rank %u's value: %s\n", me.rank, r, PMIx_Error_string(rc));
            bad = 1;
        } else {
            read++;
        }
        if (v != NULL) {
            PMIX_VALUE_RELEASE(v);
        }
    }
    printf("dmodex rank=%u read=%u of %u\n", me.rank, read, size - 1);
    if (me.rank == 0) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        PMIX_LOAD_PROCID(&peer, me.nspace, size + 3);
        v = NULL;
        pmix_status_t rc = PMIx_Get(&peer, "berth.dmodex", NULL, 0, &v);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        printf("unknown rank: %s after %ld ms\n", rc == PMIX_SUCCESS ? "FOUND" : PMIx_Error_string(rc), ms);
        if (v != NULL) {
            PMIX_VALUE_RELEASE(v);
        }
    }
    fflush(stdout);
    /* Nobody leaves before everyone has read (a rank's data goes with its namespace). */
    PMIx_Fence(NULL, 0, NULL, 0);
    PMIx_Finalize(NULL, 0);
    return bad;
}
