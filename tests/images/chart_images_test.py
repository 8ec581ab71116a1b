"""The chart's defaults name the images `make images` tags (issue 20): `helm template` of
charts/spawnpoint with default values, and the operator Deployment's image (also the status
watchdog's) and its --agent-image must be exactly the names in build/images/operator.tar and
agent.tar.

    chart_images_test.py --source-dir REPO --archives BUILD/images [--helm .tools/bin/helm3]

Exit status: 0 passed, 1 failed, 77 skipped (not root: the archives are not built then).
"""

import argparse
import os
import subprocess
import sys

import yaml

import image_run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--archives", required=True)
    parser.add_argument("--helm")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("SKIP: the images (build/images) are built only as root (images_build)")
        return image_run.SKIP
    helm = args.helm or os.path.join(args.source_dir, ".tools", "bin", "helm3")
    proc = subprocess.run([helm, "template", "spawnpoint",
                           os.path.join(args.source_dir, "charts", "spawnpoint"),
                           "--namespace", "spawnpoint-system"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, HOME="/nonexistent"))
    if proc.returncode != 0:
        print("FAIL: helm template: exit %d\n%s" % (proc.returncode, proc.stderr))
        return 1
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                   for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Deployment"}
    container = deployments["operator"]["spec"]["template"]["spec"]["containers"][0]
    agent = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--agent-image=")]
    named = {"operator": container["image"], "agent": agent[0] if agent else None}
    failed = 0
    # The status watchdog is the operator's binary (`spawnpoint-operator status-watchdog`).
    watchdog = deployments.get("status-watchdog")
    watchdog_image = watchdog and watchdog["spec"]["template"]["spec"]["containers"][0]["image"]
    ok = watchdog_image == container["image"]
    print("%s: the status watchdog's image is %s, the operator's %s" % (
        "ok" if ok else "FAIL", watchdog_image, container["image"]))
    failed += not ok
    for name in ("operator", "agent"):
        archive = os.path.join(args.archives, name + ".tar")
        built = image_run.Store.image(archive).ref if os.path.exists(archive) else None
        ok = built is not None and named[name] == built
        print("%s: the chart names %s; make images tagged %s (%s)" % (
            "ok" if ok else "FAIL", named[name], built, archive))
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
