/* Taken from the reference Soft-RoCE rig (listdev.c) so that scripts/rxe-vm
 * is self-contained. Built and run by selftest.sh. */
/* Tiny host-built libibverbs program: list devices, port state and the RoCE v2 IPv4 GIDs. */
#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    if (!l) { perror("ibv_get_device_list"); return 1; }
    printf("%d device(s)\n", n);
    for (int i = 0; i < n; i++) {
        struct ibv_context *c = ibv_open_device(l[i]);
        struct ibv_device_attr a; struct ibv_port_attr p;
        if (!c || ibv_query_device(c, &a) || ibv_query_port(c, 1, &p)) { printf("%s: query failed\n", ibv_get_device_name(l[i])); continue; }
        printf("%s: max_qp=%d max_srq=%d max_srq_wr=%d max_mr_size=%llu port1 state=%d active_mtu=%d gid_tbl_len=%d\n",
               ibv_get_device_name(l[i]), a.max_qp, a.max_srq, a.max_srq_wr, (unsigned long long)a.max_mr_size,
               p.state, 128 << p.active_mtu, p.gid_tbl_len);
        for (int g = 0; g < p.gid_tbl_len && g < 16; g++) {
            union ibv_gid gid; struct ibv_gid_entry e;
            if (ibv_query_gid(c, 1, g, &gid) || (gid.global.subnet_prefix == 0 && gid.global.interface_id == 0)) continue;
            const char *t = ibv_query_gid_ex(c, 1, g, &e, 0) ? "?" : (e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCEv2" : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCEv1" : "IB");
            printf("  gid[%d] %s ", g, t);
            for (int b = 0; b < 16; b++) printf("%02x%s", gid.raw[b], (b % 2 && b < 15) ? ":" : "");
            printf("\n");
        }
        ibv_close_device(c);
    }
    ibv_free_device_list(l);
    return 0;
}
