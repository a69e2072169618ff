/* berth's glue to OpenPMIx's server library (libpmix, Debian libpmix-dev 4.2).
 *
 * PMIx's API is built of large structs filled through macros (PMIX_INFO_LOAD,
 * PMIX_DATA_ARRAY_CREATE, ...): they are used here, in C, against the installed headers, so
 * no struct layout is restated by hand in Rust. Rust (src/pmix/mod.rs) sees only the flat
 * functions below and its callbacks.
 *
 * Threads: PMIx calls the server module's functions from its own progress thread; the
 * callbacks into Rust only copy their arguments and queue them. Completing a fence
 * (berth_pmix_modex_done) may be called from any thread (PMIx thread-shifts it).
 *
 * Registering and deregistering a step's namespace never wait: PMIx_server_register_nspace,
 * _register_client and _deregister_nspace only queue an event for PMIx's progress thread
 * (PMIX_THREADSHIFT) and return; what they were given is kept (struct reg_op) until their
 * callback. A rank cannot connect before its namespace is known: its registration was
 * queued before the rank was forked, and the progress thread handles the events of its one
 * event base in the order they were activated (libevent's active queue), the connection's
 * after the registration's. Failures come back through on_error (the agent logs them).
 */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dlfcn.h>
#include <pmix.h>
#include <pmix_server.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*berth_fence_fn)(const char *nspace, const char *data, size_t ndata, void *token);
typedef void (*berth_abort_fn)(const char *nspace, uint32_t rank, int status, const char *msg);
typedef void (*berth_finalized_fn)(const char *nspace, uint32_t rank);
typedef void (*berth_error_fn)(const char *nspace, const char *msg);
typedef void (*berth_dmodex_fn)(const char *nspace, uint32_t rank, void *token);
typedef void (*berth_dmodex_data_fn)(uint64_t key, int found, const char *data, size_t ndata);
typedef void (*berth_unsupported_fn)(const char *nspace, uint32_t rank, const char *what);
typedef void (*berth_spawn_fn)(const char *nspace, uint32_t rank, size_t napps, const char *const *cmds,
                               char *const *const *argvs, char *const *const *envs, const char *const *cwds,
                               const int *maxprocs, void *token);

static berth_fence_fn on_fence;
static berth_abort_fn on_abort;
static berth_finalized_fn on_finalized;
static berth_error_fn on_error;
static berth_dmodex_fn on_dmodex;
static berth_dmodex_data_fn on_dmodex_data;
static berth_unsupported_fn on_unsupported;
static berth_spawn_fn on_spawn;

/* Publishing, looking up and connecting (the port exchange and PMIx_Connect of MPI_Comm_spawn,
 * MPI_Publish_name, MPI_Comm_connect/accept): the host carries them to `berth run`.
 *   publish: n values, each a key, its kind (0 a string, 1 bytes) and its bytes;
 *   lookup: NULL-ended keys, whether to wait for them (and how long, seconds; 0 the host's
 *   bound); connect: the procs (namespaces and ranks). */
typedef void (*berth_publish_fn)(const char *nspace, uint32_t rank, size_t n, const char *const *keys,
                                 const int *kinds, const char *const *datas, const size_t *lens, int first_read,
                                 void *token);
typedef void (*berth_lookup_fn)(const char *nspace, uint32_t rank, char **keys, int wait, int timeout, void *token);
typedef void (*berth_connect_fn)(size_t n, const char *const *nspaces, const uint32_t *ranks, void *token);
static berth_publish_fn on_publish;
static berth_lookup_fn on_lookup;
static berth_connect_fn on_connect;

struct op_token {
    pmix_op_cbfunc_t cbfunc;
    void *cbdata;
};

struct lookup_token {
    pmix_lookup_cbfunc_t cbfunc;
    void *cbdata;
};

void berth_pmix_deregister(const char *nspace);

struct fence_token {
    pmix_modex_cbfunc_t cbfunc;
    void *cbdata;
};

