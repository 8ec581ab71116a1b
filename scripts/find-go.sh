# Sourced by scripts/install-tools.sh and scripts/install-gang-tools.sh: find_go NEED prints
# the Go toolchain to build with, $GO, then go on PATH, then /usr/local/go: the first at least
# as new as the go directive NEED (Debian 12's golang-go 1.19 is too old); status 1 if none is.
find_go() {
  local need=$1 candidate version
  for candidate in ${GO:-} "$(command -v go || true)" /usr/local/go/bin/go; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    version=$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null) || continue
    version=${version#go}
    if [ "$(printf '%s\n%s\n' "$need" "$version" | sort -V | head -n1)" = "$need" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
