#!/usr/bin/env python3
"""Structure checks of images/*.Dockerfile (no Docker engine runs here, so this checks
what the files say, not that `docker build` succeeds):

- both are multi-stage (at least two FROM) and every base image is Debian 12;
- the final stage runs as a numeric, non-root USER;
- every COPY from the build context names a path that exists in the repository and that
  .dockerignore does not exclude; .dockerignore excludes build trees and .git;
- every COPY --from=<stage> names a stage of the file, and a build-tree path that the
  stage's ninja command builds;
- the agent image's final stage holds the bundle at the operator's agent image directory
  (operator/reconciler/children.h), so /opt/spawnpoint/bin/spawnpoint-agent exists, and
  the operator image's final stage runs spawnpoint-operator;
- with --operator-binary (and dpkg on this machine): every library the operator loads
  comes from a package the final stage installs, one of their dependencies, or the slim
  base.

usage: dockerfile_lint.py --source-dir DIR [--operator-binary PATH]
"""
import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

DEBIAN_12 = re.compile(r"^(docker\.io/(library/)?)?debian:(12|bookworm)(-slim)?(@sha256:[0-9a-f]{64})?$")
NUMERIC_NON_ROOT = re.compile(r"^([1-9][0-9]*)(:[0-9]+)?$")
# Packages debian:12-slim already holds (priority required/important: dpkg, apt, libc).
SLIM_BASE = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)
    return ok


class Stage:
    def __init__(self, index, image, name):
        self.index, self.image, self.name = index, image, name
        self.instructions = []  # (keyword, rest)


def parse(path):
    """The stages of a Dockerfile: continuation lines joined, comments dropped."""
    lines, current = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not current and line.lstrip().startswith("#"):
                continue
            if line.endswith("\\"):
                current += line[:-1] + " "
                continue
            current += line
            if current.strip():
                lines.append(current.strip())
            current = ""
    if current.strip():
        lines.append(current.strip())
    stages = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(len(stages), words[0], name))
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


def copy_args(rest):
    """(from, sources, destination) of a COPY/ADD; JSON form or shell words."""
    rest = rest.strip()
    flags = {}
    words = shlex.split(rest) if not rest.startswith("[") else None
    if words is None:
        words = json.loads(rest)
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags.get("from"), words[:-1], words[-1]


def dockerignore(source_dir):
    path = os.path.join(source_dir, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [os.path.normpath(l.strip()) for l in f if l.strip() and not l.startswith("#")]


def ignored(rel, patterns):
    parts = os.path.normpath(rel).split(os.sep)
    for i in range(1, len(parts) + 1):
        prefix = os.path.join(*parts[:i])
        for p in patterns:
            if not p.startswith("!") and (fnmatch.fnmatchcase(prefix, p) or
                                          (p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:]))):
                return True
    return False


def stage_runs(stage):
    return " ".join(rest for kw, rest in stage.instructions if kw == "RUN")


def built_by(stage, workdir_build, src):
    """The ninja target that produces `src` (a path in the stage's build tree), if any."""
    rel = os.path.relpath(os.path.normpath(src), workdir_build)
    if rel.startswith(".."):
        return None
    if rel.startswith("bin/"):
        return rel[len("bin/"):]
    return rel.split("/")[0]  # e.g. agent-bundle: the target and its output directory