static pmix_status_t s_client_connected(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                        void *cbdata)
{
    (void)proc; (void)obj; (void)cbfunc; (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t s_client_finalized(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                        void *cbdata)
{
    (void)obj; (void)cbfunc; (void)cbdata;
    if (on_finalized != NULL) {
        on_finalized(proc->nspace, proc->rank);
    }
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t s_abort(const pmix_proc_t *proc, void *obj, int status, const char msg[],
                             pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)obj; (void)procs; (void)nprocs; (void)cbfunc; (void)cbdata;
    /* Whatever procs it names, an abort ends the whole step (as MPI_Abort under PMI-1). The
     * client is released at once; the step's end follows from the shepherd. */
    on_abort(proc->nspace, proc->rank, status, msg == NULL ? "" : msg);
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t s_fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                                void *cbdata)
{
    (void)info; (void)ninfo;
    if (nprocs == 0 || procs == NULL) {
        return PMIX_ERR_BAD_PARAM;
    }
    struct fence_token *t = malloc(sizeof(*t));
    if (t == NULL) {
        return PMIX_ERR_NOMEM;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_fence(procs[0].nspace, data, ndata, t);
    return PMIX_SUCCESS;
}

/* A client registered an event handler for `codes`: libpmix asks the host for the
 * environmental ones. berth raises its events itself (berth_pmix_notify_lost), so it accepts
 * them all; without this upcall libpmix refuses every client's registration
 * (PMIX_ERR_SERVER_FAILED_REQUEST) and no handler of a rank ever runs. */
static pmix_status_t s_register_events(pmix_status_t *codes, size_t ncodes, const pmix_info_t info[], size_t ninfo,
                                       pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)codes; (void)ncodes; (void)info; (void)ninfo; (void)cbfunc; (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t s_deregister_events(pmix_status_t *codes, size_t ncodes, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)codes; (void)ncodes; (void)cbfunc; (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

/* A local client PMIx_Get's a key of a rank of `proc->nspace` that this server holds no data
 * for (a remote rank, and no fence brought its data: Open MPI with pmix_base_collect_data=0,
 * or async modex): the host asks the rank's node (on_dmodex, through the control tree) and
 * completes the token with that node's PMIx_server_dmodex_request blob
 * (berth_pmix_modex_done). libpmix files the blob under the proc and answers every local
 * client waiting for it. */
static pmix_status_t s_direct_modex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                                    pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    (void)info; (void)ninfo;
    if (proc == NULL || on_dmodex == NULL) {
        return PMIX_ERR_BAD_PARAM;
    }
    struct fence_token *t = malloc(sizeof(*t));
    if (t == NULL) {
        return PMIX_ERR_NOMEM;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_dmodex(proc->nspace, proc->rank, t);
    return PMIX_SUCCESS;
}

/* What berth refuses (a published value neither a string nor bytes; an upcall whose host
 * callback is not set) is answered PMIX_ERR_NOT_SUPPORTED through its callback (the way every
 * answer reaches the client; a host's upcall that is missing or returns an error left Open MPI
 * 4.1.4's MPI_Comm_spawn waiting forever), and the step is told (on_unsupported: the agent
 * logs it and `berth run` prints it). */
static void unsupported(const pmix_proc_t *proc, const char *what)
{
    if (on_unsupported != NULL && proc != NULL) {
        on_unsupported(proc->nspace, proc->rank, what);
    }
}

struct spawn_token {
    pmix_spawn_cbfunc_t cbfunc;
    void *cbdata;
};

/* PMIx_Spawn (MPI_Comm_spawn): the programs are copied to the host (on_spawn, which reads them
 * during the call only), which starts them as a new step of the job and completes the token
 * (berth_pmix_spawn_done) with the new step's namespace once its ranks run, or with an error.
 * The job-level directives (mapping, ...) are not read: berth places the children as it
 * places any step. */
static pmix_status_t s_spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
                             const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cbfunc, void *cbdata)
{
    (void)job_info; (void)ninfo;
    if (proc == NULL || cbfunc == NULL || apps == NULL || napps == 0) {
        return PMIX_ERR_BAD_PARAM;
    }
    if (on_spawn == NULL) {
        unsupported(proc, "PMIx_Spawn (MPI_Comm_spawn)");
        cbfunc(PMIX_ERR_NOT_SUPPORTED, NULL, cbdata);
        return PMIX_SUCCESS;
    }
    struct spawn_token *t = malloc(sizeof(*t));
    const char **cmds = calloc(napps, sizeof(*cmds));
    char *const **argvs = calloc(napps, sizeof(*argvs));
    char *const **envs = calloc(napps, sizeof(*envs));
    const char **cwds = calloc(napps, sizeof(*cwds));
    int *maxprocs = calloc(napps, sizeof(*maxprocs));
    if (t == NULL || cmds == NULL || argvs == NULL || envs == NULL || cwds == NULL || maxprocs == NULL) {
        free(t); free(cmds); free(argvs); free(envs); free(cwds); free(maxprocs);
        return PMIX_ERR_NOMEM;
    }
    for (size_t i = 0; i < napps; i++) {
        cmds[i] = apps[i].cmd;
        argvs[i] = apps[i].argv;
        envs[i] = apps[i].env;
        cwds[i] = apps[i].cwd;
        maxprocs[i] = apps[i].maxprocs;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_spawn(proc->nspace, proc->rank, napps, cmds, (char *const *const *)argvs, (char *const *const *)envs, cwds,
             maxprocs, t);
    free(cmds); free(argvs); free(envs); free(cwds); free(maxprocs);
    return PMIX_SUCCESS;
}

/* Complete a spawn started by on_spawn: with the children's namespace when `nspace` is not
 * NULL, else with `why` (BERTH_SPAWN_*). */
void berth_pmix_spawn_done(void *token, const char *nspace, int why)
{
    struct spawn_token *t = token;
    if (nspace != NULL) {
        pmix_nspace_t ns;
        PMIX_LOAD_NSPACE(ns, nspace);
        t->cbfunc(PMIX_SUCCESS, ns, t->cbdata);
    } else {
        pmix_status_t st = why == 2 ? PMIX_ERR_TIMEOUT : why == 3 ? PMIX_ERR_NOT_SUPPORTED : PMIX_ERR_JOB_FAILED_TO_LAUNCH;
        t->cbfunc(st, NULL, t->cbdata);
    }
    free(t);
}

/* PMIx_Connect: libpmix calls once every local participant is in; the host completes the
 * token (berth_pmix_op_done) once every node hosting a participant has called, across
 * namespaces (`berth run` gathers them). */
static pmix_status_t s_connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)info; (void)ninfo;
    if (procs == NULL || nprocs == 0 || cbfunc == NULL) {
        return PMIX_ERR_BAD_PARAM;
    }
    if (on_connect == NULL) {
        unsupported(&procs[0], "PMIx_Connect (MPI_Comm_connect/accept, MPI_Comm_spawn)");
        cbfunc(PMIX_ERR_NOT_SUPPORTED, cbdata);
        return PMIX_SUCCESS;
    }
    struct op_token *t = malloc(sizeof(*t));
    const char **nspaces = calloc(nprocs, sizeof(*nspaces));
    uint32_t *ranks = calloc(nprocs, sizeof(*ranks));
    if (t == NULL || nspaces == NULL || ranks == NULL) {
        free(t); free(nspaces); free(ranks);
        return PMIX_ERR_NOMEM;
    }
    for (size_t i = 0; i < nprocs; i++) {
        nspaces[i] = procs[i].nspace;
        ranks[i] = procs[i].rank;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_connect(nprocs, nspaces, ranks, t);
    free(nspaces);
    free(ranks);
    return PMIX_SUCCESS;
}

/* PMIx_Disconnect (MPI_Comm_disconnect, which synchronises its communicator itself first):
 * berth keeps no state for a connection, so it completes at once. */
static pmix_status_t s_disconnect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[], size_t ninfo,
                                  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)procs; (void)nprocs; (void)info; (void)ninfo;
    if (cbfunc == NULL) {
        return PMIX_OPERATION_SUCCEEDED;
    }
    cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
}

/* Complete a publish or a connect: 0 done, 1 failed, 2 timed out, 3 not found. */
void berth_pmix_op_done(void *token, int why)
{
    struct op_token *t = token;
    pmix_status_t st = why == 0 ? PMIX_SUCCESS : why == 2 ? PMIX_ERR_TIMEOUT : why == 3 ? PMIX_ERR_NOT_FOUND : PMIX_ERROR;
    t->cbfunc(st, t->cbdata);
    free(t);
}

/* PMIx_Publish: string and byte-object values (what Open MPI publishes); directives (PMIx's
 * own "pmix." keys: PMIX_PERSISTENCE, first read deletes, is read) are not published. */
static pmix_status_t s_publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                               pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    if (proc == NULL || cbfunc == NULL) {
        return PMIX_ERR_BAD_PARAM;
    }
    if (on_publish == NULL) {
        unsupported(proc, "PMIx_Publish (MPI_Publish_name, the port exchange of MPI_Comm_spawn)");
        cbfunc(PMIX_ERR_NOT_SUPPORTED, cbdata);
        return PMIX_SUCCESS;
    }
    size_t n = 0;
    int first_read = 0;
    const char **keys = calloc(ninfo + 1, sizeof(*keys));
    int *kinds = calloc(ninfo + 1, sizeof(*kinds));
    const char **datas = calloc(ninfo + 1, sizeof(*datas));
    size_t *lens = calloc(ninfo + 1, sizeof(*lens));
    struct op_token *t = malloc(sizeof(*t));
    if (keys == NULL || kinds == NULL || datas == NULL || lens == NULL || t == NULL) {
        free(keys); free(kinds); free(datas); free(lens); free(t);
        return PMIX_ERR_NOMEM;
    }
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_PERSISTENCE)) {
            first_read = info[i].value.type == PMIX_PERSIST && info[i].value.data.persist == PMIX_PERSIST_FIRST_READ;
            continue;
        }
        if (strncmp(info[i].key, "pmix.", 5) == 0) {
            /* A directive (PMIX_RANGE, PMIX_TIMEOUT, and the PMIX_USERID/PMIX_GRPID libpmix
             * adds), not a value. */
            continue;
        }
        if (info[i].value.type == PMIX_STRING && info[i].value.data.string != NULL) {
            kinds[n] = 0;
            datas[n] = info[i].value.data.string;
            lens[n] = strlen(info[i].value.data.string);
        } else if (info[i].value.type == PMIX_BYTE_OBJECT) {
            kinds[n] = 1;
            datas[n] = info[i].value.data.bo.bytes;
            lens[n] = info[i].value.data.bo.size;
        } else {
            free(keys); free(kinds); free(datas); free(lens); free(t);
            unsupported(proc, "PMIx_Publish of a value neither a string nor bytes");
            cbfunc(PMIX_ERR_NOT_SUPPORTED, cbdata);
            return PMIX_SUCCESS;
        }
        keys[n] = info[i].key;
        n++;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_publish(proc->nspace, proc->rank, n, keys, kinds, datas, lens, first_read, t);
    free(keys); free(kinds); free(datas); free(lens);
    return PMIX_SUCCESS;
}

