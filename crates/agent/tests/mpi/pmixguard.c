/* pmixguard.c: a plain PMIx client (libpmix) for the agent's PMIx server security test
 * (crates/agent/src/step/pmix/mod.rs), run with a rank's environment (or a forged one).
 *   init            PMIx_Init, print "init ok NSPACE RANK" or "init failed: ERROR", finalize.
 *   listen SECONDS  init, register a handler for PMIX_ERR_PROC_ABORTED, print "registered",
 *                   then for SECONDS print "event CODE from NSPACE:RANK" per event, and
 *                   "listened, N events".
 *   notify          init, PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, range GLOBAL) as itself,
 *                   print "notified: STATUS".
 * Exit status 0 when PMIx_Init succeeded, 3 otherwise. */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmixhandler.h"

static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[], size_t ninfo,
                     pmix_info_t results[], size_t nresults, pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id; (void)info; (void)ninfo; (void)results; (void)nresults;
    printf("event %s from %s:%u\n", PMIx_Error_string(status), source != NULL ? source->nspace : "?",
           source != NULL ? source->rank : 0);
    fflush(stdout);
    event_done(cbfunc, cbdata);
}

static volatile int notified = 0;
static volatile pmix_status_t notify_status = PMIX_SUCCESS;

static void on_notified(pmix_status_t status, void *cbdata)
{
    (void)cbdata;
    notify_status = status;
    notified = 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "init";
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        printf("init failed: %s\n", PMIx_Error_string(rc));
        return 3;
    }
    printf("init ok %s %u\n", me.nspace, me.rank);
    fflush(stdout);
    if (strcmp(mode, "listen") == 0) {
        int seconds = argc > 2 ? atoi(argv[2]) : 5;
        pmix_status_t code = PMIX_ERR_PROC_ABORTED;
        printf(register_handler(&code, 1, on_event, 500) ? "registered\n" : "not registered\n");
        fflush(stdout);
        for (int i = 0; i < seconds * 10; i++) {
            usleep(100000);
        }
        printf("listened, %d events\n", events);
    } else if (strcmp(mode, "notify") == 0) {
        rc = PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, &me, PMIX_RANGE_GLOBAL, NULL, 0, on_notified, NULL);
        for (int i = 0; i < 500 && rc == PMIX_SUCCESS && !notified; i++) {
            usleep(10000);
        }
        printf("notified: %s\n", PMIx_Error_string(rc == PMIX_SUCCESS ? notify_status : rc));
    }
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
