// The pin of Kueue (issue 40), built by scripts/install-gang-tools.sh into .tools/bin/kueue:
// the module zip of sigs.k8s.io/kueue at the version required below, checked against go.sum
// (`go mod download` in this folder), is extracted to a scratch folder and ./cmd/kueue is
// built there from Kueue's own go.mod and go.sum, which pin every dependency. Its CRDs and
// webhook configurations are copied from the same zip into .tools/kueue/.
// Nothing imports the module, so this go.mod is not tidy on purpose: `go mod tidy` would drop
// the requirement. To move: change the version and put the two h1: lines of
// `go mod download -json sigs.k8s.io/kueue@NEW` (Sum, GoModSum) in go.sum.
module spawnpoint.dev/tools/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.19.2
