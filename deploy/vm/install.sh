#!/usr/bin/env bash
# Install scheduled-events-bridge on an Azure VM as the hardened systemd service seb.service.
#
#   sudo deploy/vm/install.sh                      # from a checkout (uses deploy/systemd/*)
#   sudo SEB_PACKAGE='scheduled-events-bridge[all]==0.1.0' deploy/vm/install.sh
#
# Scale sets: deploy/vm/cloud-init.yaml runs the same steps from custom data.
# Settings (environment of this script):
#   SEB_PACKAGE    what pip installs (a requirement, a wheel or a path)   [scheduled-events-bridge[all]]
#   SEB_PREFIX     the virtualenv                                         [/opt/seb]
#   SEB_ENV_FILE   the service's settings; never overwritten if present  [/etc/default/seb]
#   SEB_UNIT_DIR   where the unit goes                                   [/etc/systemd/system]
#   SEB_PIP_ARGS   extra pip arguments (e.g. an index or --no-deps)      []
#   SEB_NO_START   1: install only, do not enable or start the service
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
package=${SEB_PACKAGE:-scheduled-events-bridge[all]}
prefix=${SEB_PREFIX:-/opt/seb}
env_file=${SEB_ENV_FILE:-/etc/default/seb}
unit_dir=${SEB_UNIT_DIR:-/etc/systemd/system}
unit_src=$here/../systemd/seb.service
env_src=$here/../systemd/seb.env.example

python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install.sh: needs Python 3.11 or newer as python3 (Debian 12 / Ubuntu 24.04 have it)" >&2
  exit 1
fi
if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c 'import ensurepip' 2>/dev/null; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  else
    echo "install.sh: python3 has no venv module; install it (python3-venv)" >&2
    exit 1
  fi
fi
[ -f "$unit_src" ] || { echo "install.sh: no unit file at $unit_src" >&2; exit 1; }

echo "== virtualenv $prefix"
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
# shellcheck disable=SC2086  # SEB_PIP_ARGS is a list of words on purpose
"$prefix/bin/python" -m pip install -q --disable-pip-version-check ${SEB_PIP_ARGS:-} "$package"

echo "== unit $unit_dir/seb.service"
mkdir -p "$unit_dir"
sed "s#/opt/seb/bin/seb#$prefix/bin/seb#" "$unit_src" >"$unit_dir/seb.service"
chmod 0644 "$unit_dir/seb.service"

if [ ! -e "$env_file" ]; then
  echo "== settings $env_file (edit it, then: systemctl restart seb)"
  mkdir -p "$(dirname "$env_file")"
  (umask 077 && cp "$env_src" "$env_file")
else
  echo "== settings $env_file kept as it is"
fi

if [ "${SEB_NO_START:-0}" != 1 ] && command -v systemctl >/dev/null; then
  systemctl daemon-reload
  systemctl enable --now seb.service
  systemctl --no-pager --lines=0 status seb.service || true
fi
echo "installed $prefix/bin/seb; check the settings with: (set -a; . $env_file; $prefix/bin/seb check)"
