/* Open-loop HTTP/1.1 load generator for cache_bench.py (wrk2 is not packaged here).
 *
 * Sends one fixed request at a steady rate over C keep-alive connections. Request i is due at
 * t0 + i/rate; its latency is measured from that due time, so a stalled server is charged for the
 * queueing it causes (no coordinated omission). Responses must carry Content-Length.
 * Usage: openloop HOST PORT RATE SECONDS CONNS REQUEST_FILE
 * Prints one JSON line: sent, done, errors, rate, p50/p95/p99/max (us), generator cpu seconds.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct { int fd; int busy; double due; char buf[65536]; size_t len; } conn_t;

static double now(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Bytes of the first complete response in buf, or 0 if it is not complete yet. */
static size_t complete(const char *buf, size_t len) {
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t head = (size_t)(end - buf) + 4, body = 0;
    for (const char *p = buf; p < end; p++) {
        if ((p == buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) {
            body = strtoul(p + 15, NULL, 10);
            break;
        }
    }
    return len >= head + body ? head + body : 0;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: openloop HOST PORT RATE SECONDS CONNS REQFILE\n"); return 2; }
    const char *host = argv[1];
    int port = atoi(argv[2]), nconn = atoi(argv[5]);
    double rate = atof(argv[3]), secs = atof(argv[4]);
    FILE *f = fopen(argv[6], "rb");
    if (!f) { perror("request file"); return 2; }
    static char req[65536];
    size_t reqlen = fread(req, 1, sizeof req, f);
    fclose(f);
    size_t total = (size_t)(rate * secs);
    double *lat = calloc(total + 1, sizeof(double));
    conn_t *cs = calloc(nconn, sizeof(conn_t));
    int ep = epoll_create1(0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &sa.sin_addr);
    for (int i = 0; i < nconn; i++) {
        cs[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(cs[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(cs[i].fd, (struct sockaddr *)&sa, sizeof sa) != 0) { perror("connect"); return 1; }
        fcntl(cs[i].fd, F_SETFL, O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
    }
    size_t sent = 0, done = 0, errors = 0;
    double t0 = now() + 0.05, deadline = t0 + secs + 5.0;
    while (done + errors < total && now() < deadline) {
        double t = now();
        /* hand every request that is due to an idle connection */
        while (sent < total && t0 + sent / rate <= t) {
            int k = -1;
            for (int i = 0; i < nconn; i++) if (!cs[i].busy) { k = i; break; }
            if (k < 0) break; /* all busy: it waits, and its wait counts in its latency */
            cs[k].busy = 1;
            cs[k].due = t0 + sent / rate;
            cs[k].len = 0;
            if (write(cs[k].fd, req, reqlen) != (ssize_t)reqlen) { errors++; cs[k].busy = 0; }
            sent++;
        }
        /* sleep until the next request is due or a response arrives, with ns resolution
           (epoll_wait's ms would busy-spin at 0.5 ms gaps); all busy: wait for a response */
        double next = sent < total ? t0 + sent / rate : t + 0.001;
        double wait = next - now();
        if (wait < 0) wait = sent < total ? 0.001 : 0;
        struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (time_t)wait) * 1e9)};
        struct epoll_event evs[64];
        int n = epoll_pwait2(ep, evs, 64, &ts, NULL);
        for (int e = 0; e < n; e++) {
            conn_t *c = &cs[evs[e].data.u32];
            ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
            if (r <= 0) { if (r < 0 && errno == EAGAIN) continue; errors++; c->busy = 0; continue; }
            c->len += (size_t)r;
            if (complete(c->buf, c->len)) {
                lat[done++] = now() - c->due;
                c->busy = 0;
                c->len = 0;
            }
        }
    }
    double elapsed = now() - t0;
    qsort(lat, done, sizeof(double), cmp);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
#define P(q) (done ? lat[(size_t)((done - 1) * (q))] * 1e6 : -1)
    printf("{\"sent\": %zu, \"done\": %zu, \"errors\": %zu, \"rate\": %.1f, \"p50_us\": %.1f, "
           "\"p95_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f, \"cpu_s\": %.3f, \"elapsed_s\": %.3f}\n",
           sent, done, errors, done / elapsed, P(0.50), P(0.95), P(0.99), P(1.0), cpu, elapsed);
    return 0;
}
