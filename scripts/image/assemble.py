#!/usr/bin/env python3
"""The gpufence image, from a build tree, without a registry or a container builder.

  assemble.py rootfs BUILD_DIR OUT_DIR         the image's file tree (the Containerfile copies it)
  assemble.py oci BUILD_DIR OUT.tar [--ref R]  an OCI image layout archive for `ctr images import`

The tree holds the binaries (BINARIES) at /usr/local/bin (stripped), /usr/bin/nsenter (the installer's
way to the host's systemctl and snap), exactly the shared libraries they load
(ldd's answer, the ELF interpreter included), /etc/passwd and /etc/group with root and nobody,
and /tmp. Nothing else: no shell, no package manager. The layer is a reproducible tar (sorted,
mtime 0, owner 0:0), so the same build tree gives the same image digest.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

BINARIES = ["gpufence", "gpufence-runtime", "gpufence-nri", "gpufence-device-plugin", "gpufence-dra"]
# Host tools the binaries run: the node installer restarts containerd through
# `nsenter -t 1 ... -- systemctl|snap` (docs/install.md); Debian's util-linux build.
TOOLS = ["/usr/bin/nsenter"]
DEFAULT_REF = "ghcr.io/gpufence/gpufence:0.1.0"


def needed_libraries(paths):
    """Every shared object ldd says the binaries load, by the path the loader finds it at."""
    libs = set()
    for p in paths:
        out = subprocess.run(["ldd", p], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"ldd {p} failed: {out.stderr.strip() or out.stdout.strip()}")
        for line in out.stdout.splitlines():
            line = line.strip()
            if "not found" in line:
                sys.exit(f"{p}: {line}")
            m = re.match(r"\S+ => (/\S+) \(", line) or re.match(r"(/\S+) \(", line)
            if m:
                libs.add(m.group(1))
    return sorted(libs)


def make_rootfs(build, out):
    bins = [os.path.join(build, "bin", b) for b in BINARIES]
    for b in bins:
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is missing: build first (make build)")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "usr/local/bin"))
    for b in bins:
        dest = os.path.join(out, "usr/local/bin", os.path.basename(b))
        shutil.copy2(b, dest)
        # Debug info stays in the build tree; the image ships what runs.
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-unneeded", dest], check=True)
    for t in TOOLS:
        if not os.access(t, os.X_OK):
            sys.exit(f"{t} is missing (apt-get install util-linux)")
        dest = os.path.join(out, t.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(t, dest)
    libs = needed_libraries(bins + TOOLS)
    for lib in libs:
        dest = os.path.join(out, lib.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)  # the file itself, at the name the loader uses
    # Debian 12 keeps /lib as a link to usr/lib; the loader's paths are /lib64 and /lib/...
    os.makedirs(os.path.join(out, "etc"))
    with open(os.path.join(out, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    with open(os.path.join(out, "etc/group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\n")
    os.makedirs(os.path.join(out, "tmp"))
    os.chmod(os.path.join(out, "tmp"), 0o1777)
    return libs


def layer_tar(rootfs):
    """A reproducible tar of the tree: sorted entries, mtime 0, owner 0:0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = []
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                entries.append(os.path.join(dirpath, name))
        for path in sorted(entries, key=lambda p: os.path.relpath(p, rootfs)):
            info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_oci(build, out_tar, ref, work):
    rootfs = os.path.join(work, "rootfs")
    libs = make_rootfs(build, rootfs)
    layer = layer_tar(rootfs)
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0) as g:
        g.write(layer)
    layer_gz = gz.getvalue()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/local/bin/gpufence"],
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "Labels": {"org.opencontainers.image.source": "https://github.com/gpufence/gpufence"},
        },
        "rootfs": {"type": "layers", "diff_ids": [blob(layer)]},
        "history": [{"created_by": "scripts/image/assemble.py (binaries + ldd's libraries)"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": blob(layer_gz), "size": len(layer_gz)}],
    }, sort_keys=True).encode()
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": blob(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       # containerd names the imported image from these.
                       "annotations": {"io.containerd.image.name": ref,
                                       "org.opencontainers.image.ref.name": tag}}],
    }, sort_keys=True).encode()
    files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for data in (config, manifest, layer_gz):
        files["blobs/sha256/" + blob(data).split(":")[1]] = data
    with tarfile.open(out_tar, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(files[name]), 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    return {"ref": ref, "manifest": blob(manifest), "layer_bytes": len(layer),
            "layer_gzip_bytes": len(layer_gz), "libraries": libs,
            "files": sum(len(f) for _, _, f in os.walk(rootfs))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rootfs")
    r.add_argument("build")
    r.add_argument("out")
    o = sub.add_parser("oci")
    o.add_argument("build")
    o.add_argument("out")
    o.add_argument("--ref", default=DEFAULT_REF)
    o.add_argument("--work", default=None, help="scratch directory (default: OUT.d)")
    a = ap.parse_args()
    if a.cmd == "rootfs":
        libs = make_rootfs(a.build, a.out)
        print(f"{a.out}: {len(BINARIES)} binaries, {len(libs)} shared objects")
        return
    work = a.work or a.out + ".d"
    os.makedirs(work, exist_ok=True)
    info = make_oci(a.build, a.out, a.ref, work)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
