package v1alpha1

// Code generation for this API group, as for controlplane.seine.io (see
// policy/apis/controlplane/v1alpha1/generate.go, same pinned tools);
// `make generate` runs these from this directory. Outputs:
//   - zz_generated.deepcopy.go here (controller-gen "object"),
//   - deploy/crds/ops.seine.io_<plural>.yaml (controller-gen "crd"),
//   - node/client/clientset/versioned (client-gen), node/client/listers
//     (lister-gen) and node/client/informers (informer-gen).

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.21.0 object:headerFile=../../boilerplate.go.txt crd:crdVersions=v1 paths=. output:crd:artifacts:config=../../../../deploy/crds
//go:generate go run k8s.io/code-generator/cmd/client-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --input-base=github.com/seine-net/seine/node/apis --input=ops/v1alpha1 --clientset-name=versioned --output-pkg=github.com/seine-net/seine/node/client/clientset --output-dir=../../../client/clientset
//go:generate go run k8s.io/code-generator/cmd/lister-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --output-pkg=github.com/seine-net/seine/node/client/listers --output-dir=../../../client/listers github.com/seine-net/seine/node/apis/ops/v1alpha1
//go:generate go run k8s.io/code-generator/cmd/informer-gen@v0.36.3 --go-header-file=../../boilerplate.go.txt --versioned-clientset-package=github.com/seine-net/seine/node/client/clientset/versioned --listers-package=github.com/seine-net/seine/node/client/listers --single-directory --output-pkg=github.com/seine-net/seine/node/client/informers --output-dir=../../../client/informers github.com/seine-net/seine/node/apis/ops/v1alpha1
