/* pmixapp.c: a PMIx client that prints what the server says of its application (MPMD):
 * "pmix rank=R appnum=A apps=N appsize=S appldr=L apprank=K". */
#include <pmix.h>
#include <stdio.h>
#include <string.h>

static int get_u32(const pmix_proc_t *p, const char *key, pmix_info_t *info, size_t ninfo, unsigned *out)
{
    pmix_value_t *v = NULL;
    if (PMIx_Get(p, key, info, ninfo, &v) != PMIX_SUCCESS || v == NULL) {
        return -1;
    }
    if (v->type == PMIX_UINT32) {
        *out = v->data.uint32;
    } else if (v->type == PMIX_PROC_RANK) {
        *out = v->data.rank;
    } else {
        PMIX_VALUE_RELEASE(v);
        return -1;
    }
    PMIX_VALUE_RELEASE(v);
    return 0;
}

int main(void)
{
    pmix_proc_t me, wild;
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 2;
    }
    unsigned appnum = 99, apps = 99, appsize = 99, appldr = 99, apprank = 99;
    get_u32(&me, PMIX_APPNUM, NULL, 0, &appnum);
    get_u32(&me, PMIX_APP_RANK, NULL, 0, &apprank);
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    get_u32(&wild, PMIX_JOB_NUM_APPS, NULL, 0, &apps);
    pmix_info_t info[2];
    PMIX_INFO_LOAD(&info[0], PMIX_APP_INFO, NULL, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_APPNUM, &appnum, PMIX_UINT32);
    get_u32(&wild, PMIX_APP_SIZE, info, 2, &appsize);
    get_u32(&wild, PMIX_APPLDR, info, 2, &appldr);
    printf("pmix rank=%u appnum=%u apps=%u appsize=%u appldr=%u apprank=%u\n", me.rank, appnum, apps, appsize, appldr,
           apprank);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
