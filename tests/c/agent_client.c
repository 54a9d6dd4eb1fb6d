/*
 * agent_client: a minimal client of the MPIB agent interface (include/mpib_agent.h), written to
 * be copied by agent and tool authors. It plays both sides of the interface once:
 *
 *   1. as the plugin does, registers a connection with the agent on SOCKET_PATH and gets its
 *      hint slot;
 *   2. as an agent does, writes SUP_BW into that slot's entry of the hint file HINT_PATH under
 *      the seqlock;
 *   3. as the plugin does on close, deregisters the connection.
 *
 * Usage: agent_client SOCKET_PATH HINT_PATH SOUT_SRC SOUT_DST SUP_SRC SUP_DST SUP_BW
 *   addresses are IPv4 dotted quads; SUP_BW is the SUP share in parts per 1024 (0 .. 1024).
 *
 * stdout, one line per step: "slot N", "wrote SUP_BW", "deregistered status N".
 * Every failure is one line on stderr naming the step (and errno's text where there is one).
 *
 * Exit status:
 *   0  done (whatever status the deregistration answered: it is printed)
 *   1  I/O or protocol failure: socket, connect, send, receive, timeout, a malformed response,
 *      a slot out of range, cannot open or map the hint file, the seqlock stayed busy
 *   2  bad arguments
 *   3  the agent refused the registration (status N printed on stderr)
 *   4  HINT_PATH is not an MPIB hint file: too small, wrong magic or wrong max_entries
 * When the hint step fails after a successful registration, the connection is still
 * deregistered (best effort, reported on stderr) so the agent does not keep the slot.
 *
 * Every socket operation is bounded by SO_RCVTIMEO / SO_SNDTIMEO (2 s), so it never hangs on an
 * agent that accepts and never answers. Like the plugin, it uses one connection per message.
 *
 * Build: cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -pedantic -I include \
 *           -o agent_client tests/c/agent_client.c
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* MSG_NOSIGNAL, nanosleep, inet_pton */
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mpib_agent.h"

/* The interface's integers are little-endian and this program uses the header's structs in host
 * order (as the plugin does), so it is for little-endian hosts only. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mpib_agent.h messages are little-endian; convert the fields on this host"
#endif

/* The upper bound of sup_bw ("parts per 1024", 1024 = all SUP). */
#define SUP_BW_MAX MPIB_HINT_SUP_BW_MAX

/* Exit statuses (see the top comment). */
enum {
  EXIT_DONE = 0,
  EXIT_IO = 1,
  EXIT_USAGE = 2,
  EXIT_REFUSED = 3,
  EXIT_BAD_HINT_FILE = 4,
};

/* Socket send / receive timeout. */
static const struct timeval IO_TIMEOUT = {2, 0};
/* How long to wait for another writer's odd seq to turn even before giving up. */
#define SEQLOCK_WAIT_MS 2000

/* The hint entries' u32 fields are accessed with atomics through plain uint32_t pointers (the
 * header's structs are packed, so their members have alignment 1 as far as the compiler knows):
 * their offsets must keep them naturally aligned in a page-aligned mapping. */
_Static_assert(offsetof(struct mpib_hint_file, entries) % sizeof(struct mpib_hint_entry) == 0,
               "entries are aligned to their size");
_Static_assert(sizeof(struct mpib_hint_entry) % sizeof(uint32_t) == 0, "entries are u32 multiples");
_Static_assert(offsetof(struct mpib_hint_entry, seq) % sizeof(uint32_t) == 0, "seq is aligned");
_Static_assert(offsetof(struct mpib_hint_entry, sup_bw) % sizeof(uint32_t) == 0,
               "sup_bw is aligned");

static const char *prog = "agent_client";

static void usage(void) {
  fprintf(stderr,
          "usage: %s SOCKET_PATH HINT_PATH SOUT_SRC SOUT_DST SUP_SRC SUP_DST SUP_BW\n"
          "  addresses: IPv4 dotted quads; SUP_BW: 0 .. %u (parts per 1024 on SUP)\n",
          prog, SUP_BW_MAX);
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* Dotted quad -> network-order u32 (as struct in_addr holds it); 0 on success. */
static int parse_ipv4(const char *name, const char *text, uint32_t *out) {
  struct in_addr addr;
  if (inet_pton(AF_INET, text, &addr) != 1) {
    fprintf(stderr, "%s: arguments: %s '%s' is not an IPv4 dotted quad\n", prog, name, text);
    return -1;
  }
  *out = addr.s_addr;
  return 0;
}

/* Decimal 0 .. SUP_BW_MAX, digits only (no sign, no space, no suffix); 0 on success. */
static int parse_sup_bw(const char *text, uint32_t *out) {
  char *end = NULL;
  unsigned long value;
  if (text[0] < '0' || text[0] > '9') goto bad;
  errno = 0;
  value = strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || value > SUP_BW_MAX) goto bad;
  *out = (uint32_t)value;
  return 0;
bad:
  fprintf(stderr, "%s: arguments: SUP_BW '%s' is not an integer in 0 .. %u\n", prog, text,
          SUP_BW_MAX);
  return -1;
}

