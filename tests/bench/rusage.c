/* Benchmark helper: runs argv, prints "wall_s cpu_s maxrss_kib exit" for that child only.
 * A C launcher, because a child forked from Python carries Python's RSS into ru_maxrss. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
    struct timespec a, b;
    struct rusage ru;
    int st;
    if (argc < 2) { fprintf(stderr, "usage: rusage CMD [ARG...]\n"); return 2; }
    clock_gettime(CLOCK_MONOTONIC, &a);
    pid_t p = fork();
    if (p == 0) { execvp(argv[1], argv + 1); _exit(127); }
    if (p < 0 || wait4(p, &st, 0, &ru) < 0) { perror("rusage"); return 2; }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f %.6f %ld %d\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9,
           ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
           ru.ru_maxrss, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    return 0;
}
