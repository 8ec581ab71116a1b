#include "tests/apiserver/schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace spawnpoint::kubetest {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "spec": {
      "type": "object",
      "required": ["nodes"],
      "properties": {
        "nodes": {"type": "integer", "minimum": 1, "maximum": 8},
        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true},
        "backend": {"type": "string", "enum": ["auto", "nccl", "gloo"], "default": "auto"},
        "image": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5, "minLength": 2},
        "workers": {"x-kubernetes-int-or-string": true, "default": "auto"},
        "deadline": {"type": "integer", "nullable": true},
        "retries": {"type": "integer", "default": 3},
        "codes": {"type": "array", "maxItems": 2, "minItems": 1, "items": {"type": "integer"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
        "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                     "properties": {"known": {"type": "string"}}},
        "loader": {"type": "object", "default": {},
                   "properties": {"persistent": {"type": "boolean", "default": true},
                                  "seed": {"type": "integer"}}},
        "items": {"type": "array",
                  "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}}}}
      }
    },
    "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
  }
})");

std::vector<std::string> Messages(const json& obj) {
  std::vector<std::string> out;
  for (const auto& e : ValidateAgainstSchema(obj, kSchema)) out.push_back(e.ToString());
  return out;
}

json Spec(json spec) { return {{"apiVersion", "x/v1"}, {"kind", "X"}, {"spec", spec}}; }

TEST(SchemaTest, ValidObjectHasNoErrors) {
  EXPECT_TRUE(Messages(Spec({{"nodes", 2}, {"backend", "gloo"}, {"image", "abc"}})).empty());
}

TEST(SchemaTest, MinimumUsesTheRealServersWording) {
  auto errs = ValidateAgainstSchema(Spec({{"nodes", 0}}), kSchema);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].field, "spec.nodes");
  EXPECT_EQ(errs[0].Reason(), "FieldValueInvalid");
  EXPECT_EQ(errs[0].Body(),
            "Invalid value: 0: spec.nodes in body should be greater than or equal to 1");
  EXPECT_THAT(Messages(Spec({{"nodes", 9}})),
              ElementsAre("spec.nodes: Invalid value: 9: spec.nodes in body should be less than "
                          "or equal to 8"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"ratio", 0}})),
              ElementsAre("spec.ratio: Invalid value: 0: spec.ratio in body should be greater "
                          "than 0"));
}

TEST(SchemaTest, RequiredEnumPatternAndLengths) {
  EXPECT_THAT(Messages(Spec(json::object())), ElementsAre("spec.nodes: Required value"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"backend", "mpi"}})),
              ElementsAre("spec.backend: Unsupported value: \"mpi\": supported values: "
                          "\"auto\", \"nccl\", \"gloo\""));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"image", "ab1"}})),
              ElementsAre("spec.image: Invalid value: \"ab1\": spec.image in body should match "
                          "'^[a-z]+$'"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"image", "abcdef"}})),
              ElementsAre("spec.image: Too long: may not be longer than 5"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"image", "a"}})),
              ElementsAre("spec.image: Invalid value: \"a\": spec.image in body should be at "
                          "least 2 chars long"));
}

TEST(SchemaTest, TypesIntOrStringAndNullable) {
  EXPECT_THAT(Messages(Spec({{"nodes", "two"}})),
              ElementsAre("spec.nodes: Invalid value: \"string\": spec.nodes in body must be of "
                          "type integer: \"string\""));
  EXPECT_EQ(ValidateAgainstSchema(Spec({{"nodes", "two"}}), kSchema)[0].Reason(),
            "FieldValueTypeInvalid");
  EXPECT_TRUE(Messages(Spec({{"nodes", 1}, {"workers", 4}})).empty());
  EXPECT_TRUE(Messages(Spec({{"nodes", 1}, {"workers", "auto"}})).empty());
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"workers", true}})),
              ElementsAre("spec.workers: Invalid value: \"boolean\": spec.workers in body must "
                          "be of type integer,string: \"boolean\""));
  EXPECT_TRUE(Messages(Spec({{"nodes", 1}, {"deadline", nullptr}})).empty());
  EXPECT_FALSE(Messages(Spec({{"nodes", 1}, {"retries", nullptr}})).empty());
  // An integral float is an integer, as JSON numbers are untyped.
  EXPECT_TRUE(Messages(Spec({{"nodes", 2.0}})).empty());
}

