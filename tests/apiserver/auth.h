// Bearer-token authentication for kube-test-server, and the request bodies of the
// authentication/authorization APIs it serves (TokenRequest, SelfSubjectAccessReview,
// SubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview, TokenReview).
//
// Tokens: the admin token of the generated kubeconfig (user "kubernetes-admin", groups
// system:masters and system:authenticated), and service-account tokens issued by the
// server (the TokenRequest API or the test-only endpoint). Issued tokens look like real
// ones (a JWT with the usual claims: sub, aud, exp, kubernetes.io.serviceaccount) but are
// only valid because the server remembers them; the caller also checks that the service
// account still exists with the same uid, as the real token authenticator does.
//
// kubectl's typed clients (create token, auth can-i, auth whoami) send Kubernetes
// protobuf bodies; DecodeReviewBody() reads the few fields these APIs need from either
// JSON or protobuf and returns the JSON form.
//
// Thread-safety: Tokens is internally synchronised; the free functions are pure.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "tests/apiserver/rbac.h"

namespace spawnpoint::kubetest {

// The bearer token of the kubeconfig --kubeconfig-out writes.
inline constexpr const char* kAdminToken = "kube-test-server-dummy-token";
inline constexpr const char* kAdminUserName = "kubernetes-admin";
// The API server's audience (and issuer), as on a default cluster.
inline constexpr const char* kApiAudience = "https://kubernetes.default.svc.cluster.local";

UserInfo AdminUser();

// The token of an "Authorization: Bearer <token>" header value; "" otherwise.
std::string BearerToken(const std::string& authorization);

class Tokens {
 public:
  struct ServiceAccountToken {
    std::string ns;
    std::string name;
    std::string uid;
    std::vector<std::string> audiences;
    std::optional<std::chrono::system_clock::time_point> expires;  // none: never expires
  };

  // Issues a token for a service account. `expiration` zero: a token that never expires
  // (like the legacy secret-based tokens). Empty `audiences` means the API server's.
  std::string Issue(const std::string& ns, const std::string& name, const std::string& uid,
                    std::chrono::seconds expiration, std::vector<std::string> audiences);

  enum class Kind { kUnknown, kAdmin, kServiceAccount };
  struct Lookup {
    Kind kind = Kind::kUnknown;
    ServiceAccountToken sa;
    std::string error;  // why a token is not accepted (unknown, expired, wrong audience)
  };
  // Identifies a token; does not check that the service account still exists.
  Lookup Find(const std::string& token, std::chrono::system_clock::time_point now) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, ServiceAccountToken> tokens_;
};

enum class ReviewKind {
  kTokenRequest,
  kSelfSubjectAccessReview,
  kSubjectAccessReview,
  kSelfSubjectRulesReview,
  kSelfSubjectReview,
  kTokenReview,
};

// The body as JSON: parsed JSON, or the known fields of a protobuf body
// ("application/vnd.kubernetes.protobuf": "k8s\0" + runtime.Unknown); an empty body is {}.
StatusOr<nlohmann::json> DecodeReviewBody(ReviewKind kind, const std::string& content_type,
                                          const std::string& body);

// The authorization attributes a (Self)SubjectAccessReview spec asks about (user left
// empty); an error when it has neither or both of resourceAttributes and
// nonResourceAttributes.
StatusOr<Attributes> AttributesFromReviewSpec(const nlohmann::json& spec);

}  // namespace spawnpoint::kubetest
