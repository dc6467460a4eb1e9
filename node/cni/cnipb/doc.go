// Package cnipb holds the gRPC protocol (package seine.cni.v1) spoken between
// the seine CNI plugin binary and the seine node daemon over a unix socket.
// The .pb.go files are generated from cni.proto; regenerate them with
// `go generate ./node/cni/cnipb` (needs protoc, protoc-gen-go v1.36.12 and
// protoc-gen-go-grpc on PATH).
package cnipb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative cni.proto
