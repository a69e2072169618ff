/* spawn.c: MPI_Comm_spawn of 2 children that each exchange a message with the parent's rank 0
 * (each sends back the token plus its rank + 1), then parent and children merge their
 * intercommunicator (MPI_Intercomm_merge, children high) and sum their merged ranks over it.
 * The parent asks for errors to be returned and prints "spawn refused: CLASS STRING" when the
 * spawn fails, else "spawn ok children=2 merged=SIZE sum=SUM" (rank 0). A child prints "child
 * R of N got TOKEN", then "child R merged rank M of SIZE sum=SUM". */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Comm parent, children;
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_get_parent(&parent);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (parent != MPI_COMM_NULL) {
        int token = -1;
        MPI_Recv(&token, 1, MPI_INT, 0, 0, parent, MPI_STATUS_IGNORE);
        printf("child %d of %d got %d\n", rank, size, token);
        fflush(stdout);
        token += rank + 1;
        MPI_Send(&token, 1, MPI_INT, 0, 1, parent);
        MPI_Comm merged;
        int mrank, msize, sum = -1;
        MPI_Intercomm_merge(parent, 1, &merged);
        MPI_Comm_rank(merged, &mrank);
        MPI_Comm_size(merged, &msize);
        MPI_Allreduce(&mrank, &sum, 1, MPI_INT, MPI_SUM, merged);
        printf("child %d merged rank %d of %d sum=%d\n", rank, mrank, msize, sum);
        fflush(stdout);
        MPI_Comm_free(&merged);
        MPI_Comm_disconnect(&parent);
        MPI_Finalize();
        return 0;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int errs[2];
    char *child_argv[] = {"child", NULL};
    int rc = MPI_Comm_spawn(argv[0], child_argv, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &children, errs);
    if (rc != MPI_SUCCESS) {
        int cls, len;
        char msg[MPI_MAX_ERROR_STRING];
        MPI_Error_class(rc, &cls);
        MPI_Error_string(rc, msg, &len);
        if (rank == 0) {
            printf("spawn refused: %d %s\n", cls, msg);
            fflush(stdout);
        }
        MPI_Finalize();
        return 0;
    }
    int ok = 1;
    if (rank == 0) {
        for (int c = 0; c < 2; c++) {
            int token = 100 * (c + 1), back = -1;
            MPI_Send(&token, 1, MPI_INT, c, 0, children);
            MPI_Recv(&back, 1, MPI_INT, c, 1, children, MPI_STATUS_IGNORE);
            ok &= back == token + c + 1;
        }
    }
    MPI_Comm merged;
    int mrank, msize, sum = -1;
    MPI_Intercomm_merge(children, 0, &merged);
    MPI_Comm_rank(merged, &mrank);
    MPI_Comm_size(merged, &msize);
    MPI_Allreduce(&mrank, &sum, 1, MPI_INT, MPI_SUM, merged);
    if (rank == 0) {
        if (ok) {
            printf("spawn ok children=2 merged=%d sum=%d\n", msize, sum);
        } else {
            printf("spawn bad\n");
        }
        fflush(stdout);
    }
    MPI_Comm_free(&merged);
    MPI_Comm_disconnect(&children);
    MPI_Finalize();
    return ok ? 0 : 1;
}
