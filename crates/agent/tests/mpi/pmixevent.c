/* pmixevent.c: an Open MPI program that asks PMIx to be told of lost processes (argv[1]
 * "handler": PMIx_Register_event_handler for PMIX_ERR_PROC_ABORTED; "none": no handler) in a
 * `--no-kill` step. After a barrier the last rank kills itself (SIGKILL); each survivor waits
 * up to 15 s for the event, prints "rank R: event CODE for rank L" for each one its handler
 * saw, then "rank R: survived, N events" and finalizes.
 *
 * argv[1] "node": a handler for PMIX_EVENT_NODE_DOWN too, and nobody kills itself: after the
 * barrier each rank prints "rank R: ready" and waits up to 60 s for a node-down event (the
 * test takes a node away), prints "rank R: node down HOST (node N, ranks A,B)" for it, waits
 * up to 5 s more for argv[2] PROC-ABORTED events (the lost node's ranks), then prints
 * "rank R: survived, N events, M nodes down" and finalizes. */
#include <mpi.h>
#include <pmix.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmixhandler.h"
static volatile int nodes_down = 0;
static int me = -1;

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                     pmix_info_t results[], size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id; (void)results; (void)nresults;
    if (status == PMIX_EVENT_NODE_DOWN) {
        const char *host = "?";
        long nodeid = -1;
        char ranks[256] = "";
        for (size_t i = 0; i < ninfo; i++) {
            if (PMIX_CHECK_KEY(&info[i], PMIX_HOSTNAME) && info[i].value.type == PMIX_STRING) {
                host = info[i].value.data.string;
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_NODEID) && info[i].value.type == PMIX_UINT32) {
                nodeid = (long)info[i].value.data.uint32;
            } else if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROCS) && info[i].value.type == PMIX_DATA_ARRAY &&
                       info[i].value.data.darray != NULL && info[i].value.data.darray->type == PMIX_PROC) {
                const pmix_proc_t *p = info[i].value.data.darray->array;
                for (size_t k = 0; k < info[i].value.data.darray->size; k++) {
                    size_t used = strlen(ranks);
                    snprintf(ranks + used, sizeof ranks - used, "%s%u", k == 0 ? "" : ",", p[k].rank);
                }
            }
        }
        printf("rank %d: node down %s (node %ld, ranks %s)\n", me, host, nodeid, ranks);
        fflush(stdout);
        nodes_down++;
        if (cbfunc != NULL) {
            cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
        }
        return;
    }
    long lost = source != NULL ? (long)source->rank : -1;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC) {
            lost = (long)info[i].value.data.proc->rank;
        }
    }
    printf("rank %d: event %s for rank %ld\n", me, PMIx_Error_string(status), lost);
    fflush(stdout);
    event_done(cbfunc, cbdata);
}

int main(int argc, char **argv)
{
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int node = argc > 1 && strcmp(argv[1], "node") == 0;
    int handler = node || (argc > 1 && strcmp(argv[1], "handler") == 0);
    if (handler) {
        /* The same libpmix client Open MPI runs on (PMIx_Init only counts one more user). */
        pmix_proc_t proc;
        if (PMIx_Init(&proc, NULL, 0) != PMIX_SUCCESS) {
            printf("rank %d: PMIx_Init failed\n", me);
            return 2;
        }
        pmix_status_t codes[2] = {PMIX_ERR_PROC_ABORTED, PMIX_EVENT_NODE_DOWN};
        if (!register_handler(codes, node ? 2 : 1, on_event, 100)) {
            printf("rank %d: handler not registered: %s\n", me, PMIx_Error_string(reg_status));
            fflush(stdout);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (node) {
        int want = argc > 2 ? atoi(argv[2]) : 1;
        printf("rank %d: ready\n", me);
        fflush(stdout);
        for (int i = 0; i < 600 && nodes_down == 0; i++) {
            usleep(100000);
        }
        for (int i = 0; i < 50 && events < want; i++) {
            usleep(100000);
        }
        printf("rank %d: survived, %d events, %d nodes down\n", me, events, nodes_down);
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }
    if (me == size - 1) {
        fflush(stdout);
        raise(SIGKILL);
    }
    for (int i = 0; i < 150 && (events == 0 || !handler); i++) {
        usleep(100000);
        if (!handler && i >= 30) {
            break; /* 3 s: no handler, nothing to wait for */
        }
    }
    printf("rank %d: survived, %d events\n", me, events);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
