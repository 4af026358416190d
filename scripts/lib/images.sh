# shellcheck shell=bash
# Container images without a registry, for the CRI scenario tests: OCI image layouts built at test
# time from local files, packed as tar archives that `ctr images import` reads
# (docs/containerd-lines.md). Source it; it defines functions only. Needs sha256sum and tar.

# gf_oci_archive OUT_TAR REF ROOTFS_DIR ENTRYPOINT_JSON: one single-layer linux/amd64 image named
# REF (e.g. gpufence.test/pause:1) whose filesystem is ROOTFS_DIR, packed as an OCI layout.
gf_oci_archive() {
  local out=$1 ref=$2 rootfs=$3 entrypoint=$4 lay
  lay=$(mktemp -d "${out%/*}/oci-XXXXXX")
  mkdir -p "$lay/blobs/sha256"
  # A reproducible layer: sorted names, fixed times and owners.
  tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$lay/layer.tar" .
  local layer_sha layer_size
  layer_sha=$(sha256sum "$lay/layer.tar" | awk '{print $1}')
  layer_size=$(stat -c %s "$lay/layer.tar")
  mv "$lay/layer.tar" "$lay/blobs/sha256/$layer_sha"
  printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entrypoint" "$layer_sha" > "$lay/config.json"
  local config_sha config_size manifest_sha manifest_size
  config_sha=$(sha256sum "$lay/config.json" | awk '{print $1}')
  config_size=$(stat -c %s "$lay/config.json")
  mv "$lay/config.json" "$lay/blobs/sha256/$config_sha"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config_sha" "$config_size" "$layer_sha" "$layer_size" > "$lay/manifest.json"
  manifest_sha=$(sha256sum "$lay/manifest.json" | awk '{print $1}')
  manifest_size=$(stat -c %s "$lay/manifest.json")
  mv "$lay/manifest.json" "$lay/blobs/sha256/$manifest_sha"
  # io.containerd.image.name: the full name ctr import gives the image.
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_sha" "$manifest_size" "$ref" "${ref##*:}" > "$lay/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$lay/oci-layout"
  tar -C "$lay" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out" oci-layout index.json blobs
  rm -rf "$lay"
}

# gf_test_images DIR PAUSE PROBE: builds DIR/pause.tar (gpufence.test/pause:1, PAUSE as /pause) and
# DIR/app.tar (gpufence.test/app:1: busybox-static and PROBE as /bin/gpufence-probe).
GF_PAUSE_IMAGE=gpufence.test/pause:1
GF_APP_IMAGE=gpufence.test/app:1
gf_test_images() {
  local dir=$1 pause=$2 probe=$3
  mkdir -p "$dir/pause-root" "$dir/app-root"
  cp "$pause" "$dir/pause-root/pause"
  gf_make_rootfs "$dir/app-root" "$probe"
  mkdir -p "$dir/app-root/etc"
  gf_oci_archive "$dir/pause.tar" "$GF_PAUSE_IMAGE" "$dir/pause-root" '["/pause"]'
  gf_oci_archive "$dir/app.tar" "$GF_APP_IMAGE" "$dir/app-root" '["/bin/sh"]'
}

# gf_seed_app_image DIR SMI DEEPSTREAM_APP: DIR/seed-app.tar (gpufence.test/seed-app:1), the app
# image plus what a DeepStream pod of the seed runs: a deepstream-app stand-in with its config
# (/app/ds.txt, gpu-id=0 as the sample configs), an nvidia-smi -L stand-in (SMI, dynamic: the
# test mounts the host's /usr read-only for its libraries, and the driver library as a volume),
# /lib and /lib64 as merged-/usr links. Built after gf_test_images, from its app root.
GF_SEED_APP_IMAGE=gpufence.test/seed-app:1
gf_seed_app_image() {
  local dir=$1 smi=$2 app=$3 root=$1/seed-app-root a
  rm -rf "$root"
  cp -a "$dir/app-root" "$root"
  for a in sed head grep readlink; do ln -sf busybox "$root/bin/$a"; done
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  mkdir -p "$root/usr" "$root/app" "$root/opt/gpufence/bin"
  cp "$smi" "$root/bin/gpufence-smi"
  cp "$app" "$root/bin/deepstream-app"
  printf '[application]\nenable-perf-measurement=1\n\n[source0]\nenable=1\ngpu-id=0\n\n[primary-gie]\nenable=1\ngpu-id=0  # the sample config'"'"'s note\nconfig-file=config_infer.txt\n' > "$root/app/ds.txt"
  gf_oci_archive "$dir/seed-app.tar" "$GF_SEED_APP_IMAGE" "$root" '["/bin/sh"]'
}

# gf_import_images CTR ADDRESS DIR: imports every image archive of DIR into containerd's k8s.io
# namespace (the CRI's).
gf_import_images() {
  local ctr=$1 address=$2 dir=$3 t
  for t in pause app seed-app; do
    [ -f "$dir/$t.tar" ] || continue
    "$ctr" --address "$address" -n k8s.io images import "$dir/$t.tar" || return 1
  done
}