def lint(source_dir, name, final_checks):
    path = os.path.join(source_dir, "images", name)
    print(f"--- {os.path.relpath(path, source_dir)}")
    if not check(os.path.exists(path), f"{name} exists"):
        return None
    stages = parse(path)
    check(len(stages) >= 2, f"{name}: multi-stage ({len(stages)} FROM)")
    names = {s.name: s for s in stages if s.name}
    for s in stages:
        if s.image in names:
            continue
        check(bool(DEBIAN_12.match(s.image)), f"{name}: stage {s.index} base {s.image} is Debian 12")
    final = stages[-1]
    users = [rest for kw, rest in final.instructions if kw == "USER"]
    user = users[-1] if users else "(none: root)"
    check(bool(users) and bool(NUMERIC_NON_ROOT.match(user)),
          f"{name}: final stage runs as a numeric non-root USER ({user})")
    patterns = dockerignore(source_dir)
    for s in stages:
        workdir = "/"
        for kw, rest in s.instructions:
            if kw == "WORKDIR":
                workdir = os.path.join(workdir, rest)
            if kw not in ("COPY", "ADD"):
                continue
            frm, sources, _ = copy_args(rest)
            for src in sources:
                if frm is None:
                    exists = os.path.exists(os.path.join(source_dir, src))
                    check(exists and not ignored(src, patterns),
                          f"{name}: COPY {src} exists in the repository and is in the build context")
                    continue
                if not check(frm in names, f"{name}: COPY --from={frm} names a stage"):
                    continue
                origin = names[frm]
                origin_workdir = "/"
                for okw, orest in origin.instructions:
                    if okw == "WORKDIR":
                        origin_workdir = os.path.join(origin_workdir, orest)
                target = built_by(origin, os.path.join(origin_workdir, "build"), src)
                runs = stage_runs(origin)
                check(target is not None and re.search(r"\bninja\b.*\s" + re.escape(target) + r"(\s|$)", runs),
                      f"{name}: {src} is built in stage {frm} (ninja target {target})")
    return final


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--operator-binary")
    args = ap.parse_args()
    src = os.path.abspath(args.source_dir)

    patterns = dockerignore(src)
    print("--- .dockerignore")
    check(os.path.exists(os.path.join(src, ".dockerignore")), ".dockerignore exists at the repository root")
    for excluded in ("build", "build-asan", ".git"):
        check(ignored(excluded, patterns), f".dockerignore excludes {excluded}")
    for kept in ("agent", "scripts/install-deps.sh", "CMakeLists.txt"):
        check(not ignored(kept, patterns), f".dockerignore keeps {kept}")

    # The directory the operator's init container copies from (cp -R DIR/. /spawnpoint/).
    image_dir = "/opt/spawnpoint"
    with open(os.path.join(src, "operator/reconciler/children.h")) as f:
        m = re.search(r'agent_image_dir\s*=\s*"([^"]+)"', f.read())
    check(m is not None and m.group(1) == image_dir,
          f"the operator copies the agent from {image_dir} (operator/reconciler/children.h)")

    final = lint(src, "agent.Dockerfile", None)
    if final is not None:
        copies = [copy_args(rest) for kw, rest in final.instructions if kw == "COPY"]
        bundle = [c for c in copies if c[0] and os.path.normpath(c[2]) == image_dir and
                  any(os.path.basename(os.path.normpath(s)) == "agent-bundle" for s in c[1])]
        check(bool(bundle), f"agent.Dockerfile: the final stage copies the agent bundle to {image_dir}")
        # The bundle's entry point, as make-bundle.sh lays it out.
        with open(os.path.join(src, "agent/bundle/make-bundle.sh")) as f:
            layout = f.read()
        check("bin/spawnpoint-agent" in layout and bool(bundle),
              f"agent.Dockerfile: {image_dir}/bin/spawnpoint-agent is the bundle's launcher")
        entry = [rest for kw, rest in final.instructions if kw == "ENTRYPOINT"]
        check(not entry or f"{image_dir}/bin/spawnpoint-agent" in entry[-1],
              "agent.Dockerfile: ENTRYPOINT, if any, is the bundle's launcher")
        check(DEBIAN_12.match(final.image) is not None and "slim" in final.image,
              "agent.Dockerfile: final stage has cp (debian:12-slim) for the init container")

    final = lint(src, "operator.Dockerfile", None)
    if final is not None:
        entry = [rest for kw, rest in final.instructions if kw == "ENTRYPOINT"]
        check(bool(entry) and "spawnpoint-operator" in entry[-1],
              "operator.Dockerfile: ENTRYPOINT runs spawnpoint-operator")
        installed = set()
        for kw, rest in final.instructions:
            if kw == "RUN" and "apt-get install" in rest:
                for cmd in rest.split("&&"):
                    if "apt-get install" in cmd:
                        installed |= {w for w in cmd.split() if not w.startswith("-") and w not in ("apt-get", "install")}
        check(bool(installed), f"operator.Dockerfile: final stage installs {sorted(installed)}")
        have_binary = args.operator_binary and os.path.exists(args.operator_binary)
        if have_binary and shutil.which("dpkg") and shutil.which("apt-cache"):
            provided = set(SLIM_BASE) | installed
            for pkg in installed:
                deps = subprocess.run(["apt-cache", "depends", pkg], capture_output=True, text=True).stdout
                provided |= set(re.findall(r"^\s*(?:Pre)?Depends: (\S+)", deps, re.M))
            ldd = subprocess.run(["ldd", args.operator_binary], capture_output=True, text=True, check=True).stdout
            for lib in re.findall(r"=> (/\S+)", ldd):
                owner = subprocess.run(["dpkg", "-S", os.path.realpath(lib)], capture_output=True, text=True)
                if owner.returncode != 0:
                    owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
                pkg = owner.stdout.split(":")[0] if owner.returncode == 0 else "(no package)"
                check(pkg in provided, f"operator.Dockerfile: {os.path.basename(lib)} ({pkg}) is in the final stage")
        else:
            print("note: runtime libraries not cross-checked (no operator binary, dpkg or apt-cache)")

    print(f"dockerfile_lint: {len(failures)} failure(s); structure only, no image was built")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
