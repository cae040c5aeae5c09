#!/bin/sh
# Two "machines" on this one: network namespaces joined by a veth pair, and mpirun in the first
# starting one rank there and one in the second (through an `ssh` that is `ip netns exec`), with
# MPI restricted to TCP over the veth link, the path real machines take. Needs root and iproute2.
# Usage: two_namespaces.sh KEEL ARGS... (runs `KEEL ARGS...` as the two ranks; prints the bytes
# that crossed the veth link last)
set -eu
keel="$1"
shift
id=$$
ns0="keel-a-$id"
ns1="keel-b-$id"
net=10.231.$((id % 200)).
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$ns0" 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

ip netns add "$ns0"
ip netns add "$ns1"
ip link add "kva$id" type veth peer name "kvb$id"
ip link set "kva$id" netns "$ns0"
ip link set "kvb$id" netns "$ns1"
ip -n "$ns0" addr add "${net}1/24" dev "kva$id"
ip -n "$ns1" addr add "${net}2/24" dev "kvb$id"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "kva$id" up
ip -n "$ns1" link set "kvb$id" up

# mpirun's launcher calls `AGENT HOST COMMAND...` for a remote host: enter that host's namespace.
cat >"$tmp/netns-ssh" <<AGENT
#!/bin/sh
host="\$1"
shift
case "\$host" in
  ${net}1) ns="$ns0" ;;
  ${net}2) ns="$ns1" ;;
  *) echo "netns-ssh: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$tmp/netns-ssh"

status=0
ip netns exec "$ns0" mpirun --allow-run-as-root --oversubscribe -np 2 \
  --host "${net}1:1,${net}2:1" \
  --mca plm_rsh_agent "$tmp/netns-ssh" \
  --mca btl tcp,self --mca btl_tcp_if_include "${net}0/24" --mca oob_tcp_if_include "${net}0/24" \
  -x OMP_NUM_THREADS=1 \
  "$keel" "$@" || status=$?
# What crossed the link: the test checks that the ranks really talked over it.
echo "two_namespaces: veth bytes sent $(ip netns exec "$ns0" cat "/sys/class/net/kva$id/statistics/tx_bytes")" \
  "received $(ip netns exec "$ns0" cat "/sys/class/net/kva$id/statistics/rx_bytes")"
exit "$status"
