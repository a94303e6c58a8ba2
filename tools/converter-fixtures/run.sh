#!/bin/bash
# Writes the converter golden cases (tests/golden/<case>/ for the cases of
# tests/golden/converter_cases.json, tests/golden/converter-refusals/) with the
# real compressed-tensors and llm-compressor in the realref chroot
# (../shared/tools/realref, built by its setup.sh). Modelled on realref's run.sh.
#
#   sudo tools/converter-fixtures/run.sh [CASE ... | refusals]
#
# With no argument every case and every refusal input is rewritten and
# converter_cases.json written anew; with names, only those (their entries are
# replaced in converter_cases.json). Inputs are built by layouts.py in the
# on-disk layout of AutoAWQ and ModelOpt; expected/ folders are what the
# library writes, with file modes normalised to 0644. hf_load results use
# realref's hf_load_main.py against dequantized references kept in a scratch
# folder that is removed at the end.
#
# Environment (on the sudo line): REALREF_ROOT (default /tmp/realref-sid),
# REALREF_DIR (default ../shared/tools/realref beside the repository or beside
# the main checkout of a git worktree).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT=${REALREF_ROOT:-/tmp/realref-sid}
die() { echo "converter-fixtures: $*" >&2; exit 1; }

if [ -z "${REALREF_DIR:-}" ]; then
  REALREF_DIR=$REPO/../shared/tools/realref
  if ! [ -d "$REALREF_DIR" ] && common=$(git -C "$REPO" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
    [ -d "$common/../../shared/tools/realref" ] && REALREF_DIR=$(cd "$common/../../shared/tools/realref" && pwd)
  fi
fi
[ "$(id -u)" = 0 ] || die "must run as root (mount, chroot)"
[ -f "$REALREF_DIR/hf_load_main.py" ] || die "no realref tools at $REALREF_DIR; set REALREF_DIR"
[ -x "$ROOT/usr/bin/python3" ] && [ -d "$ROOT/opt/ct/src" ] && [ -d "$ROOT/opt/llmc/src" ] \
  || die "no realref chroot at $ROOT; run $REALREF_DIR/setup.sh first"

GOLDEN=$REPO/tests/golden
SCRATCH=$(mktemp -d /tmp/converter-fixtures.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT

export RR_=$ROOT G_=$GOLDEN S_=$SCRATCH H_=$HERE RD_=$REALREF_DIR
unshare --mount --propagation private -- bash -euc '
  R=$RR_
  mkdir -p "$R/mnt/ctqfx/golden" "$R/mnt/ctqfx/scratch" "$R/opt/ctqfx" "$R/opt/realref"
  mount -t proc proc "$R/proc"
  mount --bind "$G_" "$R/mnt/ctqfx/golden"
  mount --bind "$S_" "$R/mnt/ctqfx/scratch"
  mount --bind -o ro "$H_" "$R/opt/ctqfx"
  mount --bind -o ro "$RD_" "$R/opt/realref"
  exec chroot "$R" /usr/bin/env -i \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONPATH=/opt/ct/src:/opt/llmc/src:/opt/stubs \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    python3 -B /opt/ctqfx/make_fixtures.py /mnt/ctqfx/golden /mnt/ctqfx/scratch "$@"
' converter-fixtures "$@"
