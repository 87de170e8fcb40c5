/*
 * The paced commit floor without an interpreter: a 4 KiB O_DIRECT write into a preallocated
 * file and an fdatasync, RATE times a second, as the journal commits an event at the sample
 * stream's pace. Prints the CPU time the process spent per commit (user and system, from
 * getrusage) and the commit's latency (p50, p99). scripts/soak.py measures the same floor in
 * Python (`paced_floor`); this shows how much of that CPU is the kernel's.
 *
 * With `wake` last it only sleeps until each due time and commits nothing: what waking from
 * idle RATE times a second costs the process, the part of a commit's CPU (and of every event
 * a live source delivers) that is the wake-up's.
 *
 * With `slow=MS` last it commits as without it and also prints, as they happen, the UTC time
 * and latency of each commit that took longer than MS milliseconds: a witness of the device's
 * stalls to set beside a soak's status lines, run on the same disk at the same time.
 *
 *   gcc -O2 -o /tmp/paced_floor scripts/paced_floor.c
 *   /tmp/paced_floor 70 700 /var/tmp      # RATE COUNT DIRECTORY (on the data's disk)
 *   /tmp/paced_floor 70 700 /var/tmp wake
 *   /tmp/paced_floor 20 54000 /var/tmp slow=3
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double us(struct timeval t) { return t.tv_sec * 1e6 + t.tv_usec; }

int main(int argc, char **argv) {
    int wake_only = argc == 5 && strcmp(argv[4], "wake") == 0;
    double slow_us = 0; /* 0: report no single commit */
    if (argc == 5 && strncmp(argv[4], "slow=", 5) == 0) {
        slow_us = atof(argv[4] + 5) * 1000;
        if (slow_us <= 0) {
            fprintf(stderr, "slow=MS needs a positive number of milliseconds\n");
            return 2;
        }
    }
    if (argc != 4 && !wake_only && slow_us == 0) {
        fprintf(stderr, "usage: %s RATE COUNT DIRECTORY [wake | slow=MS]\n", argv[0]);
        return 2;
    }
    long rate = atol(argv[1]), count = atol(argv[2]);
    if (rate <= 0 || count <= 0) {
        fprintf(stderr, "RATE and COUNT must be positive\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/paced-floor.%d", argv[3], (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
    if (fd < 0) {
        perror(path); /* EINVAL: a filesystem that does not take O_DIRECT */
        return 1;
    }
    void *block = NULL;
    double *latency = malloc(sizeof(double) * count);
    if (posix_fallocate(fd, 0, (off_t)count * 4096) != 0 || fsync(fd) != 0 ||
        posix_memalign(&block, 4096, 4096) != 0 || latency == NULL) {
        perror(path);
        unlink(path);
        return 1;
    }
    memset(block, 'x', 4096);
    struct rusage before, after;
    struct timespec start;
    getrusage(RUSAGE_SELF, &before);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < count; i++) {
        long long due = start.tv_sec * 1000000000LL + start.tv_nsec + 1000000000LL * i / rate;
        struct timespec at = {due / 1000000000LL, due % 1000000000LL}, a, b;
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (!wake_only &&
            (pwrite(fd, block, 4096, (off_t)i * 4096) != 4096 || fdatasync(fd) != 0)) {
            perror("commit");
            unlink(path);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        latency[i] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
        if (slow_us > 0 && latency[i] > slow_us) {
            struct timespec now;
            struct tm utc;
            char when[32];
            clock_gettime(CLOCK_REALTIME, &now);
            gmtime_r(&now.tv_sec, &utc);
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
            printf("%s.%03ldZ slow commit %.1f ms\n", when, now.tv_nsec / 1000000, latency[i] / 1e3);
            fflush(stdout);
        }
    }
    getrusage(RUSAGE_SELF, &after);
    unlink(path);
    qsort(latency, count, sizeof(double), by_value);
    printf("%ld %s at %ld/s: CPU per %s user %.1f us, system %.1f us; "
           "latency p50 %.0f us, p99 %.0f us\n",
           count, wake_only ? "wakes" : "commits", rate, wake_only ? "wake" : "commit", (us(after.ru_utime) - us(before.ru_utime)) / count,
           (us(after.ru_stime) - us(before.ru_stime)) / count, latency[count / 2],
           latency[count * 99 / 100]);
    return 0;
}
