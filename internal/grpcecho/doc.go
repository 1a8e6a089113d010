// Package grpcecho is a grpc-go echo service used as the baseline in udskit's
// benchmarks. It needs no protoc: the service descriptor is written by hand and
// the codec passes raw bytes ([]byte / *[]byte) through untouched, so the
// comparison measures gRPC's transport and framing, not protobuf marshalling.
//
// Server and client both raise grpc-go's message size limits (4 MiB by
// default for receiving) to MaxMessageSize, 64 MiB, so the benchmarks can
// compare payloads above 4 MiB.
package grpcecho
