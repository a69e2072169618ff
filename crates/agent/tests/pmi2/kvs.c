/* kvs.c: a PMI-2 client on Slurm's libpmi2 (no MPI). Each rank puts its own key, fences and
 * reads every other rank's key, three times; reads job attributes; rank 0 puts a node attribute
 * late while the others wait for it. Prints one line "kvs ok ..." or fails with status 2. */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUNDS 3

static int rank = -1;

#define CHECK(call)                                                                   \
    do {                                                                              \
        int rc_ = (call);                                                             \
        if (rc_ != PMI2_SUCCESS) {                                                    \
            fprintf(stderr, "rank %d: %s failed with %d\n", rank, #call, rc_);        \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

static void fail(const char *what, const char *got, const char *expected)
{
    fprintf(stderr, "rank %d: %s: got \"%s\", expected \"%s\"\n", rank, what, got, expected);
    exit(2);
}

int main(void)
{
    int spawned, size, appnum, found, len, round, other;
    char jobid[256], key[64], expected[PMI2_MAX_VALLEN], value[PMI2_MAX_VALLEN];
    char mapping[PMI2_MAX_VALLEN], universe[32];

    CHECK(PMI2_Init(&spawned, &size, &rank, &appnum));
    if (spawned || appnum != 0 || size < 1 || rank < 0 || rank >= size) {
        fprintf(stderr, "rank %d: bad init: spawned=%d size=%d appnum=%d\n", rank, spawned, size, appnum);
        return 2;
    }
    CHECK(PMI2_Job_GetId(jobid, sizeof jobid));

    for (round = 0; round < ROUNDS; round++) {
        /* The value has ';' (escaped on the wire as ';;') and '='. */
        snprintf(key, sizeof key, "r%d-rank%d", round, rank);
        snprintf(value, sizeof value, "v%d;%d;;=%s", round, rank, jobid);
        CHECK(PMI2_KVS_Put(key, value));
        CHECK(PMI2_KVS_Fence());
        for (other = 0; other < size; other++) {
            snprintf(key, sizeof key, "r%d-rank%d", round, other);
            snprintf(expected, sizeof expected, "v%d;%d;;=%s", round, other, jobid);
            CHECK(PMI2_KVS_Get(jobid, other, key, value, sizeof value, &len));
            if (strcmp(value, expected) != 0 || len != (int)strlen(expected))
                fail(key, value, expected);
        }
    }
    if (PMI2_KVS_Get(jobid, PMI2_ID_NULL, "no-such-key", value, sizeof value, &len) == PMI2_SUCCESS)
        fail("get of a missing key", value, "an error");

    CHECK(PMI2_Info_GetJobAttr("PMI_process_mapping", mapping, sizeof mapping, &found));
    if (!found)
        fail("PMI_process_mapping", "not found", "a mapping");
    CHECK(PMI2_Info_GetJobAttr("universeSize", universe, sizeof universe, &found));
    snprintf(expected, sizeof expected, "%d", size);
    if (!found || strcmp(universe, expected) != 0)
        fail("universeSize", found ? universe : "not found", expected);
    CHECK(PMI2_Info_GetJobAttr("no-such-attribute", value, sizeof value, &found));
    if (found)
        fail("no-such-attribute", value, "not found");

    /* Node attributes: the others wait for rank 0's, which comes late. */
    if (rank == 0) {
        CHECK(PMI2_Info_GetNodeAttr("berth-node", value, sizeof value, &found, 0));
        if (found)
            fail("berth-node before the put", value, "not found");
        usleep(200 * 1000);
        CHECK(PMI2_Info_PutNodeAttr("berth-node", "from rank 0;ok"));
    } else {
        CHECK(PMI2_Info_GetNodeAttr("berth-node", value, sizeof value, &found, 1));
        if (!found || strcmp(value, "from rank 0;ok") != 0)
            fail("berth-node", found ? value : "not found", "from rank 0;ok");
    }
    CHECK(PMI2_KVS_Fence());

    printf("kvs ok rank %d of %d jobid %s mapping %s fences %d\n", rank, size, jobid, mapping, ROUNDS + 1);
    fflush(stdout);
    CHECK(PMI2_Finalize());
    return 0;
}
