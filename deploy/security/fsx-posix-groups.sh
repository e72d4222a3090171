#!/usr/bin/env bash
# FSx for Lustre as main's tier: only main's CI identity writes, jobs read.
#
# Run once, as root, on a host that mounts the file system at $MOUNT. Writers (the CI runners
# that warm and promote) are members of $WRITERS; jobs run as any other user and get a read-only
# view: no group write on the cache, and mount the file system read-only in job pods
# (deploy/k8s/coldstart/*.yaml: `readOnly: true`) so a runtime can never write the shared tier
# directly. Jobs then read through `neffcache prefetch --require-signed` to node-local disk.
set -euo pipefail
MOUNT="${MOUNT:-/mnt/fsx}"
CACHE="${CACHE:-$MOUNT/neuron-cache}"
WRITERS="${WRITERS:-neffcache-writers}"

getent group "$WRITERS" >/dev/null || groupadd --system "$WRITERS"
mkdir -p "$CACHE"
chgrp -R "$WRITERS" "$CACHE"
# setgid directories: entries published later keep the writers' group; others may only read.
find "$CACHE" -type d -exec chmod 2775 {} +
find "$CACHE" -type f -exec chmod 0644 {} +
# Journals and leases under .neffcache are the writers' alone.
mkdir -p "$CACHE/.neffcache"
chmod 2770 "$CACHE/.neffcache"
echo "$CACHE: writable by group $WRITERS only; mount it read-only in job pods"