/* PMIx_Lookup: the keys, whether to wait for them (PMIX_WAIT) and for how long (PMIX_TIMEOUT,
 * seconds). */
static pmix_status_t s_lookup(const pmix_proc_t *proc, char **keys, const pmix_info_t info[], size_t ninfo,
                              pmix_lookup_cbfunc_t cbfunc, void *cbdata)
{
    if (proc == NULL || cbfunc == NULL || keys == NULL) {
        return PMIX_ERR_BAD_PARAM;
    }
    if (on_lookup == NULL) {
        unsupported(proc, "PMIx_Lookup (MPI_Lookup_name, the port exchange of MPI_Comm_spawn)");
        cbfunc(PMIX_ERR_NOT_SUPPORTED, NULL, 0, cbdata);
        return PMIX_SUCCESS;
    }
    int wait = 0, timeout = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_WAIT)) {
            wait = info[i].value.type == PMIX_BOOL ? info[i].value.data.flag : 1;
        } else if (PMIX_CHECK_KEY(&info[i], PMIX_TIMEOUT) && info[i].value.type == PMIX_INT) {
            timeout = info[i].value.data.integer;
        }
    }
    struct lookup_token *t = malloc(sizeof(*t));
    if (t == NULL) {
        return PMIX_ERR_NOMEM;
    }
    t->cbfunc = cbfunc;
    t->cbdata = cbdata;
    on_lookup(proc->nspace, proc->rank, keys, wait, timeout, t);
    return PMIX_SUCCESS;
}

/* Complete a lookup: n values found (each its key, kind, bytes and publisher), or `why`
 * (as berth_pmix_op_done's) with none. libpmix packs the data during the callback. */
void berth_pmix_lookup_done(void *token, int why, size_t n, const char *const *keys, const int *kinds,
                            const char *const *datas, const size_t *lens, const char *const *pub_nspaces,
                            const uint32_t *pub_ranks)
{
    struct lookup_token *t = token;
    if (why != 0 || n == 0) {
        pmix_status_t st = why == 0 || why == 3 ? PMIX_ERR_NOT_FOUND : why == 2 ? PMIX_ERR_TIMEOUT : PMIX_ERROR;
        t->cbfunc(st, NULL, 0, t->cbdata);
        free(t);
        return;
    }
    pmix_pdata_t *pdata;
    PMIX_PDATA_CREATE(pdata, n);
    if (pdata == NULL) {
        t->cbfunc(PMIX_ERR_NOMEM, NULL, 0, t->cbdata);
        free(t);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        pmix_proc_t src;
        PMIX_PROC_LOAD(&src, pub_nspaces[i], pub_ranks[i]);
        if (kinds[i] == 1) {
            pmix_byte_object_t bo;
            bo.bytes = (char *)datas[i];
            bo.size = lens[i];
            PMIX_PDATA_LOAD(&pdata[i], &src, keys[i], &bo, PMIX_BYTE_OBJECT);
        } else {
            PMIX_PDATA_LOAD(&pdata[i], &src, keys[i], datas[i], PMIX_STRING);
        }
    }
    t->cbfunc(PMIX_SUCCESS, pdata, n, t->cbdata);
    PMIX_PDATA_FREE(pdata, n);
    free(t);
}

