"""The agent image as a training pod uses it (issue 20): its bundle, copied out exactly as the
operator's init container copies it, runs jobs inside foreign trainer roots.

    agent_image_test.py --source-dir REPO --archive build/images/agent.tar --root busybox
    agent_image_test.py --source-dir REPO --archive build/images/agent.tar --root trixie

1. The image (build/images/agent.tar, from `make images`): named
   ghcr.io/spawnpoint/agent:<the chart's appVersion>, under 20 MB, user 65532:65532, the
   bundle's launcher as entry point, OCI labels with the version the agent reports.
2. The init container (operator/reconciler/children.cc): `cp -R /opt/spawnpoint/.
   /spawnpoint/` run in the image with buildah as the image's user (the pod does not set
   one), read-only root, into an empty directory (root's, mode 0777, as a kubelet makes an
   emptyDir). The copy must be the image's bundle file for file (content, links, modes),
   owned by 65532.
3. The copy, read-only at /opt/spawnpoint, in a trainer root (scripts/in-root.sh):
   - busybox: a root with nothing but Debian 12's static busybox (scripts/foreign-root.sh
     bookworm-busybox; no libc, no loader): `spawnpoint-agent run` of a 2-rank job whose
     ranks are busybox shell scripts that meet at a barrier and report their environment; it
     must exit 0 with both ranks' reports; a second job whose rank 1 exits 7 must fail and
     name that rank and code.
   - trixie (or bullseye): a root made from Debian's python3-torch (scripts/foreign-root.sh):
     tests/foreign/ddp_under_agent.py, a 2-rank gloo DDP trainer with a DataLoader of 2
     workers, through the copy's Python shim (run_foreign_test.sh).
Exit status: 0 passed, 1 failed, 77 skipped (not root).
"""

import argparse
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import textwrap

import image_run

MAX_BYTES = 20 * 1000 * 1000
IMAGE_DIR = "/opt/spawnpoint"  # operator/reconciler/children.h: agent_image_dir
REPOSITORY = "ghcr.io/spawnpoint/agent"


class Checks(object):
    def __init__(self):
        self.failed = 0
        self.passed = 0

    def check(self, ok, what, detail=""):
        print(("ok: " if ok else "FAIL: ") + what + (("\n" + detail) if detail and not ok else ""))
        sys.stdout.flush()
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def equal(self, actual, expected, what, detail=""):
        return self.check(actual == expected, "%s: %r (expected %r)" % (what, actual, expected),
                          detail)


def app_version(source_dir):
    with open(os.path.join(source_dir, "charts", "spawnpoint", "Chart.yaml")) as f:
        return re.search(r'^appVersion:\s*"?([^"\s]+)"?', f.read(), re.M).group(1)


def tree(top):
    """{relative path: (kind, mode bits, content digest or link target)} under top."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, top)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                entries[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
    return entries


def check_image(checks, image, version):
    config = image.config.get("config", {})
    labels = config.get("Labels") or {}
    checks.equal(image.ref, "%s:%s" % (REPOSITORY, version),
                 "the archive's image name (the chart's default agentImage)")
    checks.check(image.size < MAX_BYTES, "image size %.1f MB is under %d MB (layers: %s)" % (
        image.size / 1e6, MAX_BYTES // 1000000,
        ", ".join("%.1f MB" % (l["uncompressed"] / 1e6) for l in image.layers)))
    checks.equal(config.get("User"), "65532:65532", "the image's user")
    checks.equal(config.get("Entrypoint"), [IMAGE_DIR + "/bin/spawnpoint-agent"],
                 "the image's entry point")
    checks.equal(labels.get("org.opencontainers.image.version"), version,
                 "label org.opencontainers.image.version")
    checks.equal(labels.get("org.opencontainers.image.licenses"), "Apache-2.0",
                 "label org.opencontainers.image.licenses (LICENSE)")
    for label in ("source", "licenses", "revision", "title"):
        checks.check(bool(labels.get("org.opencontainers.image." + label)),
                     "label org.opencontainers.image.%s: %r" % (
                         label, labels.get("org.opencontainers.image." + label)))


def init_container_copy(checks, store, archive, workdir):
    """The init container's copy into a fresh emptyDir-like directory: its path, or None."""
    ctr = store.container(archive)
    empty = os.path.join(workdir, "emptydir")
    os.mkdir(empty)
    os.chmod(empty, 0o777)  # a kubelet's emptyDir: root's, 0777
    command = ["cp", "-R", IMAGE_DIR + "/.", "/spawnpoint/"]  # children.cc's command
    proc = store.run(ctr, command, volumes=[(empty, "/spawnpoint", "rw")], read_only=True,
                     prepare=[IMAGE_DIR + "/bin/spawnpoint-agent", "--version"])
    print(proc.stdout)
    if not checks.equal(proc.returncode, 0, "init container %s exit status" % " ".join(command),
                        proc.stdout):
        return None
    image_tree = tree(os.path.join(store.mount(ctr), IMAGE_DIR.lstrip("/")))
    copy_tree = tree(empty)
    checks.check(len(image_tree) > 10 and "bin/spawnpoint-agent" in image_tree,
                 "the image holds the bundle (%d entries in %s)" % (len(image_tree), IMAGE_DIR))
    differ = sorted(set(image_tree) ^ set(copy_tree)) + sorted(
        p for p in set(image_tree) & set(copy_tree) if image_tree[p] != copy_tree[p])
    checks.check(not differ, "the copy is the image's bundle, file for file (content, links, "
                 "modes): %d entries" % len(copy_tree), "differ: %s" % differ[:20])
    owners = {os.lstat(os.path.join(empty, p)).st_uid for p in copy_tree}
    checks.equal(owners, {65532}, "owners of the copied files (the image's user)")
    return empty


