/* pmixhandler.h: what the PMIx clients pmixevent.c and pmixguard.c share, included from
 * their own directory (no -I needed): the events their handler saw, an event's completion,
 * and the registration of the handler, awaited. */
#ifndef BERTH_PMIXHANDLER_H
#define BERTH_PMIXHANDLER_H
#include <pmix.h>
#include <stddef.h>
#include <unistd.h>

static volatile int events = 0;

/* Count an event the handler saw and tell the library the handler is done with it. */
static void event_done(pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    events++;
    if (cbfunc != NULL) {
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
    }
}

static volatile int registered = 0;
static volatile pmix_status_t reg_status = PMIX_SUCCESS;

static void on_registered(pmix_status_t status, size_t ref, void *cbdata)
{
    (void)ref; (void)cbdata;
    reg_status = status;
    registered = 1;
}

/* Register `handler` for the `ncodes` `codes` and wait up to `tries` x 10 ms for the
 * library's answer: whether the handler is registered. */
static int register_handler(pmix_status_t codes[], size_t ncodes, pmix_notification_fn_t handler, int tries)
{
    PMIx_Register_event_handler(codes, ncodes, NULL, 0, handler, on_registered, NULL);
    for (int i = 0; i < tries && !registered; i++) {
        usleep(10000);
    }
    return registered && reg_status == PMIX_SUCCESS;
}
#endif