static pmix_server_module_t module = {
    .client_connected = s_client_connected,
    .client_finalized = s_client_finalized,
    .abort = s_abort,
    .fence_nb = s_fence_nb,
    .direct_modex = s_direct_modex,
    .spawn = s_spawn,
    .publish = s_publish,
    .lookup = s_lookup,
    .connect = s_connect,
    .disconnect = s_disconnect,
    .register_events = s_register_events,
    .deregister_events = s_deregister_events,
};

static void release_blob(void *cbdata)
{
    free(cbdata);
}

/* Why a fence or a direct modex ends without data (berth_pmix_modex_done's `why`). */
enum {
    BERTH_MODEX_OK = 0,
    BERTH_MODEX_FAILED = 1,
    BERTH_MODEX_NOT_FOUND = 2,
    BERTH_MODEX_TIMEOUT = 3,
};

/* Complete a fence started by on_fence, or a direct modex started by on_dmodex: with `data`
 * (a fence: every node's, concatenated; a direct modex: the rank's node's blob) when `why` is
 * BERTH_MODEX_OK, else with the PMIx error it stands for. */
void berth_pmix_modex_done(void *token, int why, const char *data, size_t ndata)
{
    struct fence_token *t = token;
    if (why != BERTH_MODEX_OK) {
        pmix_status_t st = why == BERTH_MODEX_NOT_FOUND ? PMIX_ERR_NOT_FOUND
                         : why == BERTH_MODEX_TIMEOUT   ? PMIX_ERR_TIMEOUT
                                                        : PMIX_ERROR;
        t->cbfunc(st, NULL, 0, t->cbdata, NULL, NULL);
        free(t);
        return;
    }
    char *copy = malloc(ndata > 0 ? ndata : 1);
    if (copy == NULL) {
        t->cbfunc(PMIX_ERR_NOMEM, NULL, 0, t->cbdata, NULL, NULL);
        free(t);
        return;
    }
    if (ndata > 0) {
        memcpy(copy, data, ndata);
    }
    t->cbfunc(PMIX_SUCCESS, copy, ndata, t->cbdata, release_blob, copy);
    free(t);
}

/* A direct modex asked of this node: libpmix's answer for its local rank. The blob is
 * libpmix's, valid during this call only: on_dmodex_data copies it. */
static void dmodex_answered(pmix_status_t status, char *data, size_t sz, void *cbdata)
{
    uint64_t key = (uint64_t)(uintptr_t)cbdata;
    if (on_dmodex_data != NULL) {
        on_dmodex_data(key, status == PMIX_SUCCESS, data, status == PMIX_SUCCESS ? sz : 0);
    }
}

/* Another node asks for local rank `rank`'s data: libpmix answers through on_dmodex_data with
 * `key` once the rank has committed it (at once when it has). Returns 0, or -1 when libpmix
 * refused the request (no answer follows). */
int berth_pmix_dmodex_request(const char *nspace, uint32_t rank, uint64_t key)
{
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, nspace, rank);
    pmix_status_t rc = PMIx_server_dmodex_request(&proc, dmodex_answered, (void *)(uintptr_t)key);
    return rc == PMIX_SUCCESS ? 0 : -1;
}

struct waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done;
    pmix_status_t status;
};

static void op_done(pmix_status_t status, void *cbdata)
{
    struct waiter *w = cbdata;
    pthread_mutex_lock(&w->m);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

static void waiter_init(struct waiter *w)
{
    pthread_mutex_init(&w->m, NULL);
    pthread_cond_init(&w->c, NULL);
    w->done = 0;
    w->status = PMIX_SUCCESS;
}

/* Wait for an operation that returned `rc` and calls op_done with `w` when it completes. */
static pmix_status_t waiter_wait(struct waiter *w, pmix_status_t rc)
{
    if (rc == PMIX_OPERATION_SUCCEEDED) {
        rc = PMIX_SUCCESS;
    } else if (rc == PMIX_SUCCESS) {
        pthread_mutex_lock(&w->m);
        while (!w->done) {
            pthread_cond_wait(&w->c, &w->m);
        }
        rc = w->status;
        pthread_mutex_unlock(&w->m);
    }
    pthread_mutex_destroy(&w->m);
    pthread_cond_destroy(&w->c);
    return rc;
}

/* A non-blocking registration in flight: what PMIx must be given until its callback. */
struct reg_op {
    pmix_info_t *info;
    size_t ninfo;
    const char *what;
    char nspace[PMIX_MAX_NSLEN + 1];
};

static void reg_done(pmix_status_t status, void *cbdata)
{
    struct reg_op *op = cbdata;
    if (status != PMIX_SUCCESS && status != PMIX_OPERATION_SUCCEEDED && on_error != NULL) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s failed: %s (%d)", op->what, PMIx_Error_string(status), status);
        on_error(op->nspace, msg);
    }
    if (op->info != NULL) {
        PMIX_INFO_FREE(op->info, op->ninfo);
    }
    free(op);
}

static struct reg_op *reg_op_new(const char *nspace, const char *what, pmix_info_t *info, size_t ninfo)
{
    struct reg_op *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        return NULL;
    }
    op->info = info;
    op->ninfo = ninfo;
    op->what = what;
    snprintf(op->nspace, sizeof op->nspace, "%s", nspace);
    return op;
}

/* The outcome of starting a non-blocking operation whose callback is reg_done(op): PMIX_SUCCESS
 * (the callback follows), done at once (no callback follows: called here), or an error (no
 * callback either: `op` is released and the error returned). */
static pmix_status_t reg_started(pmix_status_t rc, struct reg_op *op)
{
    if (rc == PMIX_SUCCESS) {
        return PMIX_SUCCESS;
    }
    if (rc == PMIX_OPERATION_SUCCEEDED) {
        reg_done(PMIX_SUCCESS, op);
        return PMIX_SUCCESS;
    }
    if (op->info != NULL) {
        PMIX_INFO_FREE(op->info, op->ninfo);
    }
    free(op);
    return rc;
}

