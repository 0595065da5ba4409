/* The benchmark's C subscriber swarm: many raw sockets (optionally TLS) in one epoll,
 * counting timestamped deliveries. Hand-written C only because it is the load
 * generator, not the server: every microsecond it spends per delivery is taken from
 * the server under test on the same cores. Built and driven by migratory/bench/swarm.py.
 *
 * stdin (lines):  conf HOST PORT SUBJECTS SETUP_S LIFETIME_S CA_FILE|- WINDOW
 *                 conn INDEX SEND_HEX MARKER_HEX [SEND_HEX MARKER_HEX ...]   (- = no bytes)
 *                 go
 *                 ... later: finish SENT DRAIN_S
 * stdout (lines): failure REASON ... ready N SECONDS, then (during and) after finish:
 *                 close REASON, stat received|max_ns|recvs|polls N, hist BUCKET N,
 *                 conn INDEX COUNT, end
 * Each connection sends its steps' bytes one after the other, each once the previous
 * step's marker arrived; after the last marker it is ready and the bytes after the
 * marker go to the stamp counter. A stamp is "@@TS" + 19 ASCII digits of
 * CLOCK_MONOTONIC ns; a stamp cut by a read is carried over exactly as
 * migratory/bench/stamp.py's scan_stamps does. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUCKET_NS 100000LL /* migratory/bench/latency.py */
#define BUCKETS 100000
#define RECV_SIZE 32768
#define STAMP_END 23 /* "@@TS" + 19 digits */
#define LAST_KEEP 127 /* a close frame's header + its longest payload */
#define SETUP_BUF_MAX 65536

enum { CONNECTING, HANDSHAKE, SENDING, WAITING, READY, FAILED };
static const char *STATE_NAMES[] = {"connecting", "tls handshake", "sending", "waiting", "ready",
                                    "failed"};

struct step { unsigned char *send, *marker; size_t send_len, marker_len; };

struct conn {
    int fd, state, step, nsteps, open;
    long index;
    SSL *ssl;
    struct step *steps;
    size_t sent_off;
    unsigned char *buf; /* setup: bytes since the last marker */
    size_t buf_len;
    unsigned char carry[STAMP_END];
    int carry_len;
    unsigned char last[LAST_KEEP];
    int last_len;
    long long count;
};

static struct conn *conns;
static long nconns, conns_cap;
static char host[256];
static int port, window = 256;
static long subjects = 1;
static double setup_s = 60, lifetime_s = 300;
static char ca_file[4096];
static SSL_CTX *tls;
static struct sockaddr_in addr; /* host:port, resolved once */
static unsigned long long hist[BUCKETS];
static long long received, max_ns, recvs, polls;
static unsigned char rbuf[STAMP_END + RECV_SIZE];

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what) { fprintf(stderr, "swarm: %s\n", what); exit(2); }

/* One line per failed set-up or ended connection; swarm.py counts them by reason. */
static void note(const char *kind, const char *text) { printf("%s %s\n", kind, text); }

static long expected_for(long index, long sent) {
    return sent / subjects + (index % subjects < sent % subjects ? 1 : 0);
}

static int hexval(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

static unsigned char *unhex(const char *hex, size_t *len) {
    if (!strcmp(hex, "-")) { *len = 0; return NULL; }
    size_t n = strlen(hex) / 2;
    unsigned char *out = malloc(n ? n : 1);
    if (!out) die("out of memory");
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) die("bad hex");
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    *len = n;
    return out;
}

static void read_conn_line(char *line) {
    char *save, *tok = strtok_r(line, " \n", &save); /* "conn" */
    tok = strtok_r(NULL, " \n", &save);
    if (!tok) die("conn: no index");
    if (nconns == conns_cap) {
        conns_cap = conns_cap ? conns_cap * 2 : 1024;
        conns = realloc(conns, conns_cap * sizeof *conns);
        if (!conns) die("out of memory");
    }
    struct conn *c = &conns[nconns++];
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->index = atol(tok);
    char *send, *marker;
    while ((send = strtok_r(NULL, " \n", &save)) && (marker = strtok_r(NULL, " \n", &save))) {
        c->steps = realloc(c->steps, (c->nsteps + 1) * sizeof *c->steps);
        if (!c->steps) die("out of memory");
        struct step *s = &c->steps[c->nsteps++];
        s->send = unhex(send, &s->send_len);
        s->marker = unhex(marker, &s->marker_len);
    }
    if (!c->nsteps) die("conn: no steps");
}