BUSYBOX_RANK = textwrap.dedent("""\
    mkdir -p /tmp/barrier && : > /tmp/barrier/$RANK
    n=0
    while [ ! -e /tmp/barrier/0 ] || [ ! -e /tmp/barrier/1 ]; do
      n=$((n + 1)); [ $n -le 1200 ] || { echo "rank $RANK: no peer within 120 s"; exit 3; }
      sleep 0.1
    done
    [ "$RANK" = 1 ] && [ -n "$FAIL_RANK_1" ] && exit 7
    q='"'
    echo "SPAWNPOINT-BUSYBOX {${q}rank$q: $RANK, ${q}world$q: $WORLD_SIZE, \\
    ${q}local$q: $LOCAL_RANK, ${q}master$q: $q$MASTER_ADDR:$MASTER_PORT$q, ${q}pid$q: $$, \\
    ${q}ld_library_path$q: $q${LD_LIBRARY_PATH:-}$q, \\
    ${q}agent_exe$q: $q${SPAWNPOINT_AGENT_EXE:-}$q}"
""")


def busybox_job(name, fail_rank_1=False):
    env = "\n          env: [{name: FAIL_RANK_1, value: \"1\"}]" if fail_rank_1 else ""
    return textwrap.dedent("""\
        apiVersion: spawnpoint.dev/v1alpha1
        kind: TrainingJob
        metadata: {name: %s}
        spec:
          nodes: 1
          gpusPerNode: 0
          procsPerNode: 2
          backend: gloo
          template:
            spec:
              containers:
                - name: trainer
                  image: busybox-only
                  command: [/bin/sh, /opt/job/rank.sh]%s
          loader: {workersPerRank: 0}
          restartPolicy: {maxRestarts: 0}
        """) % (name, env)


def run_in_busybox_root(source_dir, root, bundle, workdir, job_text):
    jobdir = os.path.join(workdir, "job-%d" % len(os.listdir(workdir)))
    os.mkdir(jobdir)
    with open(os.path.join(jobdir, "job.yaml"), "w") as f:
        f.write(job_text)
    with open(os.path.join(jobdir, "rank.sh"), "w") as f:
        f.write(BUSYBOX_RANK)
    command = [IMAGE_DIR + "/bin/spawnpoint-agent", "run", "-f", "/opt/job/job.yaml",
               "--gpu-backend", "none", "--master-port", "0", "--metrics-addr", "off",
               "--status-interval", "60"]
    print("$ in-root.sh %s -- %s" % (root, " ".join(command)))
    proc = subprocess.run(["bash", os.path.join(source_dir, "scripts", "in-root.sh"),
                           "--bundle", bundle, "--ro-bind", jobdir + ":/opt/job", root, "--"]
                          + command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)
    print(proc.stdout)
    return proc