/* Every event libpmix's server hands its clients passes through
 * pmix_server_notify_client_of_event: the events berth raises (berth_pmix_notify_lost,
 * berth_pmix_notify_node_down) and those a rank sends (PMIx_Notify_event from a client,
 * relayed by libpmix to the other clients on the node). libpmix 4.2 delivers an event of
 * range NAMESPACE, SESSION or GLOBAL without a PMIX_EVENT_CUSTOM_RANGE to every client that
 * registered for its code, whatever its namespace: one step's events (and a rank's forged
 * ones) would reach another step's, another user's, handlers. libpmix calls this function
 * through its PLT, so this definition (the executable's) is the one bound: it confines every
 * event whose source is a namespace's process to that namespace (PMIX_RANGE_CUSTOM, its
 * namespace with PMIX_RANK_WILDCARD), whatever range and targets were asked, then calls
 * libpmix's own (real_notify, found in berth_pmix_init). An event of no namespace (libpmix's
 * own), or for the source itself (PROC_LOCAL) or the host (RM), passes unchanged. */
typedef pmix_status_t (*berth_notify_fn)(pmix_status_t status, const pmix_proc_t *source, pmix_data_range_t range,
                                         const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc,
                                         void *cbdata);
static berth_notify_fn real_notify;

pmix_status_t pmix_server_notify_client_of_event(pmix_status_t status, const pmix_proc_t *source,
                                                 pmix_data_range_t range, const pmix_info_t info[], size_t ninfo,
                                                 pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    if (real_notify == NULL) {
        return PMIX_ERR_NOT_SUPPORTED;
    }
    if (source == NULL || source->nspace[0] == '\0' || range == PMIX_RANGE_PROC_LOCAL || range == PMIX_RANGE_RM) {
        return real_notify(status, source, range, info, ninfo, cbfunc, cbdata);
    }
    pmix_info_t *scoped;
    PMIX_INFO_CREATE(scoped, ninfo + 1);
    if (scoped == NULL) {
        return PMIX_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_CUSTOM_RANGE)) {
            continue;
        }
        PMIX_INFO_XFER(&scoped[n], (pmix_info_t *)&info[i]);
        n++;
    }
    pmix_data_array_t *arr;
    PMIX_DATA_ARRAY_CREATE(arr, 1, PMIX_PROC);
    pmix_proc_t *all = arr->array;
    PMIX_PROC_LOAD(&all[0], source->nspace, PMIX_RANK_WILDCARD);
    PMIX_INFO_LOAD(&scoped[n], PMIX_EVENT_CUSTOM_RANGE, arr, PMIX_DATA_ARRAY);
    PMIX_DATA_ARRAY_FREE(arr);
    n++;
    /* libpmix copies what it is given before it returns (it queues its own copy). */
    pmix_status_t rc = real_notify(status, source, PMIX_RANGE_CUSTOM, scoped, n, cbfunc, cbdata);
    PMIX_INFO_FREE(scoped, ninfo + 1);
    return rc;
}

static void say(char *err, size_t errlen, const char *what, pmix_status_t rc)
{
    snprintf(err, errlen, "%s failed: %s (%d)", what, PMIx_Error_string(rc), rc);
}

/* Start the server (once per process). `tmpdir`: where its rendezvous sockets go. */
int berth_pmix_init(const char *tmpdir, berth_fence_fn fence, berth_abort_fn abort_fn,
                    berth_finalized_fn finalized, berth_error_fn error_fn, berth_dmodex_fn dmodex,
                    berth_dmodex_data_fn dmodex_data, berth_unsupported_fn unsupported_fn, berth_spawn_fn spawn,
                    berth_publish_fn publish, berth_lookup_fn lookup, berth_connect_fn connect, char *err,
                    size_t errlen)
{
    on_unsupported = unsupported_fn;
    on_spawn = spawn;
    on_publish = publish;
    on_lookup = lookup;
    on_connect = connect;
    on_fence = fence;
    on_dmodex = dmodex;
    on_dmodex_data = dmodex_data;
    on_abort = abort_fn;
    on_finalized = finalized;
    on_error = error_fn;
    /* libpmix's own delivery, behind the confinement above: without it, no server (a step's
     * events would reach other steps' ranks). */
    real_notify = (berth_notify_fn)dlsym(RTLD_NEXT, "pmix_server_notify_client_of_event");
    if (real_notify == NULL || real_notify == pmix_server_notify_client_of_event) {
        snprintf(err, errlen, "this libpmix has no pmix_server_notify_client_of_event to confine events with");
        return -1;
    }
    pmix_info_t *info;
    bool no = false;
    PMIX_INFO_CREATE(info, 4);
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[2], PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[3], PMIX_SERVER_SYSTEM_SUPPORT, &no, PMIX_BOOL);
    pmix_status_t rc = PMIx_server_init(&module, info, 4);
    PMIX_INFO_FREE(info, 4);
    if (rc != PMIX_SUCCESS) {
        say(err, errlen, "PMIx_server_init", rc);
        return -1;
    }
    return 0;
}

/* A bound local rank's PMIX_CPUSET and PMIX_LOCALITY_STRING, from its host CPUs `cpus` (a
 * list such as "0-1,4"), as libpmix itself formats them ("hwloc:0-1,4" and e.g.
 * "SK0:L30:L20-1:L10-1:CR0-1:HT0-1:NM0", from the server's view of this host's topology).
 * Returns 0, or -1 with `err` set (both strings then NULL). */
int berth_pmix_rank_binding(const char *cpus, char **cpuset, char **locality, char *err, size_t errlen)
{
    *cpuset = NULL;
    *locality = NULL;
    char spec[1024];
    if ((size_t)snprintf(spec, sizeof spec, "hwloc:%s", cpus) >= sizeof spec) {
        snprintf(err, errlen, "CPU list %.40s... too long", cpus);
        return -1;
    }
    pmix_cpuset_t cs;
    PMIX_CPUSET_CONSTRUCT(&cs);
    pmix_status_t rc = PMIx_Parse_cpuset_string(spec, &cs);
    if (rc != PMIX_SUCCESS) {
        snprintf(err, errlen, "PMIx_Parse_cpuset_string(%s) failed: %s (%d)", spec, PMIx_Error_string(rc), rc);
        return -1;
    }
    rc = PMIx_server_generate_cpuset_string(&cs, cpuset);
    if (rc == PMIX_SUCCESS) {
        rc = PMIx_server_generate_locality_string(&cs, locality);
    }
    PMIx_Cpuset_destruct(&cs);
    if (rc != PMIX_SUCCESS || *cpuset == NULL || *locality == NULL) {
        free(*cpuset);
        free(*locality);
        *cpuset = NULL;
        *locality = NULL;
        snprintf(err, errlen, "PMIx cannot describe CPUs %s: %s (%d)", cpus, PMIx_Error_string(rc), rc);
        return -1;
    }
    return 0;
}

