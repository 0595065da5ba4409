"""Point the install at an image: ``python3 deploy/k8s/set_image.py KUSTOMIZATION REPO TAG``
sets ``newName`` and ``newTag`` of the ``migratory`` entry of ``images:`` in
KUSTOMIZATION (``make k8s-image`` runs it with the image ``make image`` built), as
``kustomize edit set image migratory=REPO:TAG`` would, keeping the file's comments.
Standard library only: run by the operator's python3, not the project's venv."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ENTRY = re.compile(r"^(  - name: migratory\n    newName: ).*\n(    newTag: ).*$", re.MULTILINE)
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # the OCI distribution spec's tag
REPO = re.compile(r"[a-z0-9]+(?:[._:/-][a-z0-9]+)*")


def set_image(text: str, repo: str, tag: str) -> str:
    """``text`` with the ``migratory`` image set to ``repo:tag``; ValueError if either is
    not an image name or the file has not exactly one such entry."""
    if not TAG.fullmatch(tag):
        raise ValueError(f"not an image tag: {tag!r}")
    if not REPO.fullmatch(repo):
        raise ValueError(f"not an image repository: {repo!r}")
    new, count = ENTRY.subn(lambda m: f"{m.group(1)}{repo}\n{m.group(2)}{tag}", text)
    if count != 1:
        raise ValueError(f"expected one `- name: migratory` entry with newName and newTag "
                         f"under images:, found {count}")
    return new


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, repo, tag = Path(argv[0]), argv[1], argv[2]
    try:
        path.write_text(set_image(path.read_text(), repo, tag))
    except ValueError as error:
        print(f"{path}: {error}", file=sys.stderr)
        return 1
    print(f"{path}: images: migratory -> {repo}:{tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
