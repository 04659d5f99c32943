#!/bin/sh
# The compose devnet's first start (deploy/compose.yaml, service init): a key for each host and
# for the proposer, each in its own volume, and a genesis that funds them and gives each host
# PoC weight. Every step is skipped when its file exists, so a second run changes nothing.
# Run as root in the container only to give the volumes to the trainshard user.
#
# TS_INIT_ROOT (default empty) is put before every path: the functional test
# tests/functional/test_deploy.py runs this script against a folder of its own.
set -eu

root="${TS_INIT_ROOT:-}"
keys="$root/var/lib/trainshard-keys"
devnet="$root/var/lib/trainshard-devnet"
hosts="$root/var/lib/trainshard-hosts"
chain_id="${TS_CHAIN_ID:-trainshard-devnet-1}"

# ngonka: the proposer pays escrows and deposits; hosts pay nothing but need accounts on chain.
proposer_balance=1000000000000
host_balance=1000000000
host_weight=100

for who in host1 host2 host3 proposer; do
  mkdir -p "$keys/$who"
  if [ "$who" = proposer ]; then key="$keys/$who/proposer.key"; else key="$keys/$who/host.key"; fi
  if [ ! -e "$key" ]; then
    trainshard keys new --out "$key" >/dev/null
    echo "init: made $key"
  fi
done

address() {
  trainshard keys show --key "$1" | sed -n 's/^address: *//p'
}

if [ ! -e "$devnet/genesis.json" ]; then
  mkdir -p "$devnet"
  proposer=$(address "$keys/proposer/proposer.key")
  set -- --account "$proposer=$proposer_balance" --poc-authority "$proposer"
  for host in host1 host2 host3; do
    a=$(address "$keys/$host/host.key")
    set -- "$@" --account "$a=$host_balance" --weight "$a=$host_weight"
  done
  trainshard devnet init --home "$devnet" --chain-id "$chain_id" --voting-period 10 "$@"
fi

# The daemons run as trainshard: they own their volumes (each folder here is one), and nobody
# else may read them. The folders above them are the image's, read-only.
if [ "$(id -u)" = 0 ] && id trainshard >/dev/null 2>&1; then
  mkdir -p "$hosts/host1" "$hosts/host2" "$hosts/host3"
  chown -R trainshard:trainshard "$keys"/* "$devnet" "$hosts"/*
  chmod 0700 "$keys"/* "$devnet" "$hosts"/*
fi
echo "init: done"
