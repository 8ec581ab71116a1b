package main

import (
	"fmt"
	"regexp"
	"runtime"
	"strconv"

	"github.com/Masterminds/semver"
)

// defaultKubeVersion is what .Capabilities.KubeVersion reports without --kube-version.
const defaultKubeVersion = "v1.32.0"

// helmVersion is the Helm release whose `helm template` this program imitates.
const helmVersion = "v3.17.0"

// Capabilities is .Capabilities (Helm's chartutil.Capabilities).
type Capabilities struct {
	KubeVersion KubeVersion
	APIVersions VersionSet
	HelmVersion BuildInfo
}

// KubeVersion is .Capabilities.KubeVersion.
type KubeVersion struct {
	Version string // e.g. v1.32.0
	Major   string // e.g. 1
	Minor   string // e.g. 32
}

// String returns the version, e.g. v1.32.0.
func (kv KubeVersion) String() string { return kv.Version }

// GitVersion returns the version, e.g. v1.32.0 (deprecated in Helm, kept for charts).
func (kv KubeVersion) GitVersion() string { return kv.Version }

// BuildInfo is .Capabilities.HelmVersion.
type BuildInfo struct {
	Version      string `json:"version,omitempty"`
	GitCommit    string `json:"git_commit,omitempty"`
	GitTreeState string `json:"git_tree_state,omitempty"`
	GoVersion    string `json:"go_version,omitempty"`
}

// VersionSet is .Capabilities.APIVersions.
type VersionSet []string

// Has tells whether the set holds apiVersion ("group/version" or
// "group/version/Kind").
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// builtinAPIVersions approximates the group/versions that Helm's default capabilities
// hold (every API group of client-go's scheme, plus apiextensions), for Kubernetes 1.32.
var builtinAPIVersions = []string{
	"v1",
	"admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1alpha1", "admissionregistration.k8s.io/v1beta1",
	"apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1",
	"apps/v1", "apps/v1beta1", "apps/v1beta2",
	"authentication.k8s.io/v1", "authentication.k8s.io/v1alpha1", "authentication.k8s.io/v1beta1",
	"authorization.k8s.io/v1", "authorization.k8s.io/v1beta1",
	"autoscaling/v1", "autoscaling/v2", "autoscaling/v2beta1", "autoscaling/v2beta2",
	"batch/v1", "batch/v1beta1",
	"certificates.k8s.io/v1", "certificates.k8s.io/v1alpha1", "certificates.k8s.io/v1beta1",
	"coordination.k8s.io/v1", "coordination.k8s.io/v1alpha2", "coordination.k8s.io/v1beta1",
	"discovery.k8s.io/v1", "discovery.k8s.io/v1beta1",
	"events.k8s.io/v1", "events.k8s.io/v1beta1",
	"extensions/v1beta1",
	"flowcontrol.apiserver.k8s.io/v1", "flowcontrol.apiserver.k8s.io/v1beta1",
	"flowcontrol.apiserver.k8s.io/v1beta2", "flowcontrol.apiserver.k8s.io/v1beta3",
	"internal.apiserver.k8s.io/v1alpha1",
	"networking.k8s.io/v1", "networking.k8s.io/v1alpha1", "networking.k8s.io/v1beta1",
	"node.k8s.io/v1", "node.k8s.io/v1alpha1", "node.k8s.io/v1beta1",
	"policy/v1", "policy/v1beta1",
	"rbac.authorization.k8s.io/v1", "rbac.authorization.k8s.io/v1alpha1", "rbac.authorization.k8s.io/v1beta1",
	"resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta1",
	"scheduling.k8s.io/v1", "scheduling.k8s.io/v1alpha1", "scheduling.k8s.io/v1beta1",
	"storage.k8s.io/v1", "storage.k8s.io/v1alpha1", "storage.k8s.io/v1beta1",
	"storagemigration.k8s.io/v1alpha1",
}

// newCapabilities builds .Capabilities from --kube-version and --api-versions.
func newCapabilities(kubeVersion string, extraAPIs []string) (*Capabilities, error) {
	if kubeVersion == "" {
		kubeVersion = defaultKubeVersion
	}
	sv, err := semver.NewVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid kube version '%s': %s", kubeVersion, err)
	}
	apis := append(VersionSet{}, builtinAPIVersions...)
	apis = append(apis, extraAPIs...)
	return &Capabilities{
		KubeVersion: KubeVersion{
			Version: "v" + sv.String(),
			Major:   strconv.FormatUint(sv.Major(), 10),
			Minor:   strconv.FormatUint(sv.Minor(), 10),
		},
		APIVersions: apis,
		HelmVersion: BuildInfo{Version: helmVersion, GoVersion: runtime.Version()},
	}, nil
}

// kubeVersionCompatible tells whether version satisfies the chart's kubeVersion
// constraint (Helm's chartutil.IsCompatibleRange).
func kubeVersionCompatible(constraint, version string) bool {
	sv, err := semver.NewVersion(version)
	if err != nil {
		return false
	}
	c, err := semver.NewConstraint(constraint)
	if err != nil {
		return false
	}
	return c.Check(sv)
}

var releaseNameRegex = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// validateReleaseName checks a release name like Helm's chartutil.ValidateReleaseName.
func validateReleaseName(name string) error {
	if name == "" {
		return fmt.Errorf("no name provided")
	}
	if len(name) > 53 || !releaseNameRegex.MatchString(name) {
		return fmt.Errorf("invalid release name, must match regex %s and the length must not be longer than 53", releaseNameRegex.String())
	}
	return nil
}
