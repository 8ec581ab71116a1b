// Wires the operator together: Kubernetes client from the kubeconfig (or in-cluster), the
// controller, optional leader election on a Lease, the utilisation poller, and the probe
// and metrics endpoints. /healthz answers while the process serves; /readyz once the caches
// synced and, with leader election, once this replica leads or stands by behind a leader
// it has seen. Runs until SIGTERM/SIGINT (exit 0), or until leadership is lost (exit 1: a
// replica that stopped leading must stop acting, and its restart rejoins as a follower).
#pragma once

#include "operator/app/options.h"

namespace spawnpoint::op {

int RunOperator(const OperatorOptions& options);

}  // namespace spawnpoint::op