static void read_setup(void) {
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) > 0) {
        if (!strncmp(line, "conf ", 5)) {
            char ca[4096];
            if (sscanf(line, "conf %255s %d %ld %lf %lf %4095s %d", host, &port, &subjects,
                       &setup_s, &lifetime_s, ca, &window) != 7 || subjects < 1 || window < 1)
                die("bad conf line");
            if (strcmp(ca, "-")) snprintf(ca_file, sizeof ca_file, "%s", ca);
        } else if (!strncmp(line, "conn ", 5)) {
            read_conn_line(line);
        } else if (!strncmp(line, "go", 2)) {
            free(line);
            return;
        }
    }
    die("stdin ended before go");
}

static void tls_start(struct conn *c) {
    c->ssl = SSL_new(tls);
    SSL_set_fd(c->ssl, c->fd);
    struct in6_addr ip;
    if (inet_pton(AF_INET, host, &ip) == 1 || inet_pton(AF_INET6, host, &ip) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), host); /* no SNI for an IP */
    } else {
        SSL_set_tlsext_host_name(c->ssl, host);
        SSL_set1_host(c->ssl, host);
    }
    SSL_set_connect_state(c->ssl);
}

static void close_conn(int ep, struct conn *c) {
    if (c->fd >= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    if (c->ssl) SSL_free(c->ssl);
    c->ssl = NULL;
    c->fd = -1;
    c->open = 0;
}

static void watch(int ep, struct conn *c, int op, uint32_t events) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(ep, op, c->fd, &ev);
}

/* How a connection ended, from its last bytes: a WebSocket close frame or not
 * (subscriber.py's ended_with). */
static void ended_with(const struct conn *c, char *out, size_t size) {
    const unsigned char *b = c->last;
    int n = c->last_len;
    for (int len = (n - 2 < 125 ? n - 2 : 125); len >= 0; len--) {
        int start = n - len;
        if (b[start - 2] == 0x88 && b[start - 1] == len) {
            int code = len >= 2 ? (b[start] << 8 | b[start + 1]) : 1005;
            snprintf(out, size, "close frame %d", code);
            return;
        }
    }
    snprintf(out, size, "closed without close frame");
}

static void keep_last(struct conn *c, const unsigned char *data, size_t n) {
    if (n >= LAST_KEEP) {
        memcpy(c->last, data + n - LAST_KEEP, LAST_KEEP);
        c->last_len = LAST_KEEP;
        return;
    }
    int drop = c->last_len + (int)n - LAST_KEEP;
    if (drop > 0) {
        memmove(c->last, c->last + drop, c->last_len - drop);
        c->last_len -= drop;
    }
    memcpy(c->last + c->last_len, data, n);
    c->last_len += (int)n;
}

/* Every stamp in d[0:n] (regex "@@TS(\d{19})", left to right, not overlapping), and
 * the carry: from the first '@' in the last STAMP_END - 1 bytes on. Returns the count;
 * each latency goes into the histogram. */
static long scan(struct conn *c, const unsigned char *d, size_t n, long long now) {
    long found = 0;
    size_t i = 0;
    while (i + 4 <= n) {
        const unsigned char *p = memmem(d + i, n - i, "@@TS", 4);
        if (!p) break;
        size_t at = (size_t)(p - d), k = 4;
        if (at + STAMP_END <= n)
            while (k < STAMP_END && d[at + k] >= '0' && d[at + k] <= '9') k++;
        if (k < STAMP_END) { i = at + 1; continue; }
        found++;
        {
            unsigned long long stamp = 0;
            for (k = 4; k < STAMP_END; k++) stamp = stamp * 10 + (d[at + k] - '0');
            long long lat = (long long)((unsigned long long)now - stamp);
            long long bucket = lat < 0 ? 0 : lat / BUCKET_NS;
            hist[bucket < BUCKETS - 1 ? bucket : BUCKETS - 1]++;
            if (lat > max_ns) max_ns = lat;
        }
        i = at + STAMP_END;
    }
    size_t from = n > STAMP_END - 1 ? n - (STAMP_END - 1) : 0;
    const unsigned char *at = memchr(d + from, '@', n - from);
    c->carry_len = at ? (int)(n - (size_t)(at - d)) : 0;
    if (at) memmove(c->carry, at, c->carry_len);
    return found;
}