/* ---- socket ------------------------------------------------------------------------------- */

/* A connected stream socket to `path` with both timeouts set, or -1 (message printed). */
static int agent_connect(const char *step, const char *path) {
  struct sockaddr_un addr;
  int fd;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  /* Length was checked in main: path fits with its NUL. */
  memcpy(addr.sun_path, path, strlen(path) + 1);

  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "%s: %s: socket: %s\n", prog, step, strerror(errno));
    return -1;
  }
  /* Before connect: on Linux a Unix-socket connect to a full backlog waits for SO_SNDTIMEO. */
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &IO_TIMEOUT, sizeof IO_TIMEOUT) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &IO_TIMEOUT, sizeof IO_TIMEOUT) != 0) {
    fprintf(stderr, "%s: %s: setsockopt timeouts: %s\n", prog, step, strerror(errno));
    close(fd);
    return -1;
  }
  if (connect(fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
    int err = errno;
    fprintf(stderr, "%s: %s: connect %s: %s\n", prog, step, path,
            (err == EAGAIN || err == EWOULDBLOCK) ? "timed out (agent backlog full)"
                                                   : strerror(err));
    close(fd);
    return -1;
  }
  return fd;
}

/* Sends all `len` bytes; 0 on success, -1 (message printed). */
static int send_all(const char *step, int fd, const void *buf, size_t len) {
  const unsigned char *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "%s: %s: send: %s\n", prog, step,
              (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out" : strerror(errno));
      return -1;
    }
    done += (size_t)n;
  }
  return 0;
}

/* Receives exactly `len` bytes (looping on short reads); 0 on success, -1 (message printed). */
static int recv_exact(const char *step, int fd, void *buf, size_t len) {
  unsigned char *p = buf;
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, p + done, len - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "%s: %s: recv: %s\n", prog, step,
              (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out waiting for the agent"
                                                        : strerror(errno));
      return -1;
    }
    if (n == 0) {
      fprintf(stderr, "%s: %s: recv: agent closed the connection after %zu of %zu bytes\n", prog,
              step, done, len);
      return -1;
    }
    done += (size_t)n;
  }
  return 0;
}

/* Checks a response header; 0 when it is a response of `len` bytes, -1 (message printed). */
static int check_response(const char *step, const struct mpib_agent_header *h, size_t len) {
  if (h->magic != MPIB_AGENT_MAGIC) {
    fprintf(stderr, "%s: %s: response magic 0x%08x, expected 0x%08x\n", prog, step,
            (unsigned)h->magic, (unsigned)MPIB_AGENT_MAGIC);
    return -1;
  }
  if (h->msg_type != MPIB_AGENT_MSG_RESPONSE) {
    fprintf(stderr, "%s: %s: response msg_type %u, expected %u\n", prog, step,
            (unsigned)h->msg_type, (unsigned)MPIB_AGENT_MSG_RESPONSE);
    return -1;
  }
  if (h->msg_len != len) {
    fprintf(stderr, "%s: %s: response msg_len %u, expected %zu\n", prog, step,
            (unsigned)h->msg_len, len);
    return -1;
  }
  return 0;
}

static struct mpib_agent_header request_header(size_t len, enum mpib_agent_msg_type type) {
  struct mpib_agent_header h;
  memset(&h, 0, sizeof h);
  h.magic = MPIB_AGENT_MAGIC;
  h.msg_len = (uint16_t)len;
  h.msg_type = (uint8_t)type;
  return h;
}

/* One register exchange. Returns 0 and sets *status (and *slot when status is SUCCESS), or -1
 * on an I/O or protocol failure (message printed). */
