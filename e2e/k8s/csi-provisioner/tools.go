//go:build tools

// The external-provisioner the cluster tests run; imported here so go.mod pins it.
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