TEST(SchemaTest, ArraysMapsAndNestedItems) {
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"codes", {1, 2, 3}}})),
              ElementsAre("spec.codes: Too many: 3: must have at most 2 items"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"codes", json::array()}})),
              ElementsAre("spec.codes: Invalid value: 0: spec.codes in body should have at "
                          "least 1 items"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"codes", {1, "x"}}})),
              ElementsAre("spec.codes[1]: Invalid value: \"string\": spec.codes[1] in body must "
                          "be of type integer: \"string\""));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"labels", {{"a", "long"}}}})),
              ElementsAre("spec.labels.a: Too long: may not be longer than 3"));
  EXPECT_THAT(Messages(Spec({{"nodes", 1}, {"items", {json::object()}}})),
              ElementsAre("spec.items[0].name: Required value"));
}

TEST(SchemaTest, PruningRecordsUnknownFieldPaths) {
  json obj = Spec({{"nodes", 1},
                   {"foo", 1},
                   {"template", {{"anything", {{"goes", 1}}}}},
                   {"labels", {{"free", "x"}}},
                   {"items", {{{"name", "a"}, {"extra", true}}}}});
  obj["metadata"] = {{"name", "x"}, {"bogus", 1}};
  obj["topLevel"] = 1;
  std::vector<std::string> unknown;
  PruneUnknownFields(obj, kSchema, &unknown);
  EXPECT_THAT(unknown, UnorderedElementsAre("spec.foo", "spec.items[0].extra", "metadata.bogus",
                                            "topLevel"));
  EXPECT_FALSE(obj["spec"].contains("foo"));
  EXPECT_EQ(obj["spec"]["template"]["anything"]["goes"], 1);
  EXPECT_EQ(obj["spec"]["labels"]["free"], "x");
  EXPECT_EQ(obj["apiVersion"], "x/v1");
  EXPECT_EQ(obj["metadata"], json({{"name", "x"}}));
}

TEST(SchemaTest, DefaultsFillMissingFieldsRecursively) {
  json obj = Spec({{"nodes", 1}, {"retries", nullptr}, {"deadline", nullptr}});
  ApplyDefaults(obj, kSchema);
  EXPECT_EQ(obj["spec"]["backend"], "auto");
  EXPECT_EQ(obj["spec"]["workers"], "auto");
  EXPECT_EQ(obj["spec"]["retries"], 3) << "a null non-nullable field takes its default";
  EXPECT_TRUE(obj["spec"]["deadline"].is_null()) << "nullable fields keep null";
  EXPECT_EQ(obj["spec"]["loader"], json({{"persistent", true}}))
      << "a defaulted object gets its own defaults";
  json explicit_values =
      Spec({{"nodes", 1}, {"backend", "nccl"}, {"loader", {{"persistent", false}}}});
  ApplyDefaults(explicit_values, kSchema);
  EXPECT_EQ(explicit_values["spec"]["backend"], "nccl");
  EXPECT_EQ(explicit_values["spec"]["loader"]["persistent"], false);
}

TEST(SchemaTest, InvalidErrorMessageMatchesKubectlExpectations) {
  auto e = InvalidError("spawnpoint.dev", "TrainingJob", "x",
                        ValidateAgainstSchema(Spec({{"nodes", 0}}), kSchema));
  EXPECT_EQ(e.code(), 422);
  EXPECT_EQ(e.message(),
            "TrainingJob.spawnpoint.dev \"x\" is invalid: spec.nodes: Invalid value: 0: "
            "spec.nodes in body should be greater than or equal to 1");
  json status = e.ToStatus();
  EXPECT_EQ(status["reason"], "Invalid");
  EXPECT_EQ(status["details"]["kind"], "TrainingJob");
  EXPECT_EQ(status["details"]["group"], "spawnpoint.dev");
  EXPECT_EQ(status["details"]["causes"][0]["field"], "spec.nodes");
  EXPECT_EQ(status["details"]["causes"][0]["reason"], "FieldValueInvalid");
  auto two = InvalidError("g", "K", "n",
                          ValidateAgainstSchema(Spec({{"nodes", 0}, {"backend", "x"}}), kSchema));
  EXPECT_EQ(two.message().find("K.g \"n\" is invalid: ["), 0u) << two.message();
}

}  // namespace
}  // namespace spawnpoint::kubetest
