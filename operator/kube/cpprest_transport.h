// The production HttpTransport on cpprestsdk's http_client (Boost.Asio + OpenSSL): TLS
// with the configured CA, client certificate and key (or no verification when
// insecure-skip-tls-verify is set), idle timeouts, and chunked watch bodies read line by
// line while they arrive. Thread-safe. TLS material is validated when the transport is
// made, so a bad key fails early with a message that names the field but not the content.
#pragma once

#include <memory>

#include "common/status.h"
#include "operator/kube/config.h"
#include "operator/kube/transport.h"

namespace spawnpoint::kube {

StatusOr<std::unique_ptr<HttpTransport>> NewCpprestTransport(const RestConfig& config);

}  // namespace spawnpoint::kube
