#!/usr/bin/env python3
"""Writes the SLSA v1 provenance predicate of an image build (build.sh) to stdout: what was built
(the subject is the index, attached by `cosign attest --type slsaprovenance1`), from what (the
commit, the Dockerfile, Cargo.lock and the base images, each by digest), how (the platforms,
SOURCE_DATE_EPOCH, the BuildKit and Rust versions) and when. BuildKit's own provenance is not used:
it is part of the index, and records the build's start and end, so no two builds would have one
digest (an attestation beside the index can carry times without changing it)."""

import argparse
import hashlib
import json
import sys


def sha256(path):
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--commit", required=True)
    parser.add_argument("--epoch", required=True, type=int)
    parser.add_argument("--repository", required=True, help="where the commit comes from")
    parser.add_argument("--dockerfile", required=True)
    parser.add_argument("--cargo-lock", required=True)
    parser.add_argument("--base", action="append", default=[], help="NAME=sha256:DIGEST, a base image as given to BuildKit")
    parser.add_argument("--platforms", required=True, help="the index's platforms, comma-separated")
    parser.add_argument("--buildkit", required=True)
    parser.add_argument("--rust", required=True)
    parser.add_argument("--started", required=True)
    parser.add_argument("--finished", required=True)
    args = parser.parse_args()

    dependencies = [
        {"uri": f"git+{args.repository}", "digest": {"gitCommit": args.commit}},
        {"name": "Dockerfile", "digest": {"sha256": sha256(args.dockerfile)}},
        {"name": "Cargo.lock", "digest": {"sha256": sha256(args.cargo_lock)}},
    ]
    for base in args.base:
        name, digest = base.split("=", 1)
        algorithm, value = digest.split(":", 1)
        dependencies.append({"uri": f"oci://{name}", "name": name, "digest": {algorithm: value}})
    predicate = {
        "buildDefinition": {
            "buildType": f"https://github.com/moby/buildkit/blob/{args.buildkit}/frontend/dockerfile/docs/reference.md",
            "externalParameters": {
                "source": {"uri": f"git+{args.repository}", "digest": {"gitCommit": args.commit}},
                "dockerfile": "Dockerfile",
                "platforms": args.platforms.split(","),
                "buildArgs": {"SOURCE_DATE_EPOCH": str(args.epoch)},
            },
            "internalParameters": {"buildkit": args.buildkit, "rust": args.rust, "frontend": "dockerfile.v0 (built in)"},
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": "make image (e2e/image/build.sh)", "version": {"buildkit": args.buildkit}},
            "metadata": {"startedOn": args.started, "finishedOn": args.finished},
        },
    }
    json.dump(predicate, sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
