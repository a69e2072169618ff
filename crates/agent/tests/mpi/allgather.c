/* allgather.c: MPI_Allgather of MIB mebibytes per rank (argv[1], default 1). Each rank fills
 * its block with a pattern of its rank and the byte's offset, checks every received byte of
 * every rank's block, and prints "allgather ok rank=R bytes=N checksum=C" (C: FNV-1a 64 of the
 * whole gathered buffer, the same on every rank) or the first bad byte; exits 1 if any. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char pattern(int rank, size_t i)
{
    return (unsigned char)((size_t)rank * 131u + i * 7u + (i >> 12));
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
    size_t block = mib << 20;
    unsigned char *mine = malloc(block), *all = malloc(block * (size_t)size);
    if (mine == NULL || all == NULL) {
        fprintf(stderr, "allgather: rank %d cannot allocate %zu bytes\n", rank, block * (size_t)(size + 1));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (size_t i = 0; i < block; i++) {
        mine[i] = pattern(rank, i);
    }
    /* Poison what is received, so a block never written is seen. */
    for (size_t i = 0; i < block * (size_t)size; i++) {
        all[i] = 0x5a;
    }
    MPI_Allgather(mine, (int)block, MPI_BYTE, all, (int)block, MPI_BYTE, MPI_COMM_WORLD);
    int ok = 1;
    for (int r = 0; r < size && ok; r++) {
        for (size_t i = 0; i < block; i++) {
            unsigned char got = all[(size_t)r * block + i], want = pattern(r, i);
            if (got != want) {
                printf("allgather bad rank=%d block=%d offset=%zu got=%u want=%u\n", rank, r, i, got, want);
                ok = 0;
                break;
            }
        }
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < block * (size_t)size; i++) {
        h = (h ^ all[i]) * 0x100000001b3ull;
    }
    if (ok) {
        printf("allgather ok rank=%d bytes=%zu checksum=%016llx\n", rank, block * (size_t)size, (unsigned long long)h);
    }
    fflush(stdout);
    free(mine);
    free(all);
    MPI_Finalize();
    return ok ? 0 : 1;
}
