package v1alpha1

// Code generation for this API group; `make generate` (go generate ./...)
// runs these in order, from this directory. Outputs:
//   - zz_generated.deepcopy.go here (controller-gen "object"),
//   - deploy/crds/controlplane.seine.io_<plural>.yaml (controller-gen "crd"),
//   - policy/client/clientset/versioned (client-gen), policy/client/listers
//     (lister-gen) and policy/client/informers (informer-gen), importable as
//     github.com/seine-net/seine/policy/client/....
// The tools run at pinned versions with `go run pkg@version`, which leaves
// go.mod alone: controller-tools v0.21.0 is the release built against
// Kubernetes v0.36 libraries; code-generator matches client-go v0.36.3.

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.21.0 object:headerFile=../../boilerplate.go.txt crd:crdVersions=v1 paths=. output:crd:artifacts:config=../../../../deploy/crds
//go:generate go run k8s.io/code-generator/cmd/client-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --input-base=github.com/seine-net/seine/policy/apis --input=controlplane/v1alpha1 --clientset-name=versioned --output-pkg=github.com/seine-net/seine/policy/client/clientset --output-dir=../../../client/clientset
//go:generate go run k8s.io/code-generator/cmd/lister-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --output-pkg=github.com/seine-net/seine/policy/client/listers --output-dir=../../../client/listers github.com/seine-net/seine/policy/apis/controlplane/v1alpha1
//go:generate go run k8s.io/code-generator/cmd/informer-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --versioned-clientset-package=github.com/seine-net/seine/policy/client/clientset/versioned --listers-package=github.com/seine-net/seine/policy/client/listers --single-directory --output-pkg=github.com/seine-net/seine/policy/client/informers --output-dir=../../../client/informers github.com/seine-net/seine/policy/apis/controlplane/v1alpha1
