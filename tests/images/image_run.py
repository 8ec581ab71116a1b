"""Runs commands inside the images `make images` wrote (build/images/*.tar), with buildah and a
storage of the test's own: what a node's container runtime would do with them, daemonless.

    store = Store()                          # vfs storage in a temporary directory
    image = store.image("build/images/agent.tar")   # the archive's name, config, layers
    ctr = store.container("build/images/agent.tar")
    store.run(ctr, ["cp", "-R", ...], user="65532:65532", volumes=[(src, dst, "rw")],
              read_only=True, prepare=["cp", "--help"])
    store.close()                            # every container and the storage go

read_only: the container's root file system is mounted read-only (as a pod's
readOnlyRootFilesystem), in a private mount namespace of the run, except /run, where buildah's
chroot isolation writes its /run/.containerenv (a fresh tmpfs; a runtime would give the
container none, and nothing here uses it). buildah first creates the mount points it needs
in the root (/etc/hosts, /etc/resolv.conf, /etc/hostname and the volumes' destinations):
`prepare`, a command that exists in the image, is run once writable for that. Every run is
in a PID namespace of its own that dies with it (unshare --kill-child, --pdeathsig), so
nothing it started outlives it.

Standard library only. Needs root (vfs storage, mounts, chroot) and buildah.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))

import oci_image  # noqa: E402  (scripts/oci_image.py)

SKIP = 77


def require_root_and_buildah():
    """Exits 77 (skip) when not root, which the runs need, as the foreign tests do; fails
    when buildah is missing: scripts/install-deps.sh installs it, so its absence is a bug of
    the machine's setup that must not pass as a skip."""
    if os.geteuid() != 0:
        print("SKIP: the images tests need root (buildah's vfs storage, chroot and mounts)")
        sys.exit(SKIP)
    if not shutil.which("buildah"):
        print("FAIL: buildah is not installed; scripts/install-deps.sh (make deps) installs it")
        sys.exit(1)


class Store(object):
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="spawnpoint-images-")
        self.base = ["buildah", "--root", os.path.join(self.dir, "storage"), "--runroot",
                     os.path.join(self.dir, "run"), "--storage-driver", "vfs"]
        self.containers = []

    def buildah(self, *args, check=True, timeout=300):
        proc = subprocess.run(self.base + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError("buildah %s: exit %d\n%s%s" % (
                " ".join(args), proc.returncode, proc.stdout, proc.stderr))
        return proc

    @staticmethod
    def image(archive):
        """The archive's reference, config and layers (scripts/oci_image.py)."""
        return oci_image.Image(archive)

    def container(self, archive):
        """A working container of the archive's image, as a runtime pulls it: its name."""
        name = self.buildah("from", "--quiet",
                            "oci-archive:" + os.path.abspath(archive)).stdout.strip()
        self.containers.append(name)
        return name

    def mount(self, container):
        return self.buildah("mount", container).stdout.strip()

    def run_argv(self, container, argv, user=None, volumes=(), env=(), read_only=False):
        """The command line of one run (see run and popen)."""
        options = ["run", "--isolation", "chroot"]
        if user:
            options += ["--user", user]
        for src, dst, mode in volumes:
            options += ["--volume", "%s:%s:%s" % (src, dst, mode)]
        for e in env:
            options += ["--env", e]
        inner = self.base + options + [container, "--"] + list(argv)
        setup = ""
        if read_only:
            setup = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && '
                     'mount -t tmpfs -o mode=0755,size=1m spawnpoint-run "$1/run" && ')
        root = self.mount(container) if read_only else "-"
        return ["setpriv", "--pdeathsig", "KILL", "--", "unshare", "--mount", "--propagation",
                "private", "--pid", "--fork", "--kill-child", "--mount-proc", "--", "sh", "-c",
                setup + 'shift; exec "$@"', "sh", root] + inner

    def prepare(self, container, prepare, user=None, volumes=(), env=()):
        """Runs `prepare` writable, so that buildah makes its mount points in the root."""
        proc = subprocess.run(self.run_argv(container, prepare, user, volumes, env),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError("preparing %s with %s: exit %d\n%s" % (
                container, prepare, proc.returncode, proc.stdout))

    def run(self, container, argv, user=None, volumes=(), env=(), read_only=False,
            prepare=None, timeout=300):
        """Runs argv in the container; a CompletedProcess (stdout and stderr together)."""
        if read_only:
            self.prepare(container, prepare, user, volumes, env)
        return subprocess.run(self.run_argv(container, argv, user, volumes, env, read_only),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)

    def popen(self, container, argv, log, user=None, volumes=(), env=(), read_only=False,
              prepare=None):
        """Starts argv in the container in the background, its output to the file `log`;
        stop it with stop()."""
        if read_only:
            self.prepare(container, prepare, user, volumes, env)
        with open(log, "w") as out:
            return subprocess.Popen(self.run_argv(container, argv, user, volumes, env,
                                                  read_only),
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    @staticmethod
    def stop(proc, timeout=30):
        """SIGTERM to the run's process group, SIGKILL after `timeout` s; its exit status.
        Its PID namespace dies with it."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def close(self):
        for name in self.containers:
            self.buildah("rm", name, check=False)
        self.buildah("rm", "--all", check=False)
        # vfs leaves plain directories; nothing is mounted once the containers are gone.
        subprocess.run(["rm", "-rf", "--one-file-system", self.dir])