static int agent_register(const char *path, const struct mpib_agent_register_request *req,
                          uint8_t *status, uint32_t *slot) {
  const char *step = "register";
  struct mpib_agent_register_response resp;
  int fd = agent_connect(step, path);
  if (fd < 0) return -1;
  if (send_all(step, fd, req, sizeof *req) != 0 || recv_exact(step, fd, &resp, sizeof resp) != 0 ||
      check_response(step, &resp.header, sizeof resp) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  *status = resp.status;
  *slot = resp.hint_slot;
  return 0;
}

/* One deregister exchange on a new connection; 0 and *status, or -1 (message printed). */
static int agent_deregister(const char *path, uint32_t conn_id, uint8_t *status) {
  const char *step = "deregister";
  struct mpib_agent_deregister_request req;
  struct mpib_agent_deregister_response resp;
  int fd;
  memset(&req, 0, sizeof req);
  req.header = request_header(sizeof req, MPIB_AGENT_MSG_DEREGISTER);
  req.conn_id = conn_id;
  fd = agent_connect(step, path);
  if (fd < 0) return -1;
  if (send_all(step, fd, &req, sizeof req) != 0 || recv_exact(step, fd, &resp, sizeof resp) != 0 ||
      check_response(step, &resp.header, sizeof resp) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  *status = resp.status;
  return 0;
}

/* ---- hint file ---------------------------------------------------------------------------- */

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/*
 * Seqlock write of one entry's sup_bw (the reader is the plugin: load seq, retry while odd, load
 * sup_bw, load seq again, retry if it changed; all its loads are acquire).
 *
 *   seq: even -> odd   compare-and-swap, so two writers that both use this routine never
 *                      interleave (a plain store is enough when the agent is the only writer)
 *   release fence      keeps the sup_bw store below from becoming visible before the odd seq:
 *                      a release *store* of seq alone orders only what comes before it
 *   sup_bw store
 *   seq = old + 2      release store: the new sup_bw is visible before seq is even again
 *
 * Returns 0, or -1 when seq stayed odd for SEQLOCK_WAIT_MS (a writer died mid-update?).
 */
static int hint_write(uint32_t *seq, uint32_t *sup_bw, uint32_t value) {
  uint32_t old = __atomic_load_n(seq, __ATOMIC_RELAXED);
  long waited = 0;
  for (;;) {
    if (old & 1u) {
      if (waited >= SEQLOCK_WAIT_MS) return -1;
      sleep_ms(1);
      waited++;
      old = __atomic_load_n(seq, __ATOMIC_RELAXED);
      continue;
    }
    if (__atomic_compare_exchange_n(seq, &old, old + 1u, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      break;
    /* Lost a race: `old` now holds the current value; go round. */
  }
  __atomic_thread_fence(__ATOMIC_RELEASE);
  __atomic_store_n(sup_bw, value, __ATOMIC_RELAXED);
  __atomic_store_n(seq, old + 2u, __ATOMIC_RELEASE);
  return 0;
}

/* Maps HINT_PATH and writes `value` into entry `slot`. Returns an exit status (message printed on
 * failure). */
static int hint_update(const char *path, uint32_t slot, uint32_t value) {
  const char *step = "hint file";
  const size_t file_len = sizeof(struct mpib_hint_file);
  struct mpib_hint_header header;
  struct stat st;
  unsigned char *map;
  uint32_t *entry_seq, *entry_sup_bw;
  size_t entry_at;
  int fd, rc = EXIT_DONE;

  /* The slot was range-checked against MPIB_HINT_MAX_ENTRIES by the caller. */
  fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "%s: %s: open %s: %s\n", prog, step, path, strerror(errno));
    return EXIT_IO;
  }
  if (fstat(fd, &st) != 0) {
    fprintf(stderr, "%s: %s: fstat %s: %s\n", prog, step, path, strerror(errno));
    close(fd);
    return EXIT_IO;
  }
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uintmax_t)st.st_size < file_len) {
    fprintf(stderr, "%s: %s: %s is %jd bytes%s, expected at least %zu\n", prog, step, path,
            (intmax_t)st.st_size, S_ISREG(st.st_mode) ? "" : " and not a regular file", file_len);
    close(fd);
    return EXIT_BAD_HINT_FILE;
  }
  map = mmap(NULL, file_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    fprintf(stderr, "%s: %s: mmap %s: %s\n", prog, step, path, strerror(errno));
    close(fd);
    return EXIT_IO;
  }
  close(fd); /* the mapping keeps the file */

  memcpy(&header, map + offsetof(struct mpib_hint_file, header), sizeof header);
  if (header.magic != MPIB_HINT_MAGIC) {
    fprintf(stderr, "%s: %s: %s has magic 0x%08x, expected 0x%08x: not an MPIB hint file\n", prog,
            step, path, (unsigned)header.magic, (unsigned)MPIB_HINT_MAGIC);
    rc = EXIT_BAD_HINT_FILE;
    goto out;
  }
  if (header.max_entries != MPIB_HINT_MAX_ENTRIES) {
    fprintf(stderr, "%s: %s: %s has max_entries %u, expected %u\n", prog, step, path,
            (unsigned)header.max_entries, (unsigned)MPIB_HINT_MAX_ENTRIES);
    rc = EXIT_BAD_HINT_FILE;
    goto out;
  }

  entry_at = offsetof(struct mpib_hint_file, entries) + slot * sizeof(struct mpib_hint_entry);
  /* Page-aligned base + the offsets asserted above: naturally aligned u32s. */
  entry_seq = (uint32_t *)(void *)(map + entry_at + offsetof(struct mpib_hint_entry, seq));
  entry_sup_bw = (uint32_t *)(void *)(map + entry_at + offsetof(struct mpib_hint_entry, sup_bw));

  if (hint_write(entry_seq, entry_sup_bw, value) != 0) {
    fprintf(stderr, "%s: %s: slot %u: seq stayed odd for %d ms (another writer stuck?)\n", prog,
            step, (unsigned)slot, SEQLOCK_WAIT_MS);
    rc = EXIT_IO;
    goto out;
  }
  printf("wrote %u\n", (unsigned)value);

out:
  if (munmap(map, file_len) != 0 && rc == EXIT_DONE) {
    fprintf(stderr, "%s: %s: munmap: %s\n", prog, step, strerror(errno));
    rc = EXIT_IO;
  }
  return rc;
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  struct mpib_agent_register_request reg;
  const char *socket_path, *hint_path;
  uint32_t sup_bw, slot = 0;
  uint8_t status = 0;
  int rc;

  if (argc > 0 && argv[0] != NULL && argv[0][0] != '\0') prog = argv[0];
  if (argc != 8) {
    fprintf(stderr, "%s: arguments: expected 7, got %d\n", prog, argc > 0 ? argc - 1 : 0);
    usage();
    return EXIT_USAGE;
  }
  socket_path = argv[1];
  hint_path = argv[2];
  if (socket_path[0] == '\0' || strlen(socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    fprintf(stderr, "%s: arguments: SOCKET_PATH must be 1 .. %zu bytes\n", prog,
            sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
    return EXIT_USAGE;
  }
  if (hint_path[0] == '\0') {
    fprintf(stderr, "%s: arguments: HINT_PATH is empty\n", prog);
    return EXIT_USAGE;
  }

  memset(&reg, 0, sizeof reg);
  reg.header = request_header(sizeof reg, MPIB_AGENT_MSG_REGISTER);
  /* pid << 16 | per-process counter, as the plugin forms it; this process has one connection. */
  reg.conn_id = ((uint32_t)getpid() << 16) | 1u;
  if (parse_ipv4("SOUT_SRC", argv[3], &reg.sout_src_ip) != 0 ||
      parse_ipv4("SOUT_DST", argv[4], &reg.sout_dst_ip) != 0 ||
      parse_ipv4("SUP_SRC", argv[5], &reg.sup_src_ip) != 0 ||
      parse_ipv4("SUP_DST", argv[6], &reg.sup_dst_ip) != 0 || parse_sup_bw(argv[7], &sup_bw) != 0) {
    usage();
    return EXIT_USAGE;
  }

  /* 1-2. Register. */
  if (agent_register(socket_path, &reg, &status, &slot) != 0) return EXIT_IO;
  if (status != MPIB_AGENT_STATUS_SUCCESS) {
    fprintf(stderr, "status %u\n", (unsigned)status);
    return EXIT_REFUSED;
  }
  if (slot >= MPIB_HINT_MAX_ENTRIES) {
    fprintf(stderr, "%s: register: hint_slot %u out of range 0 .. %u\n", prog, (unsigned)slot,
            (unsigned)MPIB_HINT_MAX_ENTRIES - 1);
    rc = EXIT_IO;
  } else {
    printf("slot %u\n", (unsigned)slot);
    /* 3. Write the hint. */
    rc = hint_update(hint_path, slot, sup_bw);
  }

  /* 4. Deregister, also after a failed hint step so the agent does not keep the slot. */
  if (agent_deregister(socket_path, reg.conn_id, &status) != 0) return rc != EXIT_DONE ? rc : EXIT_IO;
  if (rc != EXIT_DONE) {
    fprintf(stderr, "%s: cleanup: deregistered status %u\n", prog, (unsigned)status);
    return rc;
  }
  printf("deregistered status %u\n", (unsigned)status);

  if (fflush(stdout) != 0) {
    fprintf(stderr, "%s: stdout: %s\n", prog, strerror(errno));
    return EXIT_IO;
  }
  return EXIT_DONE;
}
