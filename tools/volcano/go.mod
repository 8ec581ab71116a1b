// The pin of the Volcano scheduler (issue 40), built by scripts/install-gang-tools.sh into
// .tools/bin/vc-scheduler: the module zip of volcano.sh/volcano at the version required
// below, checked against go.sum (`go mod download` in this folder), is extracted to a scratch
// folder and ./cmd/scheduler is built there from Volcano's own go.mod and go.sum (its ~36
// replace directives hold only there, so it cannot be built as a dependency). Its
// scheduling.volcano.sh CRDs are copied from the same zip into .tools/volcano/crds.
//
// volcano.sh/volcano replaces volcano.sh/apis with ./staging/src/volcano.sh/apis, a nested
// module that its zip leaves out, and the module proxy serves volcano.sh/apis only up to
// v1.14.0. The scratch folder's staging/src/volcano.sh/apis is therefore volcano.sh/apis at
// the version below, plus the one declaration the v1.15.1 scheduler needs that v1.14.0 lacks
// (scheduling/v1beta1.QueueAllocationGateKey = "scheduling.volcano.sh/queue-allocation-gate",
// as the v1.15.1 tag's staging declares it). Compared with the v1.15.1 tag's staging, what
// else differs is comments, one kubebuilder MaxLength marker (the CRDs come from the volcano
// zip, so they carry it) and client-go 0.35's watch-list wrapper in the generated informers.
//
// Nothing imports these modules, so this go.mod is not tidy on purpose. To move: change the
// versions and put the h1: lines of `go mod download -json MODULE@NEW` in go.sum.
module spawnpoint.dev/tools/volcano

go 1.25.0

require (
	volcano.sh/apis v1.14.0
	volcano.sh/volcano v1.15.1
)
