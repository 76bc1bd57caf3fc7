#!/bin/sh
# Install edgeflash as a service on this board (run as root, from this folder):
#   sudo ./install.sh SOURCE MODEL
# SOURCE: the edgeflash source folder or sdist copied from the workstation (built here, so the
#         kernels match this CPU); MODEL: a bundle directory or a .gguf file.
# Creates the user edgeflash, a venv in /opt/edgeflash/venv, the model in /var/lib/edgeflash/model,
# /etc/default/edgeflash (kept if present), and enables edgeflash.service.
set -eu
die() { echo "install.sh: $*" >&2; exit 2; }
[ "$#" -eq 2 ] || die "usage: sudo ./install.sh SOURCE MODEL"
source=$1
model=$2
[ "$(id -u)" -eq 0 ] || die "run as root (sudo): it creates a user and a systemd unit"
[ -e "$source" ] || die "$source: no such edgeflash source folder or archive"
[ -e "$model" ] || die "$model: no such model file or bundle directory"
here=$(cd "$(dirname "$0")" && pwd)

echo "== packages (compiler and CMake build the kernels for this CPU)"
apt-get install -y --no-install-recommends python3-venv python3-dev g++ cmake ninja-build

echo "== user and folders"
id edgeflash >/dev/null 2>&1 || useradd --system --home-dir /var/lib/edgeflash --shell /usr/sbin/nologin edgeflash
install -d -m 755 /opt/edgeflash/bin /var/lib/edgeflash

echo "== edgeflash into /opt/edgeflash/venv"
[ -x /opt/edgeflash/venv/bin/python ] || python3 -m venv /opt/edgeflash/venv
/opt/edgeflash/venv/bin/pip install --upgrade pip
/opt/edgeflash/venv/bin/pip install "$source"

echo "== model into /var/lib/edgeflash/model"
rm -rf /var/lib/edgeflash/model.new
cp -r "$model" /var/lib/edgeflash/model.new
rm -rf /var/lib/edgeflash/model
mv /var/lib/edgeflash/model.new /var/lib/edgeflash/model
chown -R root:edgeflash /var/lib/edgeflash
chmod -R g+rX /var/lib/edgeflash

echo "== service"
install -m 755 "$here/edgeflash-launch" "$here/edgeflash-health" /opt/edgeflash/bin/
install -m 644 "$here/README.md" /opt/edgeflash/README.md
[ -e /etc/default/edgeflash ] || install -m 644 "$here/edgeflash.env" /etc/default/edgeflash
install -m 644 "$here/edgeflash.service" /etc/systemd/system/edgeflash.service
systemctl daemon-reload
systemctl enable --now edgeflash
/opt/edgeflash/bin/edgeflash-health --generate