/* Register a step's namespace and its local clients.
 *   nodes[nnodes]: node names in node order; me: this node's index;
 *   rank_node[size], rank_local[size]: each rank's node index and its index among its node's ranks;
 *   rank_app[size]: each rank's application number (MPMD: its program), below napps; NULL: all 0;
 *   rank_cpus[size]: each local bound rank's host CPUs as a list ("0-1,4"), NULL for the others
 *   (remote or unbound; rank_cpus itself may be NULL): its PMIX_CPUSET and
 *   PMIX_LOCALITY_STRING, from which Open MPI computes its local peers' relative locality. */
int berth_pmix_register(const char *nspace, const char *jobid, uint32_t size, const uint32_t *rank_app, uint32_t napps,
                        const char *const *nodes, uint32_t nnodes, uint32_t me, const uint32_t *rank_node,
                        const uint32_t *rank_local, const char *const *rank_cpus, const char *nsdir, uint32_t uid,
                        uint32_t gid, const char *parent_nspace, uint32_t parent_rank, char *err, size_t errlen)
{
    pmix_status_t rc;
    /* Node names "a,b,c" and ranks per node "0,1;2,3" for PMIx's own regular expressions. */
    size_t hl = 1;
    for (uint32_t n = 0; n < nnodes; n++) {
        hl += strlen(nodes[n]) + 1;
    }
    char *hosts = calloc(1, hl);
    char *ppn = calloc(1, (size_t)size * 12 + nnodes + 1);
    char *peers = calloc(1, (size_t)size * 12 + 1);
    if (hosts == NULL || ppn == NULL || peers == NULL) {
        free(hosts); free(ppn); free(peers);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint32_t nlocal = 0, leader = UINT32_MAX;
    for (uint32_t n = 0; n < nnodes; n++) {
        if (n > 0) {
            strcat(hosts, ",");
            strcat(ppn, ";");
        }
        strcat(hosts, nodes[n]);
        int first = 1;
        for (uint32_t r = 0; r < size; r++) {
            if (rank_node[r] != n) {
                continue;
            }
            char num[16];
            snprintf(num, sizeof num, "%s%u", first ? "" : ",", r);
            strcat(ppn, num);
            first = 0;
            if (n == me) {
                snprintf(num, sizeof num, "%s%u", nlocal == 0 ? "" : ",", r);
                strcat(peers, num);
                if (leader == UINT32_MAX) {
                    leader = r;
                }
                nlocal++;
            }
        }
    }
    if (napps == 0 || rank_app == NULL) {
        napps = 1;
        rank_app = NULL;
    }
    /* Per application: its size and its lowest rank (PMIX_APP_SIZE, PMIX_APPLDR); per rank its
     * rank within its application (PMIX_APP_RANK). */
    uint32_t *app_size = calloc(napps, sizeof *app_size);
    uint32_t *app_ldr = calloc(napps, sizeof *app_ldr);
    uint32_t *app_rank = calloc(size ? size : 1, sizeof *app_rank);
    if (app_size == NULL || app_ldr == NULL || app_rank == NULL) {
        free(hosts); free(ppn); free(peers); free(app_size); free(app_ldr); free(app_rank);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (uint32_t a = 0; a < napps; a++) {
        app_ldr[a] = UINT32_MAX;
    }
    for (uint32_t r = 0; r < size; r++) {
        uint32_t a = rank_app ? rank_app[r] : 0;
        if (a >= napps) {
            free(hosts); free(ppn); free(peers); free(app_size); free(app_ldr); free(app_rank);
            snprintf(err, errlen, "rank %u has application number %u, not below %u", r, a, napps);
            return -1;
        }
        if (app_ldr[a] == UINT32_MAX) {
            app_ldr[a] = r;
        }
        app_rank[r] = app_size[a]++;
    }
    char *node_map = NULL, *proc_map = NULL;
    rc = PMIx_generate_regex(hosts, &node_map);
    if (rc == PMIX_SUCCESS) {
        rc = PMIx_generate_ppn(ppn, &proc_map);
    }
    free(hosts);
    free(ppn);
    if (rc != PMIX_SUCCESS) {
        free(peers);
        free(node_map);
        free(app_size); free(app_ldr); free(app_rank);
        say(err, errlen, "PMIx_generate_regex", rc);
        return -1;
    }
    size_t njob = 19, ninfo = njob + napps + size;
    pmix_info_t *info;
    PMIX_INFO_CREATE(info, ninfo);
    size_t k = 0;
    pmix_rank_t zero_rank = 0, ldr = leader == UINT32_MAX ? 0 : leader;
    PMIX_INFO_LOAD(&info[k++], PMIX_UNIV_SIZE, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_JOB_SIZE, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_MAX_PROCS, &size, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_JOBID, jobid, PMIX_STRING);
    PMIX_INFO_LOAD(&info[k++], PMIX_NUM_NODES, &nnodes, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_NODE_MAP, node_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[k++], PMIX_PROC_MAP, proc_map, PMIX_REGEX);
    PMIX_INFO_LOAD(&info[k++], PMIX_JOB_NUM_APPS, &napps, PMIX_UINT32);
    if (napps == 1) {
        /* One program: its data at job level, as before MPMD. */
        PMIX_INFO_LOAD(&info[k++], PMIX_APPLDR, &zero_rank, PMIX_PROC_RANK);
        PMIX_INFO_LOAD(&info[k++], PMIX_APP_SIZE, &size, PMIX_UINT32);
    } else {
        /* MPMD: one PMIX_APP_INFO_ARRAY per program, PMIX_APPNUM first (what the hash store
         * files it under). */
        for (uint32_t a = 0; a < napps; a++) {
            pmix_data_array_t *arr;
            PMIX_DATA_ARRAY_CREATE(arr, 3, PMIX_INFO);
            pmix_info_t *p = arr->array;
            pmix_rank_t aldr = app_ldr[a] == UINT32_MAX ? 0 : app_ldr[a];
            PMIX_INFO_LOAD(&p[0], PMIX_APPNUM, &a, PMIX_UINT32);
            PMIX_INFO_LOAD(&p[1], PMIX_APP_SIZE, &app_size[a], PMIX_UINT32);
            PMIX_INFO_LOAD(&p[2], PMIX_APPLDR, &aldr, PMIX_PROC_RANK);
            PMIX_INFO_LOAD(&info[k++], PMIX_APP_INFO_ARRAY, arr, PMIX_DATA_ARRAY);
            PMIX_DATA_ARRAY_FREE(arr);
        }
    }
    PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_SIZE, &nlocal, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_NODE_SIZE, &nlocal, PMIX_UINT32);
    PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_PEERS, peers, PMIX_STRING);
    if (rank_cpus != NULL) {
        /* The local ranks' CPU lists in PMIX_LOCAL_PEERS's order, colon-separated, "UNBOUND"
         * for an unbound one (Open MPI 4.0 read this; 4.1 reads the locality strings). */
        size_t cl = 1;
        for (uint32_t r = 0; r < size; r++) {
            if (rank_node[r] == me) {
                cl += (rank_cpus[r] != NULL ? strlen(rank_cpus[r]) : 7) + 1;
            }
        }
        char *lcpus = calloc(1, cl);
        if (lcpus != NULL) {
            int first = 1;
            for (uint32_t r = 0; r < size; r++) {
                if (rank_node[r] == me) {
                    if (!first) {
                        strcat(lcpus, ":");
                    }
                    first = 0;
                    strcat(lcpus, rank_cpus[r] != NULL ? rank_cpus[r] : "UNBOUND");
                }
            }
            PMIX_INFO_LOAD(&info[k++], PMIX_LOCAL_CPUSETS, lcpus, PMIX_STRING);
            free(lcpus);
        }
    }
    PMIX_INFO_LOAD(&info[k++], PMIX_LOCALLDR, &ldr, PMIX_PROC_RANK);
    PMIX_INFO_LOAD(&info[k++], PMIX_HOSTNAME, nodes[me], PMIX_STRING);
    PMIX_INFO_LOAD(&info[k++], PMIX_NSDIR, nsdir, PMIX_STRING);
    if (parent_nspace != NULL) {
        /* The step is the children of a PMIx_Spawn: who spawned them (Open MPI's
         * MPI_Comm_get_parent, and its connection to the parent, start from it). */
        pmix_proc_t parent;
        bool yes = true;
        PMIX_PROC_LOAD(&parent, parent_nspace, parent_rank);
        PMIX_INFO_LOAD(&info[k++], PMIX_PARENT_ID, &parent, PMIX_PROC);
        PMIX_INFO_LOAD(&info[k++], PMIX_SPAWNED, &yes, PMIX_BOOL);
    }
    free(peers);
    free(node_map);
    free(proc_map);
    /* Every rank's own data, remote ones included (no direct modex is needed for them); a
     * bound local rank's binding too. */
    for (uint32_t r = 0; r < size; r++) {
        char *cpuset = NULL, *locality = NULL;
        if (rank_cpus != NULL && rank_cpus[r] != NULL && rank_node[r] == me) {
            char why[256];
            if (berth_pmix_rank_binding(rank_cpus[r], &cpuset, &locality, why, sizeof why) != 0 && on_error != NULL) {
                /* The rank runs without them, as an unbound one (Open MPI: on the node). */
                char msg[320];
                snprintf(msg, sizeof msg, "rank %u gets no PMIX_CPUSET/PMIX_LOCALITY_STRING: %s", r, why);
                on_error(nspace, msg);
            }
        }
        pmix_data_array_t *arr;
        PMIX_DATA_ARRAY_CREATE(arr, cpuset != NULL ? 10 : 8, PMIX_INFO);
        pmix_info_t *p = arr->array;
        pmix_rank_t rank = r, arank = app_rank[r];
        uint32_t appnum = rank_app ? rank_app[r] : 0;
        uint16_t local = (uint16_t)rank_local[r];
        uint32_t nodeid = rank_node[r];
        PMIX_INFO_LOAD(&p[0], PMIX_RANK, &rank, PMIX_PROC_RANK);
        PMIX_INFO_LOAD(&p[1], PMIX_APPNUM, &appnum, PMIX_UINT32);
        PMIX_INFO_LOAD(&p[2], PMIX_GLOBAL_RANK, &rank, PMIX_PROC_RANK);
        PMIX_INFO_LOAD(&p[3], PMIX_APP_RANK, &arank, PMIX_PROC_RANK);
        PMIX_INFO_LOAD(&p[4], PMIX_LOCAL_RANK, &local, PMIX_UINT16);
        PMIX_INFO_LOAD(&p[5], PMIX_NODE_RANK, &local, PMIX_UINT16);
        PMIX_INFO_LOAD(&p[6], PMIX_NODEID, &nodeid, PMIX_UINT32);
        PMIX_INFO_LOAD(&p[7], PMIX_HOSTNAME, nodes[nodeid < nnodes ? nodeid : 0], PMIX_STRING);
        if (cpuset != NULL) {
            PMIX_INFO_LOAD(&p[8], PMIX_CPUSET, cpuset, PMIX_STRING);
            PMIX_INFO_LOAD(&p[9], PMIX_LOCALITY_STRING, locality, PMIX_STRING);
            free(cpuset);
            free(locality);
        }
        PMIX_INFO_LOAD(&info[k++], PMIX_PROC_DATA, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
    }
    free(app_size);
    free(app_ldr);
    free(app_rank);
    /* Queued, not waited for (see the top of this file); `info` is released by reg_done. */
    struct reg_op *op = reg_op_new(nspace, "PMIx_server_register_nspace", info, ninfo);
    if (op == NULL) {
        PMIX_INFO_FREE(info, ninfo);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pmix_nspace_t ns;
    PMIX_LOAD_NSPACE(ns, nspace);
    rc = reg_started(PMIx_server_register_nspace(ns, (int)nlocal, info, k, reg_done, op), op);
    if (rc != PMIX_SUCCESS) {
        say(err, errlen, "PMIx_server_register_nspace", rc);
        return -1;
    }
    for (uint32_t r = 0; r < size; r++) {
        if (rank_node[r] != me) {
            continue;
        }
        pmix_proc_t proc;
        PMIX_PROC_LOAD(&proc, nspace, r);
        op = reg_op_new(nspace, "PMIx_server_register_client", NULL, 0);
        rc = op == NULL ? PMIX_ERR_NOMEM
                        : reg_started(PMIx_server_register_client(&proc, uid, gid, NULL, reg_done, op), op);
        if (rc != PMIX_SUCCESS) {
            say(err, errlen, "PMIx_server_register_client", rc);
            berth_pmix_deregister(nspace);
            return -1;
        }
    }
    return 0;
}

/* The environment a local rank needs to reach the server: "KEY=VALUE" strings, NULL-ended,
 * freed with berth_pmix_free_env. */
int berth_pmix_setup_fork(const char *nspace, uint32_t rank, char ***env, char *err, size_t errlen)
{
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, nspace, rank);
    *env = NULL;
    pmix_status_t rc = PMIx_server_setup_fork(&proc, env);
    if (rc != PMIX_SUCCESS) {
        say(err, errlen, "PMIx_server_setup_fork", rc);
        return -1;
    }
    return 0;
}

/* The environment PMIx_server_setup_fork gives a rank of namespace "berth.fork-template",
 * rank 0: once per server. Apart from PMIX_NAMESPACE and PMIX_RANK, it is the same for every
 * rank of every namespace of this server (its addresses, modules, directories: the dstore's
 * are the server's, not a namespace's), so a step's ranks get it without a call each. The
 * namespace is registered (the dstore's setup_fork looks it up) and forgotten again. */
int berth_pmix_fork_template(char ***env, char *err, size_t errlen)
{
    const char *nspace = "berth.fork-template";
    pmix_nspace_t ns;
    PMIX_LOAD_NSPACE(ns, nspace);
    struct waiter w;
    waiter_init(&w);
    pmix_status_t rc = waiter_wait(&w, PMIx_server_register_nspace(ns, 1, NULL, 0, op_done, &w));
    if (rc != PMIX_SUCCESS) {
        say(err, errlen, "PMIx_server_register_nspace", rc);
        return -1;
    }
    int out = berth_pmix_setup_fork(nspace, 0, env, err, errlen);
    berth_pmix_deregister(nspace);
    return out;
}

void berth_pmix_free_env(char **env)
{
    if (env == NULL) {
        return;
    }
    for (char **e = env; *e != NULL; e++) {
        free(*e);
    }
    free(env);
}

static void dereg_done(pmix_status_t status, void *cbdata)
{
    (void)status; (void)cbdata;
}

/* Forget a step's namespace (and its clients), without waiting (queued after anything
 * queued for it before). */
void berth_pmix_deregister(const char *nspace)
{
    pmix_nspace_t ns;
    PMIX_LOAD_NSPACE(ns, nspace);
    PMIx_server_deregister_nspace(ns, dereg_done, NULL);
}

/* Tell the namespace's ranks that `rank` ended abnormally (PMIX_ERR_PROC_ABORTED). Only the
 * handlers registered for that code get it, never default ones (PMIX_EVENT_NON_DEFAULT; libpmix
 * 4.2 does not give them a server's events anyway): Open MPI 4.1's default handler aborts the
 * whole job on any event, which a --no-kill step must not do. */
int berth_pmix_notify_lost(const char *nspace, uint32_t rank)
{
    pmix_proc_t source;
    PMIX_PROC_LOAD(&source, nspace, rank);
    pmix_info_t *info;
    bool yes = true;
    PMIX_INFO_CREATE(info, 2);
    PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &source, PMIX_PROC);
    PMIX_INFO_LOAD(&info[1], PMIX_EVENT_NON_DEFAULT, &yes, PMIX_BOOL);
    struct waiter w;
    waiter_init(&w);
    pmix_status_t rc = waiter_wait(
        &w, PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, &source, PMIX_RANGE_NAMESPACE, info, 2, op_done, &w));
    PMIX_INFO_FREE(info, 2);
    return rc == PMIX_SUCCESS ? 0 : -1;
}

