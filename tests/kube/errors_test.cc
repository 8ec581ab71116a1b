#include "operator/kube/errors.h"

#include <gtest/gtest.h>

namespace spawnpoint::kube {
namespace {

std::string StatusBody(int code, const std::string& reason, const std::string& message,
                       const std::string& details = "") {
  std::string b = R"({"kind":"Status","apiVersion":"v1","status":"Failure","code":)" +
                  std::to_string(code) + R"(,"reason":")" + reason + R"(","message":")" + message +
                  "\"";
  if (!details.empty()) b += ",\"details\":" + details;
  return b + "}";
}

TEST(ApiErrorTest, MapsReasonsToCodes) {
  struct Case {
    int http;
    std::string reason;
    StatusCode code;
  } cases[] = {
      {404, "NotFound", StatusCode::kNotFound},
      {409, "AlreadyExists", StatusCode::kAlreadyExists},
      {409, "Conflict", StatusCode::kConflict},
      {410, "Expired", StatusCode::kGone},
      {410, "Gone", StatusCode::kGone},
      {422, "Invalid", StatusCode::kInvalidArgument},
      {400, "BadRequest", StatusCode::kInvalidArgument},
      {401, "Unauthorized", StatusCode::kUnauthenticated},
      {403, "Forbidden", StatusCode::kForbidden},
      {429, "TooManyRequests", StatusCode::kUnavailable},
      {500, "InternalError", StatusCode::kUnavailable},
      {503, "ServiceUnavailable", StatusCode::kUnavailable},
      {504, "Timeout", StatusCode::kUnavailable},
  };
  for (const auto& c : cases) {
    ApiError e = ParseApiError(c.http, StatusBody(c.http, c.reason, "m"), "");
    EXPECT_EQ(e.reason, c.reason);
    EXPECT_EQ(e.code(), c.code) << c.http << " " << c.reason;
  }
}

TEST(ApiErrorTest, InvalidCarriesCausesInTheMessage) {
  ApiError e = ParseApiError(
      422,
      StatusBody(
          422, "Invalid", "TrainingJob.spawnpoint.dev \\\"x\\\" is invalid",
          R"({"name":"x","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: 0: must be >= 1","field":"spec.nodes"},{"reason":"FieldValueRequired","message":"Required value","field":"spec.template"}]})"),
      "");
  ASSERT_EQ(e.causes.size(), 2u);
  EXPECT_EQ(e.causes[0].field, "spec.nodes");
  EXPECT_EQ(e.causes[1].reason, "FieldValueRequired");
  Status s = e.ToStatus("POST /apis/spawnpoint.dev/v1alpha1/namespaces/ml/trainingjobs");
  EXPECT_TRUE(IsInvalid(s));
  EXPECT_NE(s.message().find("spec.nodes: Invalid value: 0: must be >= 1 (FieldValueInvalid)"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("spec.template: Required value"), std::string::npos);
  EXPECT_EQ(s.message().rfind("POST /apis/", 0), 0u);
}

TEST(ApiErrorTest, RetryAfterFromHeaderOrDetails) {
  ApiError h = ParseApiError(429, StatusBody(429, "TooManyRequests", "slow down"), "7");
  ASSERT_TRUE(h.retry_after.has_value());
  EXPECT_EQ(h.retry_after->count(), 7);
  ApiError d = ParseApiError(
      429, StatusBody(429, "TooManyRequests", "slow down", R"({"retryAfterSeconds":3})"), "");
  ASSERT_TRUE(d.retry_after.has_value());
  EXPECT_EQ(d.retry_after->count(), 3);
  EXPECT_FALSE(ParseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT").has_value());
  EXPECT_FALSE(ParseRetryAfter("").has_value());
  EXPECT_EQ(ParseRetryAfter(" 12 ")->count(), 12);
}

TEST(ApiErrorTest, NonStatusBodyIsSummarised) {
  std::string html = "<html><body>502 Bad Gateway</body></html>" + std::string(5000, 'x');
  ApiError e = ParseApiError(502, html, "");
  EXPECT_EQ(e.reason, "InternalError");
  EXPECT_EQ(e.code(), StatusCode::kUnavailable);
  EXPECT_LT(e.message.size(), 300u);
  EXPECT_NE(e.message.find("502 Bad Gateway"), std::string::npos);
}

// Found by tests/fuzz (kube_list, #15): whatever answers (a proxy too) may send any JSON;
// a field of another type is as good as missing, never an exception out of the client.
TEST(ApiErrorTest, FieldsOfTheWrongTypeAreIgnored) {
  ApiError kind = ParseApiError(500, R"({"kind":7777,"message":"x"})", "");
  EXPECT_EQ(kind.reason, "InternalError");
  EXPECT_NE(kind.message.find("unexpected response body"), std::string::npos);
  ApiError causes =
      ParseApiError(422,
                    R"({"kind":"Status","reason":"Invalid","details":{"causes":[{"field":1,)"
                    R"("reason":["x"],"message":{"a":1}},{"field":"spec.x","reason":"R"}]}})",
                    "");
  ASSERT_EQ(causes.causes.size(), 2u);
  EXPECT_EQ(causes.causes[0].field, "");
  EXPECT_EQ(causes.causes[0].message, "");
  EXPECT_EQ(causes.causes[1].field, "spec.x");
}

// A retryAfterSeconds past 9 digits is capped as the header is (nanoseconds would overflow);
// a negative one is none.
TEST(ApiErrorTest, RetryAfterSecondsIsBounded) {
  ApiError big = ParseApiError(
      429, StatusBody(429, "TooManyRequests", "", R"({"retryAfterSeconds":18446744073709551615})"),
      "");
  ASSERT_TRUE(big.retry_after.has_value());
  EXPECT_EQ(big.retry_after->count(), 999999999);
  ApiError negative =
      ParseApiError(429, StatusBody(429, "TooManyRequests", "", R"({"retryAfterSeconds":-5})"), "");
  EXPECT_FALSE(negative.retry_after.has_value());
}

TEST(ApiErrorTest, WatchErrorEventObject) {
  ApiError e =
      ApiErrorFromStatusObject(StatusBody(410, "Expired", "too old resource version: 5 (100)"));
  EXPECT_EQ(e.http_status, 410);
  EXPECT_TRUE(IsGone(e.ToStatus("watch")));
  // Some servers send only the code.
  EXPECT_TRUE(IsGone(ApiErrorFromStatusObject(R"({"kind":"Status","code":410})").ToStatus("")));
}

}  // namespace
}  // namespace spawnpoint::kube
