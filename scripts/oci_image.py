#!/usr/bin/env python3
"""Reads an image archive in the OCI layout (what `buildah push ... oci-archive:FILE` and
Docker 25+'s `docker save` write): its name, configuration and layers. Standard library
only; scripts/images.sh prints sizes with it and tests/images reads images with it.

    oci_image.py sizes ARCHIVE...   each image's size and its layers' sizes
    oci_image.py json ARCHIVE       {ref, config, layers: [{digest, size, uncompressed,
                                    created_by}]} as JSON

Sizes are uncompressed (the unpacked layer tars, what `docker images` and a node's disk
count); an archive's compressed size is its file's size.
"""

import gzip
import json
import os
import re
import sys
import tarfile
import zlib

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")


class Image(object):
    def __init__(self, path):
        self.path = path
        with tarfile.open(path) as self._tar:
            self._read(path)

    def _read(self, path):
        index = self._json("index.json")
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise ValueError("%s: %d images in index.json, expected one" % (path, len(manifests)))
        top = manifests[0]
        annotations = top.get("annotations") or {}
        # buildah: org.opencontainers.image.ref.name is the whole reference; Docker's save:
        # io.containerd.image.name is, and ref.name is only the tag.
        self.ref = annotations.get("io.containerd.image.name") or \
            annotations.get("org.opencontainers.image.ref.name", "")
        manifest = self._json(self._blob(top["digest"]))
        while manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            amd64 = [m for m in manifest["manifests"]
                     if (m.get("platform") or {}).get("architecture", "amd64") == "amd64"]
            manifest = self._json(self._blob(amd64[0]["digest"]))
        self.config = self._json(self._blob(manifest["config"]["digest"]))
        history = [h for h in self.config.get("history", []) if not h.get("empty_layer")]
        self.layers = []
        for i, layer in enumerate(manifest["layers"]):
            self.layers.append({
                "digest": layer["digest"],
                "size": layer["size"],
                "uncompressed": self._uncompressed(self._blob(layer["digest"])),
                "created_by": history[i].get("created_by", "") if i < len(history) else "",
            })
        self.size = sum(layer["uncompressed"] for layer in self.layers)

    @staticmethod
    def _blob(digest):
        algorithm, _, hexdigest = digest.partition(":")
        return "blobs/%s/%s" % (algorithm, hexdigest)

    def _member(self, name):
        for candidate in (name, "./" + name):
            try:
                return self._tar.extractfile(candidate)
            except KeyError:
                continue
        raise ValueError("%s has no %s: not an OCI layout archive" % (self.path, name))

    def _json(self, name):
        return json.load(self._member(name))

    def _uncompressed(self, name):
        f = self._member(name)
        head = f.read(2)
        f.seek(0)
        if head == b"\x1f\x8b":
            f = gzip.GzipFile(fileobj=f)
        elif head == b"\x28\xb5":  # zstd: its frame header does not always say; count it
            raise ValueError("%s: zstd layers are not supported" % self.path)
        total = 0
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return total
            total += len(chunk)

    def as_dict(self):
        return {"ref": self.ref, "config": self.config, "layers": self.layers,
                "size": self.size, "archive_size": os.path.getsize(self.path)}


def mb(n):
    return "%.1f MB" % (n / 1e6)


def describe(created_by):
    """A layer's history line, shortened: buildah writes '/bin/sh -c #(nop) COPY dir:... in
    /opt/spawnpoint/ ', Docker 'COPY agent-bundle/ /opt/spawnpoint/ # buildkit'."""
    text = created_by.replace("/bin/sh -c #(nop) ", "").replace(" # buildkit", "").strip()
    text = re.sub(r"^(COPY|ADD) (?:dir|file|multi):[0-9a-f]+ in ", r"\1 to ", text)
    return text if len(text) <= 70 else text[:67] + "..."


def main(argv):
    if len(argv) < 3 or argv[1] not in ("sizes", "json"):
        sys.stderr.write(__doc__)
        return 2
    try:
        images = [Image(path) for path in argv[2:]]
    except (OSError, ValueError, KeyError, tarfile.TarError, zlib.error) as e:
        sys.stderr.write("oci_image: %s\n" % e)
        return 1
    if argv[1] == "json":
        json.dump(images[0].as_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for image in images:
        print("%s: %s (%d layers; archive %s, %s compressed)" % (
            image.ref, mb(image.size), len(image.layers), image.path,
            mb(os.path.getsize(image.path))))
        for i, layer in enumerate(image.layers, 1):
            print("  layer %d: %9s  %s" % (i, mb(layer["uncompressed"]),
                                          describe(layer["created_by"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
