#!/usr/bin/env bash
# Tags a release (docs/build.md#releases): an annotated tag v<version> at HEAD, <version> being
# cake/__init__.py's __version__, the version its wheels and VENDORED.json carry.
#
#   ci/tag_release.sh
#
# Refuses a tree with changes (the tag must name exactly what was built and tested), a version
# already tagged at another commit, and a HEAD whose version is tagged already is a no-op.
# Push the tag yourself (`git push origin v<version>`): hosts pin it as their pre-commit `rev`.
set -euo pipefail
if [[ $# -gt 0 ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
fi
cd "$(dirname "$0")/.."
version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' cake/__init__.py)
if [[ -z $version ]]; then
  echo "tag_release: no __version__ = \"...\" line in cake/__init__.py" >&2
  exit 1
fi
if [[ -n $(git status --porcelain --untracked-files=normal) ]]; then
  echo "tag_release: the tree has changes; commit or remove them first:" >&2
  git status --short >&2
  exit 1
fi
tag=v$version
head=$(git rev-parse HEAD)
if tagged=$(git rev-parse -q --verify "refs/tags/$tag^{commit}"); then
  if [[ $tagged == "$head" ]]; then
    echo "tag_release: $tag already tags HEAD ($head)"
    exit 0
  fi
  echo "tag_release: $tag already tags $tagged, not HEAD ($head): raise __version__ first" >&2
  exit 1
fi
git tag -a "$tag" -m "cake-train $version"
echo "tag_release: tagged $head as $tag; push it with: git push origin $tag"
