// TrainingJob objects for operator unit tests, as the API server would hand them over.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace spawnpoint::op::testing {

// A CPU job of `nodes` nodes x 1 rank with restartPolicy {mode, maxRestarts, backoffSeconds}:
// Recreate unless `mode` says otherwise (InPlace leaves restarts to the pods' agents).
inline nlohmann::json MakeJob(const std::string& name, int nodes = 2, int max_restarts = 3,
                              int backoff_seconds = 1, const std::string& mode = "Recreate") {
  return {{"apiVersion", "spawnpoint.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"nodes", nodes},
            {"gpusPerNode", 0},
            {"procsPerNode", 1},
            {"template",
             {{"spec",
               {{"containers", nlohmann::json::array({{{"name", "trainer"},
                                                       {"image", "trainer:1"},
                                                       {"command", {"python3", "train.py"}},
                                                       {"args", {"--epochs", "3"}}}})}}}}},
            {"restartPolicy",
             {{"mode", mode}, {"maxRestarts", max_restarts}, {"backoffSeconds", backoff_seconds}}},
            {"shmSize", "1Gi"}}}};
}

}  // namespace spawnpoint::op::testing
