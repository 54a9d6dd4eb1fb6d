/*
 * Golden bytes of the agent interface from include/mpib_agent.h, for tests/agent_header.rs:
 * prints, one message per line in hex, a register request (conn_id 0x12340005, SOUT
 * 10.0.0.1 -> 10.0.0.2, SUP 192.168.0.1 -> 192.168.0.2), a register response (success, slot 7),
 * a deregister request (conn_id 0x12340005) and a deregister response (no free slots), each built
 * through the header's structs. The test compares them with the plugin's own encoder, both ways.
 */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "mpib_agent.h"

static void dump(const void *message, size_t len) {
  const unsigned char *bytes = message;
  for (size_t i = 0; i < len; i++) printf("%02x", bytes[i]);
  printf("\n");
}

static struct mpib_agent_header header(uint16_t len, uint8_t type) {
  struct mpib_agent_header h = {MPIB_AGENT_MAGIC, len, type, 0};
  return h;
}

int main(void) {
  struct mpib_agent_register_request reg;
  memset(&reg, 0, sizeof reg);
  reg.header = header(sizeof reg, MPIB_AGENT_MSG_REGISTER);
  reg.conn_id = 0x12340005u;
  reg.sout_src_ip = inet_addr("10.0.0.1");
  reg.sout_dst_ip = inet_addr("10.0.0.2");
  reg.sup_src_ip = inet_addr("192.168.0.1");
  reg.sup_dst_ip = inet_addr("192.168.0.2");
  dump(&reg, sizeof reg);

  struct mpib_agent_register_response response;
  memset(&response, 0, sizeof response);
  response.header = header(sizeof response, MPIB_AGENT_MSG_RESPONSE);
  response.status = MPIB_AGENT_STATUS_SUCCESS;
  response.hint_slot = 7;
  dump(&response, sizeof response);

  struct mpib_agent_deregister_request dereg;
  memset(&dereg, 0, sizeof dereg);
  dereg.header = header(sizeof dereg, MPIB_AGENT_MSG_DEREGISTER);
  dereg.conn_id = 0x12340005u;
  dump(&dereg, sizeof dereg);

  struct mpib_agent_deregister_response dresponse;
  memset(&dresponse, 0, sizeof dresponse);
  dresponse.header = header(sizeof dresponse, MPIB_AGENT_MSG_RESPONSE);
  dresponse.status = MPIB_AGENT_STATUS_NO_FREE_SLOTS;
  dump(&dresponse, sizeof dresponse);

  /* Offsets a reader in another language relies on. */
  printf("%zu %zu %zu %zu\n", offsetof(struct mpib_agent_register_request, conn_id),
         offsetof(struct mpib_agent_register_request, sup_dst_ip),
         offsetof(struct mpib_agent_register_response, hint_slot),
         offsetof(struct mpib_hint_file, entries));
  return 0;
}
