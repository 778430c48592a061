#!/usr/bin/env bash
# Regenerates the test-only certificates in this folder (valid 100 years).
# NOT for production: the private keys are public, in this repository.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
ca() { # name
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days $days \
    -subj "/CN=$1" -keyout "$1.key" -out "$1.pem" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() { # name ca san eku
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days $days \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca
ca rogue-ca
leaf master ca "DNS:localhost,IP:127.0.0.1" serverAuth
leaf agent ca "DNS:agent.damper.test" clientAuth
leaf rogue-agent rogue-ca "DNS:agent.damper.test" clientAuth
# Masters that ask each other for the ring's view present their own
# certificate as clients: it carries both usages.
ca ring-ca
leaf ring-master ring-ca "DNS:localhost,IP:127.0.0.1,DNS:master.damper.test" serverAuth,clientAuth
rm -f ./*.srl ca.key rogue-ca.key ring-ca.key
