/* pmixbind.c: a PMIx client that prints what the server says of its CPU binding and of a
 * local peer's, beside the binding it really has:
 *   "pmixbind rank=R cpuset=S locality=L affinity=A peer=P peer_locality=PL relative=X lcpus=C"
 * S and L: PMIX_CPUSET and PMIX_LOCALITY_STRING of this rank ("none" when not given); A: its
 * affinity (sched_getaffinity) as a CPU list; P: the next local peer after this rank
 * (PMIX_LOCAL_PEERS, "none" when alone), PL its PMIX_LOCALITY_STRING, X the relative locality
 * of the two strings (PMIx_Get_relative_locality, hex; "none" without both strings, "errorN"
 * when PMIx fails with status N); C: the node's PMIX_LOCAL_CPUSETS ("none" when not given). */
#define _GNU_SOURCE
#include <pmix.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenPMIx's internal PMIX_ERR_TAKE_NEXT_OPTION (not in its public headers). */
#define TAKE_NEXT_OPTION (-1366)

/* A string value of `key` for `p`, malloc'ed, or NULL. */
static char *get_string(const pmix_proc_t *p, const char *key)
{
    pmix_value_t *v = NULL;
    pmix_info_t opt;
    bool yes = true;
    PMIX_INFO_LOAD(&opt, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_Get(p, key, &opt, 1, &v);
    PMIX_INFO_DESTRUCT(&opt);
    if (rc != PMIX_SUCCESS || v == NULL) {
        return NULL;
    }
    char *out = NULL;
    if (v->type == PMIX_STRING && v->data.string != NULL) {
        out = strdup(v->data.string);
    }
    PMIX_VALUE_RELEASE(v);
    return out;
}

/* The CPUs of `set` as a list ("0-1,4"). */
static void cpu_list(const cpu_set_t *set, char *out, size_t len)
{
    out[0] = '\0';
    size_t used = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set)) {
            continue;
        }
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, set)) {
            end++;
        }
        int n = end == c ? snprintf(out + used, len - used, "%s%d", used ? "," : "", c)
                         : snprintf(out + used, len - used, "%s%d-%d", used ? "," : "", c, end);
        if (n < 0 || (size_t)n >= len - used) {
            return;
        }
        used += (size_t)n;
        c = end;
    }
}

int main(void)
{
    pmix_proc_t me, wild, peer;
    if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS) {
        fprintf(stderr, "PMIx_Init failed\n");
        return 2;
    }
    char *cpuset = get_string(&me, PMIX_CPUSET);
    char *locality = get_string(&me, PMIX_LOCALITY_STRING);
    cpu_set_t set;
    char affinity[1024] = "unknown";
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        cpu_list(&set, affinity, sizeof affinity);
    }
    PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
    char *peers = get_string(&wild, PMIX_LOCAL_PEERS);
    char *lcpus = get_string(&wild, PMIX_LOCAL_CPUSETS);
    long other = -1;
    if (peers != NULL) {
        /* The next local peer after this rank, cyclically. */
        long first = -1, next = -1;
        for (char *t = strtok(peers, ","); t != NULL; t = strtok(NULL, ",")) {
            long r = strtol(t, NULL, 10);
            if (r == (long)me.rank) {
                continue;
            }
            if (first < 0 || r < first) {
                first = r;
            }
            if (r > (long)me.rank && (next < 0 || r < next)) {
                next = r;
            }
        }
        other = next >= 0 ? next : first;
    }
    char *peer_locality = NULL;
    char peer_name[32] = "none", relative[32] = "none";
    if (other >= 0) {
        PMIX_LOAD_PROCID(&peer, me.nspace, (pmix_rank_t)other);
        snprintf(peer_name, sizeof peer_name, "%ld", other);
        peer_locality = get_string(&peer, PMIX_LOCALITY_STRING);
        pmix_locality_t loc = 0;
        if (locality != NULL && peer_locality != NULL) {
            /* OpenPMIx 4.2 reads only "hwloc:"-prefixed strings here, though its
             * PMIx_server_generate_locality_string makes them bare, and returns
             * PMIX_ERR_TAKE_NEXT_OPTION even when it computed the answer (which always holds
             * PMIX_LOCALITY_SHARE_NODE then): both are taken as they are. */
            char a[1024], b[1024];
            snprintf(a, sizeof a, "hwloc:%s", locality);
            snprintf(b, sizeof b, "hwloc:%s", peer_locality);
            pmix_status_t rc = PMIx_Get_relative_locality(a, b, &loc);
            if (rc == PMIX_SUCCESS || (rc == TAKE_NEXT_OPTION && (loc & PMIX_LOCALITY_SHARE_NODE))) {
                snprintf(relative, sizeof relative, "%#x", (unsigned)loc);
            } else {
                snprintf(relative, sizeof relative, "error%d", rc);
            }
        }
    }
    printf("pmixbind rank=%u cpuset=%s locality=%s affinity=%s peer=%s peer_locality=%s relative=%s lcpus=%s\n",
           me.rank, cpuset ? cpuset : "none", locality ? locality : "none", affinity, peer_name,
           peer_locality ? peer_locality : "none", relative, lcpus ? lcpus : "none");
    fflush(stdout);
    free(cpuset);
    free(locality);
    free(peers);
    free(lcpus);
    free(peer_locality);
    PMIx_Finalize(NULL, 0);
    return 0;
}