/* -------- set-up: connect, TLS handshake, the steps, until every marker arrived -------- */

static void setup_fail(int ep, struct conn *c, const char *why) {
    char text[300];
    snprintf(text, sizeof text, "%s: %s", STATE_NAMES[c->state], why);
    note("failure", text);
    close_conn(ep, c);
    c->state = FAILED;
}

static int start_conn(int ep, struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) { setup_fail(ep, c, strerror(errno)); return 0; }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) {
        setup_fail(ep, c, strerror(errno));
        return 0;
    }
    c->open = 1;
    watch(ep, c, EPOLL_CTL_ADD, EPOLLOUT);
    return 1;
}

/* TLS: wait for what OpenSSL wants; returns 0 on a real error. */
static int tls_wait(int ep, struct conn *c, int ret) {
    int err = SSL_get_error(c->ssl, ret);
    if (err == SSL_ERROR_WANT_READ) { watch(ep, c, EPOLL_CTL_MOD, EPOLLIN); return 1; }
    if (err == SSL_ERROR_WANT_WRITE) { watch(ep, c, EPOLL_CTL_MOD, EPOLLOUT); return 1; }
    char why[256];
    unsigned long e = ERR_get_error();
    snprintf(why, sizeof why, "%s", e ? ERR_reason_error_string(e) : "connection closed by server");
    ERR_clear_error();
    setup_fail(ep, c, why);
    return 0;
}

static void setup_marker(int ep, struct conn *c, long *ready, int *live);
static void setup_read(int ep, struct conn *c, long *ready, int *live);

static void setup_send(int ep, struct conn *c, long *ready, int *live) {
    struct step *s = &c->steps[c->step];
    while (c->sent_off < s->send_len) {
        size_t left = s->send_len - c->sent_off;
        if (c->ssl) {
            int n = SSL_write(c->ssl, s->send + c->sent_off, (int)left);
            if (n <= 0) { tls_wait(ep, c, n); return; }
            c->sent_off += (size_t)n;
        } else {
            ssize_t n = send(c->fd, s->send + c->sent_off, left, MSG_NOSIGNAL);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                watch(ep, c, EPOLL_CTL_MOD, EPOLLOUT);
                return;
            }
            if (n < 0) { setup_fail(ep, c, strerror(errno)); return; }
            c->sent_off += (size_t)n;
        }
    }
    c->state = WAITING;
    watch(ep, c, EPOLL_CTL_MOD, EPOLLIN);
    setup_marker(ep, c, ready, live); /* the reply may be in hand already */
    if (c->state == WAITING && c->ssl) setup_read(ep, c, ready, live); /* or in OpenSSL's */
}

/* The step's marker in the bytes received since the previous one: next step, or ready. */
static void setup_marker(int ep, struct conn *c, long *ready, int *live) {
    struct step *s = &c->steps[c->step];
    if (!c->buf_len) return;
    unsigned char *at = s->marker_len ? memmem(c->buf, c->buf_len, s->marker, s->marker_len)
                                      : c->buf;
    if (!at) return;
    size_t rest = c->buf_len - (size_t)(at - c->buf) - s->marker_len;
    memmove(c->buf, at + s->marker_len, rest);
    c->buf_len = rest;
    if (++c->step < c->nsteps) {
        c->state = SENDING;
        c->sent_off = 0;
        setup_send(ep, c, ready, live);
        return;
    }
    c->state = READY;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    (*ready)++;
    (*live)--;
}

