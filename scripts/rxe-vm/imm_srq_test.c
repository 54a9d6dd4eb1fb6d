/* Taken from the reference Soft-RoCE rig (imm_srq_test.c) so that scripts/rxe-vm
 * is self-contained. Built and run by selftest.sh. */
/* RC QP pair (sender on DEV_A, receiver on DEV_B) exchanging RDMA_WRITE_WITH_IMM into a
 * receiver MR; the receiver's QP takes its receive WQEs from a shared receive queue (SRQ).
 * One process, busy-polls both CQs.  Verifies opcode, imm_data, byte_len and payload.
 * usage: imm_srq_test DEV_A DEV_B [gid_idx=1] [iters=1000] [size=65536 (>=128)] [qp_timeout=14] [retry_cnt=7] */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEPTH 64
#define WINDOW 8   /* writes in flight; each goes to its own slot of the receiver buffer */
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
#define CHECK(x) do { if (!(x)) { fprintf(stderr, "FAILED: %s (line %d)\n", #x, __LINE__); exit(2); } } while (0)

struct side { struct ibv_context *ctx; struct ibv_pd *pd; struct ibv_cq *cq; struct ibv_srq *srq; struct ibv_qp *qp; struct ibv_mr *mr; char *buf; union ibv_gid gid; };

