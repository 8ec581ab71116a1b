// kubectl, built from its published Go module at the version go.mod pins (go.sum is the
// checksum pin). scripts/install-tools.sh builds it into .tools/bin/kubectl; this is
// kubectl's own main, nothing more.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	// The client auth plugins (exec, OIDC), as upstream kubectl registers them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
