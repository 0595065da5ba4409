#!/bin/sh
# The tag `make image` gives the server image, one per build: <version>-g<commit>
# (pyproject.toml's version, the commit's first 12 hex digits), and -dirty.<hash> after it
# when the files the image is made of (deploy/Dockerfile and its COPY sources) differ from
# that commit, <hash> naming their changes and untracked files. A rebuild of other code is
# never tagged as an earlier one: a node that pulled a tag runs what it pulled for as long
# as it has it (imagePullPolicy IfNotPresent, Kubernetes' default for a tag not `latest`).
# Needs a git checkout (or give make IMAGE_TAG=...).
set -eu
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
commit=$(git rev-parse --short=12 HEAD)
sources=$(awk '$1 == "COPY" && $2 !~ /^--/ { for (i = 2; i < NF; i++) print $i }' deploy/Dockerfile)
# shellcheck disable=SC2086  # $sources: one path per word
changed=$(git status --porcelain --untracked-files=all -- deploy/Dockerfile $sources)
if [ -z "$changed" ]; then
  echo "$version-g$commit"
  exit 0
fi
# shellcheck disable=SC2086
hash=$( {
  git diff --binary HEAD -- deploy/Dockerfile $sources
  git ls-files --others --exclude-standard -- deploy/Dockerfile $sources |
    while IFS= read -r path; do echo "$path $(git hash-object -- "$path")"; done
} | git hash-object --stdin | cut -c1-12)
echo "$version-g$commit-dirty.$hash"
