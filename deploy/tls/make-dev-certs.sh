#!/usr/bin/env bash
# Makes DEVELOPMENT TLS files for nexus and runner-agent with openssl: a CA, a server certificate
# for localhost and 127.0.0.1, and a runner client certificate for mutual TLS. The CA key sits
# beside them unencrypted, so never use these files in production.
#
#   deploy/tls/make-dev-certs.sh [OUT_DIR]          (default: deploy/tls/dev)
#
# Environment:
#   NEXUS_TLS_SERVER_NAMES  subjectAltName of the server certificate
#                           (default "DNS:localhost,IP:127.0.0.1"; add e.g. ",DNS:nexus.lan")
#   NEXUS_TLS_DAYS          validity in days (default 30)
#
# Writes OUT_DIR/{ca.pem, ca.key, server.pem, server.key, runner.pem, runner.key}: keys are EC
# P-256 in PKCS#8 PEM with mode 0600. It refuses to overwrite an existing OUT_DIR/ca.pem.
set -euo pipefail

out=${1:-"$(cd "$(dirname "$0")" && pwd)/dev"}
server_names=${NEXUS_TLS_SERVER_NAMES:-"DNS:localhost,IP:127.0.0.1"}
days=${NEXUS_TLS_DAYS:-30}

if ! command -v openssl > /dev/null 2>&1; then
  echo "make-dev-certs.sh needs openssl on PATH (e.g. apt-get install openssl)" >&2
  exit 1
fi
if [ -e "$out/ca.pem" ]; then
  echo "$out/ca.pem exists; remove $out or name another directory" >&2
  exit 1
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

new_key() {
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1")
}

serial() {
  echo "0x$(openssl rand -hex 16)"
}

# The CA.
new_key "$out/ca.key"
openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" -set_serial "$(serial)" \
  -subj "/CN=nexus development CA" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash" \
  -out "$out/ca.pem"

# A leaf certificate signed by the CA: leaf NAME COMMON_NAME EXTENSIONS.
leaf() {
  local name=$1 common_name=$2 extensions=$3
  new_key "$out/$name.key"
  openssl req -new -key "$out/$name.key" -subj "/CN=$common_name" -out "$work/$name.csr"
  printf '%s\n' "$extensions" > "$work/$name.ext"
  openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -set_serial "$(serial)" -days "$days" -sha256 -extfile "$work/$name.ext" -out "$out/$name.pem" 2> /dev/null
}

leaf server "nexus" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=$server_names"

leaf runner "runner-agent" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=DNS:runner-agent"

chmod 0644 "$out/ca.pem" "$out/server.pem" "$out/runner.pem"
openssl verify -CAfile "$out/ca.pem" "$out/server.pem" "$out/runner.pem" > /dev/null

cat <<DONE
wrote $out:
  ca.pem      the CA: nexus tls.client_ca, runner-agent --tls-ca, curl --cacert, grpcurl -cacert
  ca.key      the CA's key (signs more certificates; keep it off shared machines)
  server.pem  nexus tls.cert ($server_names)
  server.key  nexus tls.key
  runner.pem  runner-agent --tls-cert (mutual TLS)
  runner.key  runner-agent --tls-key
valid for $days days.
DONE
