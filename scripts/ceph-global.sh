#!/usr/bin/env bash
# Sourced by cephfs.sh and test-rgw.sh: the [global] section of a throwaway single-node Ceph
# on loopback (one memstore OSD, pools of size 1), common to both clusters.
#   ceph_global_conf DIR FSID MON_V2 MON_V1 PORT_MIN PORT_MAX MEMSTORE_BYTES
# Daemons bind in PORT_MIN..PORT_MAX, so the two clusters can run at the same time.

ceph_global_conf() {
  local dir=$1 fsid=$2 v2=$3 v1=$4 port_min=$5 port_max=$6 memstore=$7
  cat <<CONF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$v2,v1:127.0.0.1:$v1]
public_network = 127.0.0.0/8
ms_bind_ipv6 = false
ms_bind_port_min = $port_min
ms_bind_port_max = $port_max
mon_warn_on_insecure_global_id_reclaim_allowed = false
run_dir = $dir/run
admin_socket = $dir/run/\$name.asok
pid_file = $dir/run/\$name.pid
log_file = $dir/log/\$name.log
keyring = $dir/keyring
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_autoscale_mode = off
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
mon_max_pg_per_osd = 1000
osd_objectstore = memstore
memstore_device_bytes = $memstore
osd_memory_target = 1073741824
osd_op_num_shards = 2
osd_op_num_threads_per_shard = 1
CONF
}