static void open_side(struct side *s, const char *name, int gidx, size_t size, int with_srq) {
    int n; struct ibv_device **l = ibv_get_device_list(&n); CHECK(l);
    for (int i = 0; i < n; i++) if (!strcmp(ibv_get_device_name(l[i]), name)) s->ctx = ibv_open_device(l[i]);
    ibv_free_device_list(l); CHECK(s->ctx);
    CHECK(s->pd = ibv_alloc_pd(s->ctx));
    CHECK(s->cq = ibv_create_cq(s->ctx, 4 * DEPTH, NULL, NULL, 0));
    CHECK(s->buf = aligned_alloc(4096, size));
    CHECK(s->mr = ibv_reg_mr(s->pd, s->buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (with_srq) { struct ibv_srq_init_attr sa = { .attr = { .max_wr = 2 * DEPTH, .max_sge = 1 } }; CHECK(s->srq = ibv_create_srq(s->pd, &sa)); }
    struct ibv_qp_init_attr qa = { .send_cq = s->cq, .recv_cq = s->cq, .srq = s->srq, .qp_type = IBV_QPT_RC,
        .cap = { .max_send_wr = DEPTH, .max_recv_wr = with_srq ? 0 : 1, .max_send_sge = 1, .max_recv_sge = 1 } };
    CHECK(s->qp = ibv_create_qp(s->pd, &qa));
    CHECK(ibv_query_gid(s->ctx, 1, gidx, &s->gid) == 0);
}

static void connect(struct side *s, struct side *peer, int gidx, int timeout, int retry) {
    struct ibv_port_attr pa; CHECK(ibv_query_port(s->ctx, 1, &pa) == 0);
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR; a.path_mtu = pa.active_mtu; a.dest_qp_num = peer->qp->qp_num; a.rq_psn = 0;
    a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = peer->gid; a.ah_attr.grh.sgid_index = gidx; a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
    a.qp_state = IBV_QPS_RTS; a.timeout = timeout; a.retry_cnt = retry; a.rnr_retry = 7; a.sq_psn = 0; a.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void post_srq_recv(struct side *r, uint64_t id) {
    struct ibv_recv_wr wr = { .wr_id = id, .num_sge = 0 }, *bad;   /* WRITE_WITH_IMM needs a WQE but no buffer */
    CHECK(ibv_post_srq_recv(r->srq, &wr, &bad) == 0);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s DEV_A DEV_B [gid_idx] [iters] [size] [qp_timeout] [retry_cnt]\n", argv[0]); return 1; }
    int gidx = argc > 3 ? atoi(argv[3]) : 1, iters = argc > 4 ? atoi(argv[4]) : 1000;
    size_t size = argc > 5 ? strtoul(argv[5], 0, 0) : 65536;
    int timeout = argc > 6 ? atoi(argv[6]) : 14, retry = argc > 7 ? atoi(argv[7]) : 7;
    struct side s = {0}, r = {0};
    open_side(&s, argv[1], gidx, size * WINDOW, 0);
    open_side(&r, argv[2], gidx, size * WINDOW, 1);
    connect(&s, &r, gidx, timeout, retry); connect(&r, &s, gidx, timeout, retry);
    for (int i = 0; i < 2 * DEPTH; i++) post_srq_recv(&r, i);
    int posted = 0, sent = 0, recvd = 0, errors = 0; double t0 = now(), tlast = t0;
    while (recvd < iters && !errors) {
        if (posted < iters && posted - recvd < WINDOW && posted - sent < WINDOW) {
            /* a send slot is rewritten only after its previous write completed (retransmits re-read it) */
            char *src = s.buf + (posted % WINDOW) * size;
            memset(src, (char)posted, 64); memset(src + size - 64, (char)posted, 64);  /* head+tail carry the seq number */
            struct ibv_sge sge = { .addr = (uintptr_t)src, .length = size, .lkey = s.mr->lkey };
            struct ibv_send_wr wr = { .wr_id = posted, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                .send_flags = IBV_SEND_SIGNALED, .imm_data = htobe32(0xC0DE0000u + (posted & 0xffff)),
                .wr.rdma = { .remote_addr = (uintptr_t)r.buf + (posted % WINDOW) * size, .rkey = r.mr->rkey } }, *bad;
            CHECK(ibv_post_send(s.qp, &wr, &bad) == 0); posted++;
        }
        struct ibv_wc wc[16]; int n;
        while ((n = ibv_poll_cq(s.cq, 16, wc)) > 0)
            for (int i = 0; i < n; i++) {
                if (wc[i].status) { printf("sender wc error: %s (%d) wr_id=%lu after %.3f s\n", ibv_wc_status_str(wc[i].status), wc[i].status, wc[i].wr_id, now() - tlast); errors++; }
                sent++;
            }
        CHECK(n >= 0);
        while ((n = ibv_poll_cq(r.cq, 16, wc)) > 0)
            for (int i = 0; i < n; i++) {
                if (wc[i].status) { printf("receiver wc error: %s\n", ibv_wc_status_str(wc[i].status)); errors++; continue; }
                uint32_t imm = be32toh(wc[i].imm_data);
                if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc[i].wc_flags & IBV_WC_WITH_IMM) ||
                    imm != 0xC0DE0000u + (recvd & 0xffff) || wc[i].byte_len != size ||
                    r.buf[(recvd % WINDOW) * size] != (char)recvd || r.buf[(recvd % WINDOW + 1) * size - 1] != (char)recvd) {
                    printf("mismatch at %d: opcode=%d imm=%#x len=%u\n", recvd, wc[i].opcode, imm, wc[i].byte_len); errors++;
                }
                recvd++; tlast = now(); post_srq_recv(&r, recvd);
            }
        CHECK(n >= 0);
    }
    double dt = now() - t0;
    printf("%s -> %s: %d RDMA_WRITE_WITH_IMM x %zu B via SRQ, %d errors, %.3f s, %.1f MB/s, %.1f us/op\n",
           argv[1], argv[2], recvd, size, errors, dt, recvd * (double)size / dt / 1e6, dt / (recvd ? recvd : 1) * 1e6);
    double tc = now();   /* teardown: after a transport error this is where rxe can be slow */
    ibv_destroy_qp(s.qp); ibv_destroy_qp(r.qp); ibv_destroy_srq(r.srq);
    ibv_dereg_mr(s.mr); ibv_dereg_mr(r.mr); ibv_destroy_cq(s.cq); ibv_destroy_cq(r.cq);
    ibv_dealloc_pd(s.pd); ibv_dealloc_pd(r.pd); ibv_close_device(s.ctx); ibv_close_device(r.ctx);
    if (now() - tc > 0.5) printf("teardown took %.3f s\n", now() - tc);
    return errors ? 3 : 0;
}