static void setup_read(int ep, struct conn *c, long *ready, int *live) {
    for (int rounds = 0; rounds < 64 && c->state == WAITING; rounds++) {
        if (!c->buf) c->buf = malloc(SETUP_BUF_MAX);
        if (!c->buf) die("out of memory");
        size_t room = SETUP_BUF_MAX - c->buf_len;
        if (!room) { setup_fail(ep, c, "too many bytes before the marker"); return; }
        long n;
        if (c->ssl) {
            n = SSL_read(c->ssl, c->buf + c->buf_len, (int)room);
            if (n <= 0) {
                if (SSL_get_error(c->ssl, (int)n) == SSL_ERROR_ZERO_RETURN) n = 0;
                else { tls_wait(ep, c, (int)n); return; }
            }
        } else {
            n = recv(c->fd, c->buf + c->buf_len, room, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n < 0) { setup_fail(ep, c, strerror(errno)); return; }
        }
        if (n == 0) {
            char why[64];
            c->last_len = 0;
            keep_last(c, c->buf, c->buf_len);
            ended_with(c, why, sizeof why);
            setup_fail(ep, c, strncmp(why, "close frame", 11) ? "connection closed by server"
                                                               : why);
            return;
        }
        c->buf_len += (size_t)n;
        setup_marker(ep, c, ready, live);
        if (!c->ssl) return; /* level-triggered: epoll says when there is more */
    }
}

static void setup_event(int ep, struct conn *c, long *ready, int *live) {
    if (c->state == CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) { setup_fail(ep, c, strerror(err)); (*live)--; return; }
        if (tls) { tls_start(c); c->state = HANDSHAKE; }
        else { c->state = SENDING; }
    }
    if (c->state == HANDSHAKE) {
        int ret = SSL_connect(c->ssl);
        if (ret != 1) { if (!tls_wait(ep, c, ret)) (*live)--; return; }
        c->state = SENDING;
    }
    if (c->state == SENDING) setup_send(ep, c, ready, live);
    else if (c->state == WAITING) setup_read(ep, c, ready, live);
    if (c->state == FAILED) (*live)--;
}

static double setup_all(int ep, long long hard_deadline) {
    long long t0 = now_ns(), deadline = t0 + (long long)(setup_s * 1e9);
    if (deadline > hard_deadline) deadline = hard_deadline;
    long next = 0, ready = 0;
    int live = 0;
    struct epoll_event events[256];
    while ((live || next < nconns) && now_ns() < deadline) {
        while (live < window && next < nconns)
            if (start_conn(ep, &conns[next++])) live++;
        int n = epoll_wait(ep, events, 256, 200);
        for (int i = 0; i < n; i++) setup_event(ep, events[i].data.ptr, &ready, &live);
    }
    for (long i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        if (i >= next) note("failure", "not attempted (timeout)");
        else if (c->state != READY && c->state != FAILED) {
            char why[64];
            snprintf(why, sizeof why, "timeout in %s", STATE_NAMES[c->state]);
            note("failure", why);
            close_conn(ep, c);
            c->state = FAILED;
        }
    }
    return (now_ns() - t0) / 1e9;
}

/* -------- counting -------- */

static void count_read(int ep, struct conn *c) {
    for (int rounds = 0; rounds < 64; rounds++) {
        memcpy(rbuf, c->carry, c->carry_len);
        long n;
        const char *why = NULL;
        char text[300];
        if (c->ssl) {
            n = SSL_read(c->ssl, rbuf + c->carry_len, RECV_SIZE);
            if (n <= 0) {
                int err = SSL_get_error(c->ssl, (int)n);
                if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) return;
                if (err != SSL_ERROR_ZERO_RETURN) {
                    unsigned long e = ERR_get_error();
                    snprintf(text, sizeof text, "recv error: %s",
                             e ? ERR_reason_error_string(e) : strerror(errno));
                    ERR_clear_error();
                    why = text;
                }
                n = 0;
            }
        } else {
            n = recv(c->fd, rbuf + c->carry_len, RECV_SIZE, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n < 0) {
                snprintf(text, sizeof text, "recv error: %s", strerror(errno));
                why = text;
                n = 0;
            }
        }
        long long now = now_ns();
        recvs++;
        if (n == 0) {
            char ended[64];
            ended_with(c, ended, sizeof ended);
            note("close", why ? why : ended);
            close_conn(ep, c);
            return;
        }
        keep_last(c, rbuf + c->carry_len, (size_t)n);
        long got = scan(c, rbuf, (size_t)c->carry_len + (size_t)n, now);
        c->count += got;
        received += got;
        /* one recv per wake-up; TLS drains what OpenSSL holds (records read ahead) */
        if (!c->ssl || !SSL_has_pending(c->ssl)) return;
    }
}

