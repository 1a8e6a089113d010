#!/usr/bin/env bash
# The main job on an embedded default. Filled in by the bench issue; for now: version.
set -euo pipefail
bin=${1:-bin/udskit}
"$bin" version
