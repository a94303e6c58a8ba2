#!/bin/bash
# Runs a Python script of tools/accuracy inside the realref chroot
# (../shared/tools/realref: Debian sid's torch, transformers and
# compressed-tensors), as root:
#
#   tools/accuracy/chroot.sh SCRIPT.py [ARG...]
#
# Inside, the repository is bound read-only at /mnt/repo (SCRIPT is taken
# from /mnt/repo/tools/accuracy), WORK (CTQUANT_ACCURACY_WORK, default
# /tmp/ctquant-accuracy) read-write at /mnt/work, the committed models
# directory read-write at /mnt/models (training writes there), and the
# corpus (CTQUANT_ACCURACY_CORPUS, default /usr/lib/python3.11) read-only at
# /mnt/corpus. Paths given as arguments must use those names.
# REALREF_ROOT names the chroot (default /tmp/realref-sid). OMP threads:
# CTQUANT_ACCURACY_THREADS (default 1: these models are small, and OpenMP
# threads that spin on a busy machine made a training step 18x slower than
# one thread; run two jobs side by side instead).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT=${REALREF_ROOT:-/tmp/realref-sid}
WORK=${CTQUANT_ACCURACY_WORK:-/tmp/ctquant-accuracy}
CORPUS=${CTQUANT_ACCURACY_CORPUS:-/usr/lib/python3.11}
THREADS=${CTQUANT_ACCURACY_THREADS:-1}
die() { echo "accuracy/chroot.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: chroot.sh SCRIPT.py [ARG...]"
[ "$(id -u)" = 0 ] || die "must run as root (mount, chroot)"
[ -x "$ROOT/usr/bin/python3" ] && [ -d "$ROOT/opt/ct/src" ] ||
  die "no realref chroot at $ROOT: run ../shared/tools/realref/setup.sh first (docs/accuracy.md)"
mkdir -p "$WORK"
# Debian's torch calls the BLAS that libblas.so.3 names; the chroot of
# setup.sh has only the reference BLAS, about 6x slower than OpenBLAS here.
if ! [ -e "$ROOT/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3" ] &&
  ! [ -e "$ROOT/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3" ]; then
  echo "accuracy/chroot.sh: installing libopenblas0-pthread in $ROOT" >&2
  unshare --mount --propagation private -- bash -euc '
    mount -t proc proc "$1/proc"
    chroot "$1" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -q --no-install-recommends libopenblas0-pthread >/dev/null
  ' install "$ROOT"
fi
export RR_=$ROOT REPO_=$REPO WORK_=$WORK CORPUS_=$CORPUS THREADS_=$THREADS
exec unshare --mount --propagation private -- bash -euc '
  for d in repo work models corpus; do mkdir -p "$RR_/mnt/$d"; done
  mount -t proc proc "$RR_/proc"
  mount --bind -o ro "$REPO_" "$RR_/mnt/repo"
  mount --bind "$WORK_" "$RR_/mnt/work"
  mount --bind "$REPO_/tools/accuracy/models" "$RR_/mnt/models"
  if [ -d "$CORPUS_" ]; then mount --bind -o ro "$CORPUS_" "$RR_/mnt/corpus"; fi
  script=$1; shift
  exec chroot "$RR_" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PYTHONPATH=/mnt/repo/tools/accuracy:/opt/ct/src:/opt/llmc/src:/opt/stubs \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=$THREADS_ \
    OPENBLAS_NUM_THREADS=$THREADS_ RAYON_NUM_THREADS=1 PYTHONHASHSEED=0 \
    python3 -B "/mnt/repo/tools/accuracy/$script" "$@"
' chroot.sh "$@"