static int finish_line(char *line, long long *expected, long long *drain_until,
                       long long hard_deadline) {
    long long sent;
    double drain;
    if (sscanf(line, "finish %lld %lf", &sent, &drain) != 2) return 0;
    *expected = 0;
    for (long i = 0; i < nconns; i++)
        if (conns[i].state == READY && conns[i].open) *expected += expected_for(conns[i].index, sent);
    *drain_until = now_ns() + (long long)(drain * 1e9);
    if (*drain_until > hard_deadline) *drain_until = hard_deadline;
    return 1;
}

static void count_all(int ep, long long hard_deadline) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL}, events[256];
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
    for (long i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        if (c->state != READY) continue;
        keep_last(c, c->buf, c->buf_len);
        /* bytes read past the marker: a stamp there is a delivery like any other */
        c->count = scan(c, c->buf, c->buf_len, now_ns());
        received += c->count;
        free(c->buf);
        c->buf = NULL;
        watch(ep, c, EPOLL_CTL_ADD, EPOLLIN);
        if (c->ssl) count_read(ep, c); /* records OpenSSL read ahead: epoll cannot tell */
    }
    char line[256];
    size_t line_len = 0;
    long long expected = -1, drain_until = hard_deadline;
    for (;;) {
        long long now = now_ns();
        if (now >= hard_deadline) { note("close", "load generator lifetime exceeded"); return; }
        if (expected >= 0 && (now >= drain_until || received >= expected)) return;
        int n = epoll_wait(ep, events, 256, 50);
        polls++;
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c) { if (c->open) count_read(ep, c); continue; }
            ssize_t got = read(0, line + line_len, sizeof line - 1 - line_len);
            if (got <= 0) exit(0); /* the parent is gone (it said why, if it failed) */
            line_len += (size_t)got;
            line[line_len] = 0;
            char *end;
            while ((end = strchr(line, '\n'))) {
                *end = 0;
                finish_line(line, &expected, &drain_until, hard_deadline);
                line_len -= (size_t)(end + 1 - line);
                memmove(line, end + 1, line_len + 1);
            }
            if (line_len >= sizeof line - 1) line_len = 0;
        }
    }
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 2;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN); /* the parent handles Ctrl-C and stops us */
    struct rlimit lim;
    if (!getrlimit(RLIMIT_NOFILE, &lim)) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    read_setup();
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *found;
    if (getaddrinfo(host, NULL, &hints, &found)) die("cannot resolve the host (IPv4)");
    addr = *(struct sockaddr_in *)found->ai_addr;
    addr.sin_port = htons(port);
    freeaddrinfo(found);
    long long hard_deadline = now_ns() + (long long)(lifetime_s * 1e9);
    if (ca_file[0]) { /* verified against the CA, the host name or IP checked */
        if (!(tls = SSL_CTX_new(TLS_client_method()))) die("SSL_CTX_new failed");
        if (SSL_CTX_load_verify_locations(tls, ca_file, NULL) != 1) die("cannot load the CA");
        SSL_CTX_set_verify(tls, SSL_VERIFY_PEER, NULL);
        SSL_CTX_set_options(tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
        SSL_CTX_set_read_ahead(tls, 1);
    }
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1 failed");
    double seconds = setup_all(ep, hard_deadline);
    long ready = 0;
    for (long i = 0; i < nconns; i++) ready += conns[i].state == READY;
    printf("ready %ld %.6f\n", ready, seconds);
    fflush(stdout);
    count_all(ep, hard_deadline);
    printf("stat received %lld\nstat max_ns %lld\nstat recvs %lld\nstat polls %lld\n",
           received, max_ns, recvs, polls);
    for (long i = 0; i < BUCKETS; i++)
        if (hist[i]) printf("hist %ld %llu\n", i, hist[i]);
    for (long i = 0; i < nconns; i++)
        if (conns[i].state == READY) printf("conn %ld %lld\n", conns[i].index, conns[i].count);
    printf("end\n");
    fflush(stdout);
    return 0;
}