/* Tell the namespace's ranks that node `nodeid` (`host`), which ran `ranks`, was lost as a
 * whole (PMIX_EVENT_NODE_DOWN, as PRRTE raises it for a lost daemon): its host name and node
 * id, and the ranks it ran as PMIX_EVENT_AFFECTED_PROCS. Non-default, as
 * berth_pmix_notify_lost's; each rank of the node is also announced by that one. */
int berth_pmix_notify_node_down(const char *nspace, uint32_t nodeid, const char *host, const uint32_t *ranks,
                                size_t nranks)
{
    pmix_proc_t source;
    PMIX_PROC_LOAD(&source, nspace, PMIX_RANK_UNDEF);
    pmix_info_t *info;
    bool yes = true;
    size_t ninfo = nranks > 0 ? 4 : 3;
    PMIX_INFO_CREATE(info, ninfo);
    PMIX_INFO_LOAD(&info[0], PMIX_EVENT_NON_DEFAULT, &yes, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_HOSTNAME, host, PMIX_STRING);
    PMIX_INFO_LOAD(&info[2], PMIX_NODEID, &nodeid, PMIX_UINT32);
    if (nranks > 0) {
        pmix_data_array_t *arr;
        PMIX_DATA_ARRAY_CREATE(arr, nranks, PMIX_PROC);
        pmix_proc_t *procs = arr->array;
        for (size_t i = 0; i < nranks; i++) {
            PMIX_PROC_LOAD(&procs[i], nspace, ranks[i]);
        }
        PMIX_INFO_LOAD(&info[3], PMIX_EVENT_AFFECTED_PROCS, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
    }
    struct waiter w;
    waiter_init(&w);
    pmix_status_t rc = waiter_wait(
        &w, PMIx_Notify_event(PMIX_EVENT_NODE_DOWN, &source, PMIX_RANGE_NAMESPACE, info, ninfo, op_done, &w));
    PMIX_INFO_FREE(info, ninfo);
    return rc == PMIX_SUCCESS ? 0 : -1;
}
