/*
 * mpib_agent.h: the MPIB policy agent interface, for agents written in C (or any language that
 * can read this layout). The plugin (libnccl-net-mpib.so, advanced mode MPIB_MODE=1) speaks it on
 * a Unix stream socket; the agent owns a shared-memory hint file the plugin maps read-only.
 *
 * Every field is packed and in host order (little-endian: MPIB builds for little-endian hosts only)
 * except the IPv4 addresses, which are in network order (as in struct in_addr). Reserved bytes are
 * written as zero and ignored when read.
 *
 * Socket (default /tmp/mpib/agent.sock; /tmp/mpib/TAG/agent.sock with MPIB_AGENT_TAG=TAG;
 * MPIB_AGENT_SOCKET overrides): the plugin connects, sends one request, reads one response.
 *   register    (mpib_agent_register_request, 28 bytes) -> mpib_agent_register_response (16)
 *   deregister  (mpib_agent_deregister_request, 12 bytes) -> mpib_agent_deregister_response (12)
 *
 * Hint file (default /tmp/mpib/hints; /tmp/mpib/TAG/hints with MPIB_AGENT_TAG=TAG;
 * MPIB_HINT_PATH overrides), MPIB_HINT_FILE_SIZE (4112) bytes: a header and 256 entries. Build it
 * whole under a temporary name and rename it into place; never truncate, shrink or replace it
 * while jobs run (a reader of a shrunk mapping gets SIGBUS).
 *
 * One writer per entry (mpib-agent holds an exclusive flock on the file). For each change of
 * sup_bw: old = seq (even); store seq = old + 1 (odd); a release fence (so the new value cannot
 * be seen before the odd seq); store sup_bw; store seq = old + 2 with release ordering. The
 * plugin loads seq, sup_bw and seq again with acquire ordering and keeps the value only when
 * seq was even and unchanged; after 8 failed tries it keeps its previous value, so a writer that
 * dies with seq odd leaves the entry frozen until the next writer completes a write. Fields are
 * naturally aligned in the page-aligned mapping: access them through pointers made with
 * offsetof, with the __atomic builtins. src_ip and dst_ip name the SOUT pair the entry serves
 * (written by the agent outside the seqlock; the plugin does not read them). sup_bw is the SUP
 * rail's share of each transfer in parts per 1024, 0 (all SOUT) to MPIB_HINT_SUP_BW_MAX (all
 * SUP). All connections with the same SOUT (src, dst) pair share one entry: writing it changes
 * them all.
 */
#ifndef MPIB_AGENT_H
#define MPIB_AGENT_H

#include <stdint.h>

#define MPIB_AGENT_MAGIC 0x4D504952u /* "MPIR" */
#define MPIB_HINT_MAGIC 0x4D504948u  /* "MPIH" */
#define MPIB_HINT_MAX_ENTRIES 256
#define MPIB_HINT_FILE_SIZE 4112
#define MPIB_HINT_SUP_BW_MAX 1024u /* all SUP; 0 is all SOUT */

enum mpib_agent_msg_type {
  MPIB_AGENT_MSG_REGISTER = 1,
  MPIB_AGENT_MSG_DEREGISTER = 2,
  MPIB_AGENT_MSG_RESPONSE = 128,
};

enum mpib_agent_status {
  MPIB_AGENT_STATUS_SUCCESS = 0,
  MPIB_AGENT_STATUS_NO_FREE_SLOTS = 1,
  MPIB_AGENT_STATUS_INVALID_REQUEST = 2,
};

#pragma pack(push, 1)
struct mpib_agent_header {
  uint32_t magic;   /* MPIB_AGENT_MAGIC */
  uint16_t msg_len; /* bytes of the whole message, this header included */
  uint8_t msg_type; /* enum mpib_agent_msg_type */
  uint8_t reserved;
};

struct mpib_agent_register_request {
  struct mpib_agent_header header; /* msg_type REGISTER, msg_len 28 */
  uint32_t conn_id;                /* pid << 16 | per-process counter (16 bits) */
  uint32_t sout_src_ip;            /* network order */
  uint32_t sout_dst_ip;
  uint32_t sup_src_ip;
  uint32_t sup_dst_ip;
};

struct mpib_agent_register_response {
  struct mpib_agent_header header; /* msg_type RESPONSE, msg_len 16 */
  uint8_t status;                  /* enum mpib_agent_status */
  uint8_t reserved[3];
  uint32_t hint_slot;              /* valid when status is SUCCESS: 0 .. 255 */
};

struct mpib_agent_deregister_request {
  struct mpib_agent_header header; /* msg_type DEREGISTER, msg_len 12 */
  uint32_t conn_id;
};

struct mpib_agent_deregister_response {
  struct mpib_agent_header header; /* msg_type RESPONSE, msg_len 12 */
  uint8_t status;
  uint8_t reserved[3];
};

struct mpib_hint_header {
  uint32_t magic;       /* MPIB_HINT_MAGIC */
  uint32_t max_entries; /* MPIB_HINT_MAX_ENTRIES */
  uint8_t reserved[8];
};

struct mpib_hint_entry {
  uint32_t sup_bw; /* parts per 1024 */
  uint32_t seq;    /* seqlock: odd while the agent writes */
  uint32_t src_ip; /* the SOUT pair this entry serves, network order */
  uint32_t dst_ip;
};

struct mpib_hint_file {
  struct mpib_hint_header header;
  struct mpib_hint_entry entries[MPIB_HINT_MAX_ENTRIES];
};
#pragma pack(pop)

_Static_assert(sizeof(struct mpib_agent_header) == 8, "header is 8 bytes");
_Static_assert(sizeof(struct mpib_agent_register_request) == 28, "register request is 28 bytes");
_Static_assert(sizeof(struct mpib_agent_register_response) == 16, "register response is 16 bytes");
_Static_assert(sizeof(struct mpib_agent_deregister_request) == 12, "deregister request is 12 bytes");
_Static_assert(sizeof(struct mpib_agent_deregister_response) == 12, "deregister response is 12 bytes");
_Static_assert(sizeof(struct mpib_hint_entry) == 16, "hint entry is 16 bytes");
_Static_assert(sizeof(struct mpib_hint_file) == MPIB_HINT_FILE_SIZE, "hint file is 4112 bytes");

#endif /* MPIB_AGENT_H */