def busybox_checks(checks, source_dir, bundle, workdir, version):
    out = subprocess.run(["bash", os.path.join(source_dir, "scripts", "foreign-root.sh"),
                          "bookworm-busybox"], stdout=subprocess.PIPE, universal_newlines=True)
    if not checks.equal(out.returncode, 0, "scripts/foreign-root.sh bookworm-busybox"):
        return
    root = out.stdout.strip().splitlines()[-1]
    found = []
    for dirpath, _, filenames in os.walk(root):
        found += [os.path.join(dirpath, n) for n in filenames
                  if n.startswith(("libc.so", "ld-linux", "libc.musl", "ld-musl"))]
    files = sum(len(f) for _, _, f in os.walk(root))
    checks.check(not found and os.path.isfile(os.path.join(root, "bin", "busybox")),
                 "the trainer root %s holds busybox and no libc or loader (%d files)"
                 % (root, files), "found: %s" % found)
    proc = subprocess.run(["bash", os.path.join(source_dir, "scripts", "in-root.sh"),
                           "--bundle", bundle, root, "--",
                           IMAGE_DIR + "/bin/spawnpoint-agent", "--version"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=60)
    checks.equal(proc.stdout.strip(), "spawnpoint-agent " + version,
                 "the copy's spawnpoint-agent --version in the busybox root (the image's label)")

    proc = run_in_busybox_root(source_dir, root, bundle, workdir, busybox_job("busybox-ddp"))
    checks.equal(proc.returncode, 0, "spawnpoint-agent run of the 2-rank job: exit status")
    reports = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\[rank (\d+)\] SPAWNPOINT-BUSYBOX (\{.*\})$", line)
        if m:
            reports[int(m.group(1))] = json.loads(m.group(2))
    checks.equal(sorted(reports), [0, 1], "ranks that reported after the barrier")
    for rank, r in sorted(reports.items()):
        checks.equal((r["rank"], r["world"], r["local"]), (rank, 2, rank),
                     "rank %d: RANK, WORLD_SIZE, LOCAL_RANK" % rank)
        checks.check(re.match(r"^[^:]+:\d+$", r["master"]) is not None and
                     not r["master"].endswith(":0"),
                     "rank %d: MASTER_ADDR:MASTER_PORT %s" % (rank, r["master"]))
        checks.check(IMAGE_DIR not in r["ld_library_path"] and not r["agent_exe"],
                     "rank %d: nothing of the bundle in its environment (LD_LIBRARY_PATH %r, "
                     "SPAWNPOINT_AGENT_EXE %r)" % (rank, r["ld_library_path"], r["agent_exe"]))
    if len(reports) == 2:
        checks.check(reports[0]["pid"] != reports[1]["pid"], "the ranks are two processes")
    checks.check("all ranks succeeded" in proc.stdout, "the agent says all ranks succeeded")

    proc = run_in_busybox_root(source_dir, root, bundle, workdir,
                               busybox_job("busybox-fail", fail_rank_1=True))
    checks.check(proc.returncode != 0, "a job whose rank 1 exits 7 fails (exit %d)"
                 % proc.returncode)
    named = re.search(r"rank 1\b.*\bexit code 7\b", proc.stdout)
    checks.check(named is not None, "the agent names rank 1 and its exit code 7")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--archive", required=True)
    parser.add_argument("--root", required=True, help="busybox, or a foreign root's suite")
    args = parser.parse_args()
    image_run.require_root_and_buildah()
    checks = Checks()
    if not checks.check(os.path.isfile(args.archive),
                        "%s exists (make images, or the images_build test)" % args.archive):
        return 1
    version = app_version(args.source_dir)
    check_image(checks, image_run.Store.image(args.archive), version)
    store = image_run.Store()
    workdir = tempfile.mkdtemp(prefix="spawnpoint-agent-image-")
    try:
        bundle = init_container_copy(checks, store, args.archive, workdir)
        if bundle is None:
            pass
        elif args.root == "busybox":
            busybox_checks(checks, args.source_dir, bundle, workdir, version)
        else:
            runner = os.path.join(args.source_dir, "tests", "foreign", "run_foreign_test.sh")
            proc = subprocess.run(["bash", runner, "--suite", args.root, "--bundle", bundle,
                                   "ddp_under_agent.py"], timeout=900)
            checks.equal(proc.returncode, 0, "tests/foreign/ddp_under_agent.py in the %s root "
                         "with the copied bundle" % args.root)
    finally:
        store.close()
        subprocess.run(["rm", "-rf", "--one-file-system", workdir])
    print("agent_image_test (%s): %d passed, %d failed" % (args.root, checks.passed,
                                                           checks.failed))
    return 0 if checks.failed == 0 and checks.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
