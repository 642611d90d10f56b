#!/usr/bin/env bash
# Checks that every commit since the readable history began has a subject of at most 72
# characters in the form `area: what changed` (merge commits aside). Reasons and figures
# go in the body. CI runs it (scripts/test.sh); a shallow or history-less clone is skipped.
#
#   scripts/check-history.sh [FIRST]   # FIRST: the first commit checked (default: the
#                                      # layout commit that began the readable history)
set -euo pipefail
cd "$(dirname "$0")/.."
# The first commit under the rule: "layout: every crate under crates/".
first=${1:-d365bc9}
if ! git rev-parse -q --verify "$first^{commit}" >/dev/null 2>&1; then
  echo "check-history: $first is not in this clone's history (shallow?); skipped"
  exit 0
fi
bad=0
while IFS=$'\t' read -r hash subject; do
  if [ "${#subject}" -gt 72 ]; then
    echo "check-history: $hash: subject of ${#subject} characters (at most 72): $subject"
    bad=1
  fi
  if ! [[ $subject =~ ^[a-z0-9][A-Za-z0-9_.,/+\ -]*:\ [^\ ] ]]; then
    echo "check-history: $hash: subject not in the form 'area: what changed': $subject"
    bad=1
  fi
done < <(git log --no-merges --format='%h%x09%s' "$first^..HEAD")
[ "$bad" = 0 ] && echo "check-history: $(git rev-list --no-merges --count "$first^..HEAD") commits since $first, every subject readable"
exit "$bad"
